"""Steady epochs on PyTorch: daskfeed against the same training from memory (issue 30's figures).

    .venv/bin/python benchmarks/torch_epochs.py --rows 500000 --epochs 4 --rounds 3

Two comparisons, each in A-B-A order (``A B A B ... A``: every B between two A's), every run a
process of its own on the bench's demo data (``bench-out/data-ROWS``, written once), model and
batch (an MLP 64-64 on six numeric columns, 1000 rows a batch, ``benchmarks/common.py``):

- ``keras``: Keras on its PyTorch backend (``KERAS_BACKEND=torch``), ``model.fit(x, y,
  shuffle=False)`` from numpy arrays in memory (A) against ``fit_from(model, DaskSequence)``
  (B: how ``daskfeed train`` fits, the dataloader hand-off ``auto`` picks on PyTorch);
- ``pydataset``: the same A against ``model.fit(DaskSequence)`` (B: Keras reading the
  ``PyDataset`` itself, one call per batch);
- ``loop``: a plain PyTorch loop (the same MLP in ``torch.nn``, Adam, BCE), a ``DataLoader`` over
  a ``TensorDataset`` in memory, ``batch_size=1000, shuffle=True`` (A) against
  ``daskfeed.TorchDataset`` (B);
- ``ceiling``: the same loop over batches sliced from tensors in memory, rows permuted each
  epoch (A: no per-row indexing nor collation, the fastest a loop from memory gets) against
  ``TorchDataset`` (B).

A run's figure is the median rows/s of its steady epochs (2..N); a comparison's ratio is each
B over the mean of the A's beside it, reported as their median, with the medians of A and B.
daskfeed's runs start a LocalCluster in ``--memory-limit`` (the parse cache on, in a temporary
directory) before the clock starts. Every run gets the same torch threads (``--threads``, 1 by
default, as ``OMP_NUM_THREADS``): starting a LocalCluster sets ``OMP_NUM_THREADS=1`` in the
trainer's own environment (distributed's pre-spawn environment), so torch imported after it takes
one thread; left to torch's default, the in-memory runs alone would take both cores and, beside
busy workers or other load, wait on their spinning threads (3-7k rows/s against 95-250k with one
thread, seen here under load). Results: ``benchmarks/results/torch-epochs[-NAME].{txt,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LABEL = "cleared"
METHODS = {"keras": ("keras-memory", "keras-daskfeed"),
           "pydataset": ("keras-memory", "keras-pydataset"),
           "loop": ("loop-tensordataset", "loop-torchdataset"),
           "ceiling": ("loop-slices", "loop-torchdataset")}


def main() -> None:
    """Run the comparisons in A-B-A order, each run in a child process; write the results."""
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="B runs per comparison (A runs: one more)")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--compare", default="keras,pydataset,loop,ceiling")
    p.add_argument("--name", default="", help="results as torch-epochs-NAME.{json,txt}")
    p.add_argument("--files", type=int, default=0, help="the rows in this many files "
                   "(bench-out/data-ROWS-fFILES); 0: files of 1000 rows")
    p.add_argument("--threads", default="1", help="torch's threads in every run (OMP_NUM_THREADS)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one run
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one_run(a.one, a)), flush=True)
        return
    data = demo_data(a.rows, a.files)
    command = "benchmarks/torch_epochs.py " + " ".join(sys.argv[1:])
    per_file = max(1, a.rows // a.files) if a.files else 1000  # (as demo_data writes them)
    out: dict[str, Any] = {"command": command, "rows": a.rows, "files": -(-a.rows // per_file),
                           "epochs": a.epochs,
                           "batch_size": a.batch_size, "cpus": os.cpu_count(),
                           "torch_threads": a.threads, "name": a.name, "comparisons": {}}
    for name in a.compare.split(","):
        first, second = METHODS[name]
        order = [first, *[m for _ in range(a.rounds) for m in (second, first)]]
        runs = []
        for method in order:
            run = child(method, data, a)
            runs.append(run)
            print(f"{name}: {method}: steady {run['steady']:,.0f} rows/s (epochs "
                  + ", ".join(f"{r:,.0f}" for r in run["rows_per_s"]) + ")", flush=True)
        out["comparisons"][name] = summary(runs, first, second)
    write(out)


def demo_data(rows: int, files: int = 0) -> str:
    """The bench's demo data at ``bench-out/data-ROWS`` (written once), as a glob.

    ``files``: the rows in that many files instead, at ``bench-out/data-ROWS-fFILES``.
    """
    from daskfeed import write_demo_data

    root = os.path.join(ROOT, "bench-out", f"data-{rows}" + (f"-f{files}" if files else ""))
    glob = os.path.join(root, "log_quest", "**", "*.csv")
    if not os.path.isdir(os.path.join(root, "log_quest")):
        if files:
            write_demo_data(root, rows=rows, validate_rows=1000, rows_per_file=max(1, rows // files))
        else:
            write_demo_data(root, rows=rows, validate_rows=1000)
    return glob


def child(method: str, data: str, a: argparse.Namespace) -> dict[str, Any]:
    """One run in a process of its own (Keras picks its backend once per process)."""
    env = {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2",
           "OMP_NUM_THREADS": a.threads, "MKL_NUM_THREADS": a.threads}
    proc = subprocess.run([sys.executable, __file__, "--one", method, "--data", data,
                           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size),
                           "--memory-limit", a.memory_limit],
                          capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{method} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    run: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return run


def one_run(method: str, a: argparse.Namespace) -> dict[str, Any]:
    """Train ``method`` for ``--epochs`` epochs; the wall seconds of each."""
    from common import DEFAULT_FEATURES, load_numpy, resolve_files

    features = list(DEFAULT_FEATURES)
    if method.endswith(("daskfeed", "pydataset", "torchdataset")):
        return _daskfeed_run(method, a, features)
    x, y = load_numpy(resolve_files(a.data), features, LABEL)
    if method == "keras-memory":
        from common import quest_mlp

        model = quest_mlp(x.mean(axis=0).tolist(), x.var(axis=0).tolist())
        clock = _Clock.make()
        model.fit(x, y, batch_size=a.batch_size, epochs=a.epochs, shuffle=False, verbose=0,
                  callbacks=[clock])
        return _record(clock.seconds, len(y))
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if method == "loop-slices":
        return _record(_loop(_Slices(torch.from_numpy(x), torch.from_numpy(y), a.batch_size),
                             x.mean(axis=0), x.std(axis=0), a.epochs), len(y))
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                        batch_size=a.batch_size, shuffle=True)
    return _record(_loop(loader, x.mean(axis=0), x.std(axis=0), a.epochs), len(y))


def _daskfeed_run(method: str, a: argparse.Namespace, features: list[str]) -> dict[str, Any]:
    from daskfeed import Budget
    from daskfeed.cluster import close_client, start_local_cluster

    budget = Budget.split(a.memory_limit)
    client = start_local_cluster(budget, dashboard_address="")
    common = dict(label=LABEL, features=features, as_matrix=True, batch_size=a.batch_size,
                  client=client, seed=0, window_bytes=budget.window_bytes,
                  blocksize=budget.blocksize, prefetch_bytes=budget.prefetch * 2 // 3,
                  cache=tempfile.mkdtemp(prefix="daskfeed-torch-bench-"))
    try:
        if method in ("keras-daskfeed", "keras-pydataset"):
            from common import quest_mlp

            from daskfeed import DaskSequence
            from daskfeed.training import fit_from

            with DaskSequence(a.data, **common) as seq:
                m = seq.manifest
                model = quest_mlp([m.columns[c].mean for c in features],
                                  [m.columns[c].var for c in features])
                clock = _Clock.make()
                if method == "keras-daskfeed":
                    fit_from(model, seq, epochs=a.epochs, shuffle=False, verbose=0,
                             callbacks=[clock])
                else:
                    model.fit(seq, epochs=a.epochs, shuffle=False, verbose=0, callbacks=[clock])
                return _record(clock.seconds, m.rows)
        import numpy as np

        from daskfeed import TorchDataset

        with TorchDataset(a.data, **common) as ds:
            m = ds.manifest
            mean = np.array([m.columns[c].mean for c in features], dtype="float32")
            std = np.array([m.columns[c].var ** 0.5 for c in features], dtype="float32")
            return _record(_loop(ds, mean, std, a.epochs), m.rows)
    finally:
        close_client(client)


def _loop(batches: Any, mean: Any, std: Any, epochs: int) -> list[float]:
    """The plain PyTorch loop: the MLP 64-64 in ``torch.nn``, Adam, BCE; seconds per epoch."""
    import torch

    torch.manual_seed(0)
    mu, sigma = torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)
    model = torch.nn.Sequential(torch.nn.Linear(len(mu), 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    seconds = []
    for _ in range(epochs):
        t = time.perf_counter()
        for x, y in batches:
            loss = loss_fn(model((x - mu) / sigma).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - t)
    return seconds


class _Slices:
    """Batches sliced from tensors in memory, the rows permuted each epoch (one gather a batch)."""

    def __init__(self, x: Any, y: Any, batch: int) -> None:
        self.x, self.y, self.batch = x, y, batch

    def __iter__(self) -> Any:
        import torch

        order = torch.randperm(len(self.y))
        for s in range(0, len(order), self.batch):
            idx = order[s:s + self.batch]
            yield self.x[idx], self.y[idx]


class _Clock:
    """A Keras callback keeping each epoch's wall seconds (made once keras is imported)."""

    @staticmethod
    def make() -> Any:
        from daskfeed.adapters import keras

        class Clock(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.seconds: list[float] = []

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.t = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.seconds.append(time.perf_counter() - self.t)

        return Clock()


def _record(seconds: list[float], rows: int) -> dict[str, Any]:
    rates = [rows / s for s in seconds]
    return {"seconds": seconds, "rows_per_s": rates, "rows": rows,
            "steady": statistics.median(rates[1:]) if len(rates) > 1 else rates[0]}


def summary(runs: list[dict[str, Any]], first: str, second: str) -> dict[str, Any]:
    """Medians of A's and B's steady figures; each B over the mean of its neighbouring A's."""
    a_runs, b_runs = runs[0::2], runs[1::2]
    ratios = [b["steady"] / ((runs[2 * i]["steady"] + runs[2 * i + 2]["steady"]) / 2)
              for i, b in enumerate(b_runs)]
    return {"a": first, "b": second, "a_steady": [r["steady"] for r in a_runs],
            "b_steady": [r["steady"] for r in b_runs], "ratios": ratios,
            "a_median": statistics.median(r["steady"] for r in a_runs),
            "b_median": statistics.median(r["steady"] for r in b_runs),
            "ratio_median": statistics.median(ratios), "runs": runs}


def write(out: dict[str, Any]) -> None:
    """``benchmarks/results/torch-epochs.{json,txt}``, and the text on stdout."""
    lines = [f"{out['command']}", f"{out['rows']:,} rows in {out['files']:,} files, "
             f"{out['epochs']} epochs (steady: 2..{out['epochs']}), batch {out['batch_size']}, "
             f"{out['cpus']} CPUs, torch threads {out['torch_threads']}"]
    for name, c in out["comparisons"].items():
        lines.append(f"{name}: {c['b']} {c['b_median']:,.0f} rows/s against {c['a']} "
                     f"{c['a_median']:,.0f} rows/s (medians); ratio {c['ratio_median']:.2f}x "
                     f"(median of {', '.join(f'{r:.2f}' for r in c['ratios'])}, A-B-A)")
    text = "\n".join(lines)
    print(text)
    results = os.path.join(HERE, "results")
    os.makedirs(results, exist_ok=True)
    stem = "torch-epochs" + (f"-{out['name']}" if out.get("name") else "")
    with open(os.path.join(results, stem + ".json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(results, stem + ".txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
