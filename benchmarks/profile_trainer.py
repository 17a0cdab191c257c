"""Where the trainer's CPU goes during steady epochs: py-spy on ``benchmarks/epoch_cpu.py``.

    .venv/bin/pip install py-spy
    .venv/bin/python benchmarks/profile_trainer.py "bench-out/data-2000000/log_quest/**/*.csv"

Starts ``epoch_cpu.py`` (the bench's model fit from a ``DaskSequence`` on a LocalCluster), and
when its epoch 1 ends attaches ``py-spy record`` to the trainer process only (not the Dask
workers), every thread, idle samples left out, until the last epoch ends. Then adds the samples
up: per thread, per function by self samples (the leaf frame) and by inclusive samples (any
frame of the stack), as CPU milliseconds per batch. ``--gil`` samples only the thread holding
the GIL. Writes ``<out>/<name>.json``, ``.txt`` and the raw collapsed stacks.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _frame_name(frame: str) -> str:
    """``fn (path/to/module.py:123)`` → ``fn (module.py)``: one entry per function."""
    m = re.match(r"(.*) \((.*?):\d+\)$", frame.strip())
    if not m:
        return frame.strip()
    name, path = m.groups()
    parts = path.split("/")
    short = "/".join(parts[-2:]) if parts[-1] == "__init__.py" else parts[-1]
    for pkg in ("daskfeed", "keras", "tensorflow", "distributed", "tornado", "numpy", "pyarrow", "dask"):
        if f"/{pkg}/" in f"/{path}":
            short = f"{pkg}:{short}"
            break
    return f"{name} ({short})"


def summarize(raw: str, rate: int, batches: int, top: int = 25) -> dict[str, Any]:
    """Aggregate py-spy's collapsed stacks (``--threads``: the thread is the root frame).

    Parameters
    ----------
    raw
        The ``--format raw`` output: ``frame;frame;... count`` lines, root first.
    rate
        Samples per second.
    batches
        Batches trained while sampling (for the per-batch figures).
    top
        Entries kept per list.

    Returns
    -------
    dict
        ``samples``, ``threads``, ``self`` and ``inclusive`` (function, samples, share,
        CPU ms per batch).
    """
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread, frames = frames[0], frames[1:]
        total += n
        threads[re.sub(r"\s*\(idle\)", "", thread)] += n
        names = [_frame_name(f) for f in frames]
        if names:
            own[names[-1]] += n
            for name in set(names):
                incl[name] += n
        else:
            own["(no Python frame)"] += n

    def rows(c: collections.Counter[str]) -> list[dict[str, Any]]:
        return [{"function": k, "samples": v, "share": round(v / total, 4),
                 "cpu_ms_per_batch": round(1e3 * v / rate / max(batches, 1), 3)}
                for k, v in c.most_common(top)]

    return {"samples": total, "rate": rate, "batches": batches,
            "cpu_ms_per_batch_total": round(1e3 * total / rate / max(batches, 1), 3),
            "threads": rows(threads), "self": rows(own), "inclusive": rows(incl)}


def _line(r: dict[str, Any]) -> str:
    return f"  {r['share']:>6.1%} {r['cpu_ms_per_batch']:>7.3f} ms/batch  {r['function']}"


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="benchmarks/profile_trainer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--nworkers", type=int, default=None)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--gil", action="store_true", help="only the thread holding the GIL")
    p.add_argument("--in-memory", action="store_true", help="profile the in-memory fit instead")
    p.add_argument("--handoff", choices=("pydataset", "tf-data"), default="pydataset",
                   help="daskfeed's hand-off (epoch_cpu.py --handoff)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=None)
    a = p.parse_args(argv)
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if not spy:
        print("Error: py-spy not found. Hint: .venv/bin/pip install py-spy", file=sys.stderr)
        return 1
    name = a.name or (("profile-in-memory" if a.in_memory else "profile-trainer")
                      + ("-windows" if a.handoff == "tf-data" and not a.in_memory else "")
                      + ("-gil" if a.gil else ""))
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, name)
    cmd = [sys.executable, os.path.join(HERE, "epoch_cpu.py"), a.data, "--epochs", str(a.epochs),
           "--batch-size", str(a.batch_size), "--memory-limit", a.memory_limit]
    if a.nworkers:
        cmd += ["--nworkers", str(a.nworkers)]
    if a.in_memory:
        cmd.append("--in-memory")
    else:
        cmd += ["--handoff", a.handoff]
    env = {**os.environ, "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "tensorflow"),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    recorder = None
    epochs: list[str] = []
    t_rec = 0.0
    assert trainer.stdout is not None
    for line in trainer.stdout:
        print(line, end="", flush=True)
        if not line.startswith("epoch "):
            continue
        epochs.append(line.strip())
        if len(epochs) == 1:  # steady epochs from here: attach to the trainer alone
            rec = [spy, "record", "--pid", str(trainer.pid), "--rate", str(a.rate), "--threads",
                   "--format", "raw", "--output", stem + ".raw.txt", "--nonblocking"]
            if a.gil:
                rec.append("--gil")
            recorder = subprocess.Popen(rec, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            t_rec = time.perf_counter()
        if len(epochs) == a.epochs and recorder is not None:
            recorder.send_signal(signal.SIGINT)
    trainer.wait()
    if recorder is None:
        print("Error: the trainer ended before its first epoch did.", file=sys.stderr)
        return 1
    _, err = recorder.communicate(timeout=60)
    seconds = time.perf_counter() - t_rec
    if not os.path.exists(stem + ".raw.txt"):
        print(f"Error: py-spy wrote nothing: {err.strip()[-2000:]}", file=sys.stderr)
        return 1
    steady = epochs[1:]
    found = [re.search(r"([\d,]+) rows/s, wall ([\d.]+)s", e) for e in steady]
    if not all(found):
        print("Error: an epoch line without 'rows/s, wall ...s'", file=sys.stderr)
        return 1
    rows = [int(m.group(1).replace(",", "")) for m in found if m]
    walls = [float(m.group(2)) for m in found if m]
    nrows = round(sum(r * w for r, w in zip(rows, walls, strict=True)))
    batches = -(-nrows // a.batch_size)
    with open(stem + ".raw.txt", encoding="utf-8") as f:
        res = summarize(f.read(), a.rate, batches)
    res.update({"command": shlex.join(["benchmarks/profile_trainer.py", *(argv or sys.argv[1:])]),
                "trainer_command": shlex.join(cmd[1:]), "epochs": epochs,
                "sampled_seconds": round(seconds, 1),
                "gil_only": a.gil, "load": " ".join(f"{x:.2f}" for x in os.getloadavg())})
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    gil = " --gil" if a.gil else ""
    lines = [f"py-spy record --rate {a.rate} --threads{gil} --nonblocking on the trainer "
             f"(pid {trainer.pid}) during epochs 2..{a.epochs}: {res['samples']:,} samples over "
             f"{seconds:.1f}s, {batches:,} batches → {res['cpu_ms_per_batch_total']:.2f} CPU-ms/batch "
             "sampled",
             *epochs, "", "per thread:"]
    lines += [_line(r) for r in res["threads"]]
    for key, title in (("self", "self (leaf frame)"), ("inclusive", "inclusive (anywhere on the stack)")):
        lines += ["", f"top by {title}:"]
        lines += [_line(r) for r in res[key]]
    lines += ["", f"command: {res['command']}"]
    text = "\n".join(lines)
    with open(stem + ".txt", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
