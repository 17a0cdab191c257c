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

Writes ``<out>/startup-<files>.json``.
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


def main() -> None:
    """Write the files once, time the cold and warm starts, print and keep the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--memory-limit", default="4GB", help="the local cluster's (two workers)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench-out/startup")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    pattern = write_files(args.out, args.files, args.rows)
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
