r"""Feed rate of one trainer against real ``dask scheduler`` / ``dask worker`` processes.

For each cluster shape (1, 2, 4 worker processes by default, each ``--nthreads 1`` as in
``deploy/``), ``--runs`` times: start the scheduler and the workers with the command lines of
``deploy/compose.yaml`` (on 127.0.0.1), connect, scan the data (CSV parsed once, parse cache
written on the workers), then read every batch of ``--epochs`` epochs of a ``DaskSequence`` in
this process (no model: the rate the cluster feeds a trainer), then 2 epochs of the same data
with no cache (every window parses its CSV again), and stop the cluster. Printed and written
as JSON: medians over the runs of the scan's rows/s, of the epochs' rows/s from the parse
cache and from CSV, per worker core too, and the bytes per row of the CSV and of the cache.

    .venv/bin/python benchmarks/scaleout.py --rows 400000 --workers 1 2 4 --runs 3 \\
        --json benchmarks/results/scaleout.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"  # the manifests it starts from
BIN = Path(sys.executable).parent


def compose_commands(scheduler_file: str) -> tuple[list[str], list[str]]:
    """The scheduler and worker command lines of compose.yaml, bound to 127.0.0.1."""
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    sched, worker = list(services["scheduler"]["command"]), list(services["worker"]["command"])
    sched[sched.index("--host") + 1] = "127.0.0.1"
    sched[sched.index("--port") + 1] = "0"
    sched[sched.index("--dashboard-address") + 1] = "127.0.0.1:0"
    worker = [p for p in worker if not p.startswith("tcp://")]
    worker[worker.index("--dashboard-address") + 1] = "127.0.0.1:0"
    worker[worker.index("--memory-limit") + 1] = "2GiB"  # this machine's size, not a Pod's
    return ([*sched, "--scheduler-file", scheduler_file],
            [*worker, "--scheduler-file", scheduler_file, "--host", "127.0.0.1"])


def start_cluster(nworkers: int, workdir: str) -> tuple[list[subprocess.Popen], str]:
    """``dask scheduler`` + ``nworkers`` ``dask worker`` processes; (processes, scheduler file)."""
    sf = os.path.join(workdir, "scheduler.json")
    sched, worker = compose_commands(sf)
    dask = str(BIN / "dask")
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
                             "start_new_session": True}
    procs = [subprocess.Popen([dask, *sched[1:]], **quiet)]
    deadline = time.monotonic() + 60
    while not (os.path.exists(sf) and os.path.getsize(sf)):
        if procs[0].poll() is not None or time.monotonic() > deadline:
            stop(procs)
            raise RuntimeError("dask scheduler did not start")
        time.sleep(0.1)  # polling interval
    procs += [subprocess.Popen([dask, *worker[1:]], **quiet) for _ in range(nworkers)]
    return procs, sf


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, SIGKILL what outlives 20 s."""
    for p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def du(path: str) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def one_run(data: str, nworkers: int, epochs: int, batch_size: int) -> dict[str, Any]:
    """Start the cluster, scan, read ``epochs`` epochs; the figures of this run."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    from distributed import Client

    from daskfeed import Budget, DaskSequence

    workdir = tempfile.mkdtemp(prefix="daskfeed-scaleout-")
    procs, sf = start_cluster(nworkers, workdir)
    try:
        with Client(scheduler_file=sf, timeout="60s") as client:
            client.wait_for_workers(nworkers, timeout=120)
            budget = Budget.remote("2GB", client)
            cache = os.path.join(workdir, "cache")
            t0 = time.perf_counter()
            with DaskSequence(data, label="cleared", batch_size=batch_size, client=client,
                              window_bytes=budget.window_bytes, blocksize=budget.blocksize,
                              prefetch_bytes=budget.prefetch * 2 // 3, cache=cache) as seq:
                scan_s = time.perf_counter() - t0
                rates = []
                for e in range(epochs):
                    t = time.perf_counter()
                    rows = sum(len(seq[i][1]) for i in range(len(seq)))
                    rates.append(rows / (time.perf_counter() - t))
                    if e + 1 < epochs:
                        seq.on_epoch_end()
                m = seq.manifest
                out = {"workers": nworkers, "rows": m.rows, "csv_bytes": m.nbytes,
                       "partitions": len(m.blocks), "windows": len(seq.plan.windows),
                       "scan_seconds": scan_s, "scan_rows_per_s": m.rows / scan_s,
                       "epoch_rows_per_s": rates, "cache_bytes": du(cache),
                       "cache_status": seq.cache_status}
            # the same windows with no cache: every epoch parses the CSV again
            with DaskSequence(data, label="cleared", batch_size=batch_size, client=client,
                              window_bytes=budget.window_bytes, blocksize=budget.blocksize,
                              prefetch_bytes=budget.prefetch * 2 // 3, cache=False,
                              manifest=m) as seq:
                csv = []
                for e in range(2):
                    t = time.perf_counter()
                    rows = sum(len(seq[i][1]) for i in range(len(seq)))
                    csv.append(rows / (time.perf_counter() - t))
                    if e == 0:
                        seq.on_epoch_end()
            return {**out, "csv_epoch_rows_per_s": csv, "loadavg": os.getloadavg()}
    finally:
        stop(procs)
        shutil.rmtree(workdir, ignore_errors=True)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of one cluster shape."""
    n = runs[0]["workers"]
    steady = statistics.median(statistics.median(r["epoch_rows_per_s"]) for r in runs)
    scan = statistics.median(r["scan_rows_per_s"] for r in runs)
    csv = statistics.median(statistics.median(r["csv_epoch_rows_per_s"]) for r in runs)
    return {"workers": n, "runs": len(runs), "rows": runs[0]["rows"],
            "csv_bytes_per_row": runs[0]["csv_bytes"] / runs[0]["rows"],
            "cache_bytes_per_row": statistics.median(r["cache_bytes"] for r in runs) / runs[0]["rows"],
            "scan_rows_per_s": scan, "scan_rows_per_s_per_worker": scan / n,
            "epoch_rows_per_s": steady, "epoch_rows_per_s_per_worker": steady / n,
            "csv_epoch_rows_per_s": csv, "csv_epoch_rows_per_s_per_worker": csv / n,
            "csv_epoch_rows_per_s_each_run": [statistics.median(r["csv_epoch_rows_per_s"])
                                              for r in runs],
            "loadavg_each_run": [r["loadavg"] for r in runs],
            "scan_rows_per_s_each_run": [r["scan_rows_per_s"] for r in runs],
            "epoch_rows_per_s_each_run": [statistics.median(r["epoch_rows_per_s"]) for r in runs],
            "cache_status": runs[0]["cache_status"]}


