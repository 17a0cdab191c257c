"""``daskfeed train`` of this tree against another commit's, A-B-A: epoch 1 from the start, steady.

    git worktree add /tmp/old 443f333
    .venv/bin/python benchmarks/train_ab.py --old /tmp/old --rows 2000000 --rounds 3

The same command (``daskfeed train GLOB --label cleared --epochs 4 --batch-size 1024
--memory-limit 6GB`` on demo files of 1000 rows, a fresh output and parse cache directory each
run), run in turn with this tree's daskfeed and with ``--old``'s (``PYTHONPATH`` set to it; the
same virtual environment): new, old, new, …, new. Per run: epoch 1 from the command's start (its
``history.json`` ``ended_at`` of epoch 1 minus the time the process was started) and the steady
epoch (median ``seconds`` of epochs 2..N). The ratios are rates, new over old: each old run against
the mean of the new runs beside it. Writes ``<out>/train-ab-<name>.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(cmd: list[str], out: str, pythonpath: str | None,
             extra_env: dict[str, str] | None = None) -> dict[str, float]:
    """One ``daskfeed train`` in a fresh ``out``: epoch 1 from the start, steady epoch seconds.

    ``extra_env``: variables set for this run (``benchmarks/tls_ab.py``: a ``daskfeed.*`` key).
    """
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, **(extra_env or {})}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.time()
    subprocess.run([*cmd, "--output", out, "--cache", os.path.join(out, "cache")], check=True,
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "history.json")) as f:
        epochs = json.load(f)["epochs"]
    return {"epoch1_from_start_s": round(epochs[0]["ended_at"] - start, 3),
            "steady_s": round(statistics.median(e["seconds"] for e in epochs[1:]), 3),
            "wall_s": round(time.time() - start, 3)}


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and write the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the other tree (a git worktree of the commit)")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--memory-limit", default="6GB")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--work", default="bench-out/train-ab")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=time.strftime("%Y-%m-%d"))
    a = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from common import LABEL, code_state, write_results

    from daskfeed import write_demo_data

    demo = write_demo_data(os.path.join("bench-out", f"data-{a.rows}"), rows=a.rows)
    cmd = [os.path.join(os.path.dirname(sys.executable), "daskfeed"), "train", demo.train_glob,
           "--label", LABEL, "--epochs", str(a.epochs), "--batch-size", str(a.batch_size),
           "--memory-limit", a.memory_limit]
    old = subprocess.run(["git", "-C", a.old, "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    runs: dict[str, list[dict[str, float]]] = {"new": [], "old": []}
    for k in range(a.rounds):
        runs["new"].append(run_once(cmd, os.path.join(a.work, "new"), None))
        runs["old"].append(run_once(cmd, os.path.join(a.work, "old"), os.path.abspath(a.old)))
        print(k, runs["new"][-1], runs["old"][-1], flush=True)
    runs["new"].append(run_once(cmd, os.path.join(a.work, "new"), None))
    res: dict[str, Any] = {"command": cmd, "old": old, "code": code_state(), "runs": runs}
    lines = [f"daskfeed train, {a.rows:,} demo rows, {a.epochs} epochs, batch {a.batch_size}, "
             f"{a.memory_limit}; this tree against {old[:7]}, {a.rounds} A-B-A rounds (rates new/old)"]
    for key, what in (("epoch1_from_start_s", "epoch 1 from the command's start"),
                      ("steady_s", "steady epoch")):
        new = [r[key] for r in runs["new"]]
        pairs = [old_run[key] / ((new[i] + new[i + 1]) / 2) for i, old_run in enumerate(runs["old"])]
        res[key] = {"median_new": statistics.median(new),
                    "median_old": statistics.median(r[key] for r in runs["old"]),
                    "ratio_pairs": pairs, "ratio_median": statistics.median(pairs)}
        lines.append(f"  {what}: new {res[key]['median_new']:.2f} s, old {res[key]['median_old']:.2f} s; "
                     f"rate new/old {res[key]['ratio_median']:.3f} "
                     f"(pairs {', '.join(f'{x:.3f}' for x in pairs)})")
    print("\n".join(lines))
    write_results(a.out, f"train-ab-{a.name}", res,
                  [*lines, f"command: python benchmarks/train_ab.py {' '.join(argv or sys.argv[1:])}"])


if __name__ == "__main__":
    main()
