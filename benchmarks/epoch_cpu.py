"""Where an epoch's CPU goes: trainer process vs worker processes, per epoch, for the bench's setup.

    .venv/bin/python benchmarks/epoch_cpu.py "bench-out/data-2000000/log_quest/**/*.csv" [--nworkers 2]
    .venv/bin/python benchmarks/epoch_cpu.py "...csv" --in-memory   # the same model fit from numpy
    .venv/bin/python benchmarks/epoch_cpu.py "...csv" --floor       # from a PyDataset slicing numpy
    .venv/bin/python benchmarks/epoch_cpu.py "...csv" --windows 250 # tf.data fed 250 batches a call

Prints, per epoch: rows/s, wall seconds, CPU seconds of the trainer process and of its children
(the local cluster's workers), and the seconds ``__getitem__`` waited for windows; after the
last epoch, the trainer's CPU over epochs 2..N per kind of thread (Linux: by ``comm``, where
Python threads say ``python`` and TensorFlow's pools ``tf_Compute``), in ms per batch.
``--in-memory`` fits ``model.fit(x, y, shuffle=False)``; ``--floor`` fits a ``PyDataset`` whose
``__getitem__`` only slices those arrays (the cost of Keras' PyDataset adapter alone);
``--windows K`` fits a ``tf.data`` pipeline whose Python generator yields K batches a call
(``from_generator`` → ``unbatch``), what an adapter crossing into TF per window could reach. The model and
the sequence are the benchmark's (``benchmarks/common.py``, ``benchmarks/ours.py``);
``benchmarks/profile_trainer.py`` runs it under py-spy for the trainer's profile.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    """Parse the arguments, fit, print a line per epoch."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--nworkers", type=int, default=None)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--in-memory", action="store_true")
    p.add_argument("--floor", action="store_true")
    p.add_argument("--windows", type=int, default=0, metavar="K")
    p.add_argument("--handoff", choices=("pydataset", "tf-data"), default="pydataset",
                   help="daskfeed's hand-off: the PyDataset or the tf.data hand-off")
    a = p.parse_args()

    import keras
    import psutil
    from common import DEFAULT_FEATURES, load_numpy, quest_mlp, resolve_files

    from daskfeed import Budget, DaskSequence
    from daskfeed.cluster import close_client, start_local_cluster

    me = psutil.Process()

    def cpu() -> tuple[float, float]:
        kids = sum(sum(k.cpu_times()[:2]) for k in me.children(recursive=True))
        return sum(me.cpu_times()[:2]), kids

    def by_thread() -> dict[int, tuple[str, float]]:
        """CPU seconds so far of each of this process's threads, with its kind (``comm``)."""
        out = {}
        for th in me.threads():
            try:
                with open(f"/proc/self/task/{th.id}/comm", encoding="utf-8") as f:
                    name = re.sub(r"\d+", "#", f.read().strip())
            except OSError:  # not Linux, or the thread ended
                name = "?"
            out[th.id] = (name, th.user_time + th.system_time)
        return out

    features = list(DEFAULT_FEATURES)
    client = seq = None
    if a.in_memory or a.floor or a.windows:
        x, y = load_numpy(resolve_files(a.data), features, "cleared")
        rows = len(y)
        model = quest_mlp(x.mean(axis=0).tolist(), x.var(axis=0).tolist())
    else:
        budget = Budget.split(a.memory_limit, nworkers=a.nworkers)
        client = start_local_cluster(budget, dashboard_address="")
        seq = DaskSequence(a.data, label="cleared", features=features, as_matrix=True,
                           batch_size=a.batch_size,
                           client=client, seed=0, window_bytes=budget.window_bytes,
                           blocksize=budget.blocksize, prefetch_bytes=budget.prefetch * 2 // 3,
                           cache=tempfile.mkdtemp(prefix="daskfeed-cpu-"))
        m = seq.manifest
        rows = m.rows
        model = quest_mlp([m.columns[c].mean for c in features], [m.columns[c].var for c in features])

    class Slices(keras.utils.PyDataset):
        """The floor: batches already in memory, ``__getitem__`` only slices."""

        def __len__(self) -> int:
            return -(-len(y) // a.batch_size)

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            b = a.batch_size
            return x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]

    threads_after_1: dict[int, tuple[str, float]] = {}

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.t, self.c = time.perf_counter(), cpu()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            wall = time.perf_counter() - self.t
            c = cpu()
            waited = 0.0
            if seq is not None:  # Keras may advance the sequence before or after this callback
                st = seq.last_epoch_stats
                st = st if st.get("epoch") == epoch else seq.epoch_stats()
                waited = st.get("wait_seconds", 0.0)
            print(f"epoch {epoch + 1}: {rows / wall:,.0f} rows/s, wall {wall:.2f}s, CPU trainer "
                  f"{c[0] - self.c[0]:.2f}s, workers {c[1] - self.c[1]:.2f}s, data wait {waited:.3f}s",
                  flush=True)
            if epoch == 0:
                threads_after_1.update(by_thread())
            elif epoch == a.epochs - 1:
                kinds: collections.defaultdict[str, float] = collections.defaultdict(float)
                for tid, (name, t) in by_thread().items():
                    kinds[name] += t - threads_after_1.get(tid, (name, 0.0))[1]
                batches = (a.epochs - 1) * -(-rows // a.batch_size)
                ranked = sorted(kinds.items(), key=lambda kv: -kv[1])
                print("trainer CPU in epochs 2..N by thread kind: " + ", ".join(
                    f"{name} {1000 * t / batches:.2f} ms/batch" for name, t in ranked if t > 0),
                    flush=True)

    try:
        if a.floor:
            model.fit(Slices(), epochs=a.epochs, shuffle=False, verbose=0, callbacks=[Clock()])
        elif a.windows:
            model.fit(windows(x, y, a.batch_size, a.windows), epochs=a.epochs, verbose=0,
                      callbacks=[Clock()])
        elif a.in_memory:
            model.fit(x, y, batch_size=a.batch_size, epochs=a.epochs, shuffle=False, verbose=0,
                      callbacks=[Clock()])
        elif a.handoff == "tf-data":
            from daskfeed.adapters import fit_inputs

            assert seq is not None  # as daskfeed train hands it to fit (a stream, its callback)
            with fit_inputs(seq, "tf-data", {"epochs": a.epochs, "verbose": 0,
                                             "callbacks": [Clock()]}) as (ds, kwargs):
                model.fit(ds, **kwargs)
        else:
            model.fit(seq, epochs=a.epochs, shuffle=False, verbose=0, callbacks=[Clock()])
    finally:
        if seq is not None:
            seq.close()
        if client is not None:
            close_client(client)


def windows(x: Any, y: Any, batch: int, k: int) -> Any:
    """A tf.data pipeline of whole batches, its Python generator yielding ``k`` of them a call."""
    import tensorflow as tf

    n = len(y) // batch * batch  # whole batches (the bench's row counts are multiples)

    def gen() -> Any:
        for s in range(0, n, k * batch):
            e = min(s + k * batch, n)
            yield x[s:e].reshape(-1, batch, x.shape[1]), y[s:e].reshape(-1, batch)

    ds = tf.data.Dataset.from_generator(gen, output_signature=(
        tf.TensorSpec((None, batch, x.shape[1]), tf.as_dtype(x.dtype)),
        tf.TensorSpec((None, batch), tf.as_dtype(y.dtype))))
    ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(n // batch))
    return ds.prefetch(tf.data.AUTOTUNE)


if __name__ == "__main__":
    main()