def main() -> None:
    """Run the measurement (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--rows-per-file", type=int, default=25_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "daskfeed-scaleout-data"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from daskfeed import write_demo_data

    demo = write_demo_data(args.data_dir, rows=args.rows, validate_rows=1000,
                           rows_per_file=args.rows_per_file)
    results = []
    for n in args.workers:
        runs = [one_run(demo.train_glob, n, args.epochs, args.batch_size) for _ in range(args.runs)]
        s = summarize(runs)
        results.append(s)
        print(f"{n} worker(s): scan {s['scan_rows_per_s']:,.0f} rows/s "
              f"({s['scan_rows_per_s_per_worker']:,.0f}/worker), epochs from the cache "
              f"{s['epoch_rows_per_s']:,.0f} rows/s ({s['epoch_rows_per_s_per_worker']:,.0f}/worker), "
              f"epochs parsing CSV {s['csv_epoch_rows_per_s']:,.0f} rows/s "
              f"({s['csv_epoch_rows_per_s_per_worker']:,.0f}/worker); "
              f"CSV {s['csv_bytes_per_row']:.1f} B/row, cache {s['cache_bytes_per_row']:.1f} B/row "
              f"(median of {s['runs']} runs)", flush=True)
    info = {"rows": args.rows, "rows_per_file": args.rows_per_file, "epochs": args.epochs,
            "batch_size": args.batch_size, "cpu_count": os.cpu_count(), "results": results,
            "command": " ".join(sys.argv)}
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
