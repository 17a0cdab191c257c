"""Data wait on a GPU: daskfeed feeding models of growing size from a local cluster (issue 15, 6).

For each model (the bench's :func:`common.quest_mlp` with the hidden layers given), in one run on
the same data and batch size: the in-memory ceiling (pyarrow → numpy, ``fit(x, y)``), daskfeed as
``daskfeed train`` fits (a LocalCluster in ``--memory-limit``, ``DaskSequence``, ``fit_from``:
the ``tf.data`` hand-off on TensorFlow, the sequence itself on JAX), and the ceiling again
(A-B-A); after A1, a ``PyDataset`` that only slices the in-memory arrays (Keras' adapter's own
cost per batch, daskfeed's floor on JAX). Reported per model: steady rows/s and their ratios,
epoch 1 from each method's start, daskfeed's data wait (seconds ``fit`` waited for a batch, over
the epoch's seconds) in epoch 1 and in steady epochs, and the ceiling's milliseconds per step.

    KERAS_BACKEND=jax python benchmarks/gpu.py --rows 1000000 --memory-limit 32GB

It runs on any backend and device; the figures mean something where the model trains on a GPU.
Writes ``<out>/<name>.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# light imports only: Dask's spawned workers import this script again (as __mp_main__)
from common import DEFAULT_FEATURES, LABEL, code_state, resolve_files, steady

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = "64,64;1024,1024,1024;4096,4096,4096;8192,8192,8192,8192"


def _device() -> dict[str, Any]:
    """The backend and the devices it trains on."""
    from daskfeed.adapters import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        devices = [str(d) for d in jax.devices()]
    elif backend == "tensorflow":
        import tensorflow as tf

        devices = [d.name for d in tf.config.list_physical_devices()]
    else:
        devices = []
    return {"backend": backend, "devices": devices, "cpus": os.cpu_count(), "code": code_state()}


def _figures(ceil: list[dict[str, Any]], floor: dict[str, Any], ours: dict[str, Any],
             hidden: Sequence[int], batch_size: int) -> dict[str, Any]:
    """One model's row: the ceiling's figures (median of A1, A2), the floor's and daskfeed's."""
    eps = ours["epochs"]
    c_steady = statistics.median(steady(c["epochs"]) for c in ceil)
    f_steady = steady(floor["epochs"])
    c_first = statistics.median(c["epochs"][0]["rows_per_s_from_start"] for c in ceil)
    d_steady = steady(eps)
    d_first = eps[0]["rows_per_s_from_start"]
    return {
        "hidden": list(hidden),
        "ceiling_steady_rows_per_s": round(c_steady, 1),
        "ceiling_step_ms": round(1e3 * batch_size / c_steady, 3),
        "daskfeed_steady_rows_per_s": round(d_steady, 1),
        "steady_ratio": round(d_steady / c_steady, 3),
        "floor_steady_rows_per_s": round(f_steady, 1),
        "floor_ratio": round(f_steady / c_steady, 3),
        "ceiling_epoch1_rows_per_s_from_start": round(c_first, 1),
        "daskfeed_epoch1_rows_per_s_from_start": round(d_first, 1),
        "epoch1_ratio": round(d_first / c_first, 3),
        "data_wait_epoch1": eps[0]["data_wait_fraction"],
        "data_wait_steady": round(steady(eps, "data_wait_fraction"), 4),
        "daskfeed_cluster_start_seconds": ours["cluster_start_seconds"],
        "daskfeed_scan_seconds": ours["scan_seconds"],
        "peak_rss_bytes": ours["peak_rss_bytes"],
        "budget_bytes": ours["budget"]["total"],
        "ceiling_runs": ceil, "floor": floor, "daskfeed": ours,
    }


def run(data: str, *, models: Sequence[Sequence[int]], batch_size: int, epochs: int,
        memory_limit: str, nworkers: int | None, features: Sequence[str] = DEFAULT_FEATURES,
        label: str = LABEL, echo: Callable[[str], None] = print,
        scheduler: str | None = None) -> dict[str, Any]:
    """For each model: the ceiling, daskfeed, the ceiling again; their figures (:func:`_figures`).

    ``scheduler``: a running scheduler daskfeed uses instead of a LocalCluster it starts.
    """
    import anchors
    import ours

    files = resolve_files(data)
    rows = []
    with tempfile.TemporaryDirectory(prefix="daskfeed-gpu-") as workdir:
        for hidden in models:
            t0 = time.perf_counter()
            first, stats, (x, y) = anchors.in_memory(files, features, label, batch_size, epochs, None,
                                                     hidden=hidden)
            floor = anchors.pydataset_floor(x, y, stats, batch_size, epochs, hidden=hidden)
            del x, y
            ceil = [first]
            mine = ours.daskfeed_fit(data, features, label, batch_size, epochs, memory_limit, nworkers,
                                     None, workdir, tag="-".join(map(str, hidden)), hidden=hidden,
                                     scheduler=scheduler)
            ceil.append(anchors.in_memory(files, features, label, batch_size, epochs, None,
                                          hidden=hidden)[0])
            row = _figures(ceil, floor, mine, hidden, batch_size)
            echo(f"  hidden {row['hidden']}: ceiling {row['ceiling_steady_rows_per_s']:,.0f} rows/s "
                 f"({row['ceiling_step_ms']:.2f} ms/step), daskfeed {row['daskfeed_steady_rows_per_s']:,.0f} "
                 f"({row['steady_ratio']:.2f}×; PyDataset floor {row['floor_ratio']:.2f}×), data wait "
                 f"{100 * row['data_wait_steady']:.1f} % steady, {100 * row['data_wait_epoch1']:.1f} % "
                 f"epoch 1 ({time.perf_counter() - t0:.0f}s)")
            rows.append(row)
    return {"rows": rows}


def format_table(res: dict[str, Any]) -> str:
    """The result as a text table, with the command and the device."""
    cfg = res["config"]
    lines = [f"command: {cfg['command']}",
             f"device: {cfg['device']['backend']} on {', '.join(cfg['device']['devices'])}; "
             f"{cfg['device']['cpus']} CPUs; {cfg['rows']:,} rows, batch {cfg['batch_size']}, "
             f"{cfg['epochs']} epochs, budget {cfg['memory_limit']}; daskfeed on "
             + (f"the scheduler {cfg['scheduler']}" if cfg.get("scheduler") else "a LocalCluster"),
             "",
             f"{'hidden layers':<22} {'ceiling rows/s':>15} {'ms/step':>8} {'daskfeed rows/s':>16} "
             f"{'steady ×':>9} {'floor ×':>8} {'epoch 1 ×':>10} {'wait steady':>12} {'wait epoch 1':>13}"]
    for r in res["rows"]:
        lines.append(f"{'-'.join(map(str, r['hidden'])):<22} {r['ceiling_steady_rows_per_s']:>15,.0f} "
                     f"{r['ceiling_step_ms']:>8.2f} {r['daskfeed_steady_rows_per_s']:>16,.0f} "
                     f"{r['steady_ratio']:>9.2f} {r['floor_ratio']:>8.2f} {r['epoch1_ratio']:>10.2f} "
                     f"{100 * r['data_wait_steady']:>11.1f}% {100 * r['data_wait_epoch1']:>12.1f}%")
    lines.append("\nsteady: median of epochs 2..N (the ceiling: median of its A1 and A2 runs); floor: "
                 "a PyDataset slicing the in-memory arrays, steady, over the ceiling; epoch 1 "
                 "timed from each method's start (daskfeed's cluster start and scan included); wait: "
                 "seconds fit waited for a batch over the epoch's seconds.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="benchmarks/gpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", help="CSV files, directory or glob (or --rows N)")
    p.add_argument("--rows", type=int, help="generate this many demo rows (1000-row files) instead")
    p.add_argument("--data-dir", help="where --rows writes the demo data [bench-out/data-ROWS]")
    p.add_argument("--models", default=MODELS, help=f"hidden layers per model, ';'-separated [{MODELS}]")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=4, help="per fit, >= 4 [4]")
    p.add_argument("--memory-limit", default="16GB", help="daskfeed's budget for the process tree [16GB]")
    p.add_argument("--nworkers", type=int, default=None)
    p.add_argument("--scheduler", help="a running dask scheduler's address for daskfeed, instead of a "
                                       "LocalCluster in the trainer's process")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results directory")
    p.add_argument("--name", default="gpu", help="file name stem [gpu]")
    a = p.parse_args(argv)
    if (a.data is None) == (a.rows is None):
        p.error("give either DATA or --rows N (generate demo data), not both")
    if a.epochs < 4:
        p.error(f"--epochs must be at least 4 (epoch 1 and three steady ones). Received: {a.epochs}")
    try:
        models = [[int(u) for u in m.split(",")] for m in a.models.split(";")]
    except ValueError:
        p.error(f"--models: expected hidden layer sizes such as '64,64;1024,1024'. Received: {a.models!r}")
    if a.rows is not None:
        from bench import demo_data

        data = demo_data(a.rows, a.data_dir)[0]
    else:
        data = a.data
    command = shlex.join(["benchmarks/gpu.py", *(argv if argv is not None else sys.argv[1:])])
    res = run(data, models=models, batch_size=a.batch_size, epochs=a.epochs,
              memory_limit=a.memory_limit, nworkers=a.nworkers, scheduler=a.scheduler)
    res["config"] = {"command": command, "data": data, "rows": res["rows"][0]["daskfeed"]["rows"],
                     "batch_size": a.batch_size, "epochs": a.epochs, "memory_limit": a.memory_limit,
                     "nworkers": a.nworkers, "scheduler": a.scheduler, "device": _device()}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, a.name)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    text = format_table(res)
    with open(stem + ".txt", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print("\n" + text + f"\n\nwrote {stem}.json, {stem}.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
