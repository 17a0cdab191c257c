"""``daskfeed train`` with the local cluster's TLS on and off (``daskfeed.local-tls``), A-B-A.

    .venv/bin/python benchmarks/tls_ab.py --rows 200000 --rounds 3

The same command (``daskfeed train GLOB --label cleared --epochs 4 --batch-size 1024
--memory-limit 4GB`` on demo files of 1000 rows, a fresh output and parse cache directory each
run), run in turn with TLS on (``DASK_DASKFEED__LOCAL_TLS=true``, the default) and off: on, off,
on, …, on. Per run (:func:`train_ab.run_once`): the command's wall time, epoch 1 from the
command's start, and the steady epoch (median ``seconds`` of epochs 2..N). The ratios are times,
on over off: each off run against the mean of the on runs beside it (above 1: TLS costs that
much). Writes ``<out>/tls-ab-<name>.json`` and ``.txt``, with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and write the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--work", default="bench-out/tls-ab")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=time.strftime("%Y-%m-%d"))
    a = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from common import LABEL, code_state, write_results
    from train_ab import run_once

    from daskfeed import write_demo_data

    demo = write_demo_data(os.path.join("bench-out", f"data-{a.rows}"), rows=a.rows)
    cmd = [os.path.join(os.path.dirname(sys.executable), "daskfeed"), "train", demo.train_glob,
           "--label", LABEL, "--epochs", str(a.epochs), "--batch-size", str(a.batch_size),
           "--memory-limit", a.memory_limit, "--dashboard-address", "127.0.0.1:0"]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}

    def one(tls: str) -> None:
        runs[tls].append(run_once(cmd, os.path.join(a.work, tls), None,
                                  {"DASK_DASKFEED__LOCAL_TLS": "true" if tls == "on" else "false"}))
        print(tls, runs[tls][-1], flush=True)

    for _ in range(a.rounds):
        one("on")
        one("off")
    one("on")
    res: dict[str, Any] = {"command": cmd, "code": code_state(), "runs": runs,
                           "load_before": load_before, "load_after": os.getloadavg()}
    lines = [f"daskfeed train, {a.rows:,} demo rows, {a.epochs} epochs, batch {a.batch_size}, "
             f"{a.memory_limit}; local cluster TLS on vs off, {a.rounds} A-B-A rounds "
             f"(times on/off; load average before {load_before[0]:.1f}, after "
             f"{res['load_after'][0]:.1f} on {os.cpu_count()} cores)"]
    for key, what in (("wall_s", "the whole command"),
                      ("epoch1_from_start_s", "epoch 1 from the command's start"),
                      ("steady_s", "steady epoch")):
        on = [r[key] for r in runs["on"]]
        pairs = [((on[i] + on[i + 1]) / 2) / off[key] for i, off in enumerate(runs["off"])]
        res[key] = {"median_on": statistics.median(on),
                    "median_off": statistics.median(r[key] for r in runs["off"]),
                    "ratio_pairs": pairs, "ratio_median": statistics.median(pairs)}
        lines.append(f"  {what}: on {res[key]['median_on']:.2f} s, off {res[key]['median_off']:.2f} s; "
                     f"time on/off {res[key]['ratio_median']:.3f} "
                     f"(pairs {', '.join(f'{x:.3f}' for x in pairs)})")
    print("\n".join(lines))
    write_results(a.out, f"tls-ab-{a.name}", res,
                  [*lines, f"command: python benchmarks/tls_ab.py {' '.join(argv or sys.argv[1:])}"])


if __name__ == "__main__":
    main()
