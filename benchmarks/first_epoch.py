"""Epoch 1 from the command's start: ``daskfeed train`` against load-then-fit (issue 31, item 3).

    .venv/bin/python benchmarks/first_epoch.py --rows 2000000 --rounds 3

Both are whole processes started from the shell, on the same demo files, the same model
(:func:`common.quest_mlp` on the bench's six numeric features, normalized with the data's own
mean and variance), batch 1000, one epoch:

- ``in-memory``: ``python benchmarks/first_epoch.py --in-memory GLOB``: import keras, read every
  file with pyarrow in threads into numpy (:func:`common.load_numpy`), the statistics, the model,
  ``model.fit(x, y, epochs=1, shuffle=True)``: a Keras user's script;
- ``daskfeed``: ``daskfeed train GLOB --label cleared --features ... --as-matrix --epochs 1
  --batch-size 1000 --memory-limit 4GB --model benchmarks/first_epoch.py:model`` with a fresh
  output and parse cache directory (cold: the scan and the cache write are in it).

A-B-A rounds, the ratio of each daskfeed run to the mean of the in-memory runs beside it, and
where the time of each goes: every line either prints is stamped with the seconds since the
process started (daskfeed: its budget line, the dashboard line once the cluster is up, the
``train data`` line once the scan ended and keras is loaded, the ``checkpoints`` line once the
model is built and ``fit`` begins, Keras' line at the epoch's end).
daskfeed is byte-compiled first, as an installed wheel has it (:func:`common.byte_compile`).
Writes ``<out>/first-epoch-<name>.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import DEFAULT_FEATURES, LABEL  # noqa: E402

# daskfeed's lines that mark a phase ending, and the name of the phase
MARKS = (("memory limit:", "start, settings"), ("dashboard:", "cluster up"),
         ("train data:", "scan done, keras loaded"), ("checkpoints:", "model built, fit begins"),
         ("/step", "epoch 1 ended"))


def model(manifest: Any) -> Any:
    """The bench's model for ``daskfeed train --model`` (the statistics from the manifest)."""
    from common import quest_mlp

    cols = [manifest.columns[c] for c in DEFAULT_FEATURES]
    return quest_mlp([c.mean for c in cols], [c.var for c in cols])


def in_memory(pattern: str, batch_size: int) -> None:
    """Load every file into numpy and fit one epoch, printing stamped phases."""
    t0 = time.perf_counter()

    def mark(what: str) -> None:
        print(f"[{time.perf_counter() - t0:.3f}] {what}", flush=True)

    import keras  # noqa: F401  (as a user's script starts)

    mark("keras imported")
    from common import load_numpy, quest_mlp, resolve_files

    x, y = load_numpy(resolve_files(pattern), DEFAULT_FEATURES, LABEL)
    mean, var = x.mean(axis=0), x.var(axis=0)
    mark("loaded")
    net = quest_mlp(mean, var)
    mark("model built")
    net.fit(x, y, batch_size=batch_size, epochs=1, shuffle=True, verbose=0)
    mark("epoch 1 ended")


def _stamped(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, list[tuple[float, str]]]:
    """Run ``cmd``; its wall seconds and each output line with the seconds since its start."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.perf_counter() - t0, line.rstrip()))
    rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n" + "\n".join(t for _, t in lines[-20:]))
    return wall, lines


def _phases(lines: list[tuple[float, str]]) -> dict[str, float]:
    """The seconds at which each of :data:`MARKS` first shows (daskfeed) or ``[s] what`` lines."""
    out: dict[str, float] = {}
    for at, text in lines:
        if text.startswith("[") and "] " in text:  # the in-memory script's own stamps
            out[text.split("] ", 1)[1]] = float(text[1:text.index("]")])
            continue
        for needle, name in MARKS:
            if needle in text and name not in out:
                out[name] = round(at, 3)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the rounds (or, with ``--in-memory``, the in-memory script) and write the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in-memory", metavar="GLOB", help="(internal) the in-memory script")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--work", default="bench-out/first-epoch")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=time.strftime("%Y-%m-%d"))
    a = p.parse_args(argv)
    if a.in_memory:
        in_memory(a.in_memory, a.batch_size)
        return
    from common import byte_compile, code_state, write_results

    from daskfeed import write_demo_data

    byte_compile()

    demo = write_demo_data(os.path.join("bench-out", f"data-{a.rows}"), rows=a.rows)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    mem = [sys.executable, os.path.abspath(__file__), "--in-memory", demo.train_glob,
           "--batch-size", str(a.batch_size)]
    ours = [os.path.join(os.path.dirname(sys.executable), "daskfeed"), "train", demo.train_glob,
            "--label", LABEL, "--features", ",".join(DEFAULT_FEATURES), "--as-matrix", "--epochs", "1",
            "--batch-size", str(a.batch_size), "--memory-limit", a.memory_limit, "--verbose", "2",
            "--model", f"{os.path.abspath(__file__)}:model", "--output", os.path.join(a.work, "out"),
            "--cache", os.path.join(a.work, "cache")]
    runs: dict[str, list[dict[str, Any]]] = {"in_memory": [], "daskfeed": []}

    def one(kind: str) -> None:
        if kind == "daskfeed":
            shutil.rmtree(a.work, ignore_errors=True)
        wall, lines = _stamped(mem if kind == "in_memory" else ours, env)
        runs[kind].append({"seconds": round(wall, 3), "phases": _phases(lines)})
        print(kind, runs[kind][-1], flush=True)

    one("in_memory")  # warm-up: page cache, imports (not counted)
    runs["in_memory"].clear()
    for _ in range(a.rounds):
        one("in_memory")
        one("daskfeed")
    one("in_memory")
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    mem_s = [r["seconds"] for r in runs["in_memory"]]
    pairs = [(mem_s[i] + mem_s[i + 1]) / 2 / r["seconds"] for i, r in enumerate(runs["daskfeed"])]
    phases = {k: {name: statistics.median(r["phases"][name] for r in v if name in r["phases"])
                  for name in v[0]["phases"]} for k, v in runs.items()}
    res = {"what": "epoch 1 from the command's start, whole processes, A-B-A", "rows": a.rows,
           "commands": {"in_memory": " ".join(mem), "daskfeed": " ".join(ours)}, "runs": runs,
           "median_s": med, "ratio_pairs": pairs, "ratio_median": statistics.median(pairs),
           "median_phases_s": phases, "code": code_state(), "load_after": os.getloadavg()}
    lines = [f"epoch 1 from the command's start, {a.rows:,} rows, batch {a.batch_size}, "
             f"{a.rounds} A-B-A rounds: in-memory load+fit {med['in_memory']:.2f} s, daskfeed train "
             f"{med['daskfeed']:.2f} s: rate ratio {res['ratio_median']:.3f} "
             f"(pairs {', '.join(f'{x:.3f}' for x in pairs)})"]
    for k, ph in phases.items():
        lines.append(f"  {k}: " + ", ".join(f"{n} {s:.2f}s" for n, s in ph.items()))
    print("\n".join(lines))
    write_results(a.out, f"first-epoch-{a.name}", res,
                  [*lines, f"command: python benchmarks/first_epoch.py {' '.join(argv or sys.argv[1:])}"])


if __name__ == "__main__":
    main()
