"""Start-up at many files, with the scan reused: from ``DaskSequence(...)`` to its first batch.

    .venv/bin/python benchmarks/startup.py --files 20000 --rows 1000
    .venv/bin/python benchmarks/startup.py --files 200000 --rows 20 --profile

The seed's layout (``--files`` CSV files of ``--rows`` rows, 1,000 to a folder), written once
under ``--out``. A LocalCluster of two workers within ``--memory-limit`` is started first and not timed (the
issue's target is "beyond the cluster's start"). Then, each with a parse cache under ``--out``:

- ``cold``: the first ``DaskSequence`` of the data (listing, scan, buckets' build) and batch 0;
- ``warm`` × ``--rounds``: a new ``DaskSequence`` of the same, unchanged files (the scan's
  manifest reused, the buckets found complete) until its first batch: what a rerun, a resume
  or a second trainer pays before training. Medians and every round, and with ``--profile`` the
  functions of one more warm round by cumulative time (cProfile, the trainer process).

With ``--cli``, the command a user types instead, ``daskfeed train`` (``--rounds`` times after
one run that makes its own cache, each into a new output directory, so that the scan is reused
from the parse cache): seconds from the process's start to the cluster's ``dashboard:`` line and
to the ``default model:`` line (the model built); the run is stopped there. "Beyond the
cluster's start" is the second less the first.

daskfeed's modules are byte-compiled first, as an install from a wheel has them.

Writes ``<out>/startup-<files>.json`` (``startup-cli-<files>.json`` with ``--cli``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def write_files(root: str, files: int, rows: int) -> str:
    """``files`` CSV files of ``rows`` rows each (4 templates), 1,000 to a folder; their glob."""
    import numpy as np

    d = os.path.join(root, f"files_{files}x{rows}")
    done = os.path.join(d, ".complete")
    if not os.path.exists(done):
        rng = np.random.default_rng(1)
        templates = []
        for _ in range(4):
            cleared = rng.integers(0, 2, rows)
            level = rng.integers(1, 60, rows) + 20 * cleared
            lines = [f"{i},{c},{v}" for i, (c, v) in enumerate(zip(cleared, level, strict=True))]
            templates.append("\n".join(lines).encode())
        for f in range(files):
            sub = os.path.join(d, f"day{f // 1000:04d}")
            os.makedirs(sub, exist_ok=True)
            prefix = f"{f},".encode()
            body = prefix + templates[f % 4].replace(b"\n", b"\n" + prefix) + b"\n"
            with open(os.path.join(sub, f"split_{f:07d}.csv"), "wb") as out:
                out.write(b"file,row,cleared,level\n" + body)
        open(done, "w").close()
    return os.path.join(d, "**", "*.csv")


def first_batch(pattern: str, client, cache: str) -> tuple[float, float]:
    """Seconds to make the sequence, and to its first batch (sequence closed after)."""
    import daskfeed

    t0 = time.perf_counter()
    seq = daskfeed.DaskSequence(pattern, label="cleared", client=client, cache=cache,
                                batch_size=1024, seed=0)
    t1 = time.perf_counter()
    seq[0]
    t2 = time.perf_counter()
    seq.close()
    return t1 - t0, t2 - t0


def cli_start(pattern: str, cache: str, out: str, memory_limit: str) -> dict[str, float]:
    """One ``daskfeed train`` until its model is built: seconds to the cluster's line and the model's."""
    import shutil
    import signal
    import subprocess
    import sys

    shutil.rmtree(out, ignore_errors=True)
    exe = os.path.join(os.path.dirname(sys.executable), "daskfeed")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    marks: dict[str, float] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen([exe, "train", pattern, "--label", "cleared", "--epochs", "1",
                             "--memory-limit", memory_limit, "--cache", cache, "--verbose", "2",
                             "--dashboard-address", "127.0.0.1:0", "--output", out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    assert proc.stdout is not None
    said = []
    for line in proc.stdout:
        said.append(line)
        if line.startswith("dashboard:"):
            marks["cluster_s"] = round(time.perf_counter() - t0, 2)
        if line.startswith("default model:"):
            marks["model_s"] = round(time.perf_counter() - t0, 2)
            os.killpg(proc.pid, signal.SIGTERM)
            break
    proc.wait()
    if "model_s" not in marks or "cluster_s" not in marks:
        raise SystemExit("daskfeed train ended before its model was built:\n" + "".join(said[-20:]))
    marks["beyond_cluster_s"] = round(marks["model_s"] - marks["cluster_s"], 2)
    return marks


def main_cli(args: argparse.Namespace, pattern: str) -> None:
    """Time ``daskfeed train`` to its model, the scan reused (after one run that makes the cache)."""
    cache = os.path.join(args.out, f"cli-cache-{args.files}x{args.rows}")
    out = os.path.join(args.out, "cli-run")
    first = cli_start(pattern, cache, out, args.memory_limit)
    rounds = [cli_start(pattern, cache, out, args.memory_limit) for _ in range(args.rounds)]
    record = {"files": args.files, "rows_per_file": args.rows, "memory_limit": args.memory_limit,
              "first_run": first, "rounds": rounds,
              "median_model_s": statistics.median(r["model_s"] for r in rounds),
              "median_beyond_cluster_s": statistics.median(r["beyond_cluster_s"] for r in rounds)}
    with open(os.path.join(args.out, f"startup-cli-{args.files}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record))


def main() -> None:
    """Write the files once, time the cold and warm starts, print and keep the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--memory-limit", default="4GB", help="the local cluster's (two workers)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench-out/startup")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cli", action="store_true", help="time `daskfeed train` to its model")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    pattern = write_files(args.out, args.files, args.rows)
    from common import byte_compile

    byte_compile()  # (an uncompiled checkout compiled every module at every start: ~0.7 s)
    if args.cli:
        main_cli(args, pattern)
        return
    cache = os.path.join(args.out, f"cache-{args.files}x{args.rows}")

    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    from dask.utils import parse_bytes

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                           memory_limit=parse_bytes(args.memory_limit) // 2)
    client = Client(cluster)
    started = time.perf_counter() - t0
    cold = first_batch(pattern, client, cache)
    warm = [first_batch(pattern, client, cache) for _ in range(args.rounds)]
    record = {"files": args.files, "rows_per_file": args.rows, "cluster_start_s": round(started, 2),
              "cold_s": [round(x, 2) for x in cold],
              "warm_sequence_s": [round(w[0], 2) for w in warm],
              "warm_first_batch_s": [round(w[1], 2) for w in warm],
              "warm_median_s": round(statistics.median(w[1] for w in warm), 2)}
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        first_batch(pattern, client, cache)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
        record["profile"] = text.getvalue()
    client.close()
    cluster.close()
    with open(os.path.join(args.out, f"startup-{args.files}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: v for k, v in record.items() if k != "profile"}))
    if args.profile:
        print(record["profile"])


if __name__ == "__main__":
    main()
