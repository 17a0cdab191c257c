"""What a ``tf.data`` pipeline with Python in it costs each training step, on synthetic data.

    .venv/bin/python benchmarks/feed_pipelines.py [--rows 2000000] [--rounds 2] [--epochs 8]
        [--ways "fit(x, y)" queue stream]

The bench's model (``common.quest_mlp``) fits the same 2M in-memory rows (six float32 columns,
batch 1000) four ways, in turn, each round:

- ``fit(x, y)``: Keras' own array path (the in-memory ceiling);
- ``generator``: ``Dataset.from_generator`` yielding 280 batches a call, then ``unbatch``: one
  ``py_function`` call per 280 batches (what ``daskfeed.adapters._tf_data`` did first);
- ``queue``: a Python thread puts the same chunks in a ``tf.queue.FIFOQueue`` that the dataset
  takes from, then ``unbatch``: no Python inside TensorFlow (what ``daskfeed.adapters._tf_data`` does);
- ``tensors``: the chunks as constant tensors, ``unbatch`` (no Python at all);
- ``stream``: the ``queue`` pipeline made endless, fit with ``steps_per_epoch``: Keras keeps one
  iterator for the whole fit instead of making one per epoch (what ``daskfeed.adapters._tf_data`` hands
  ``fit``).

Prints the median steady rows/s (epochs 2..N) and the process CPU seconds per steady epoch of
each, their ratios to ``fit(x, y)``, and how many steady epochs waited over 100 ms for their
first batch (a new iterator of the ``queue`` pipeline sometimes starts that late).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH, CHUNK = 1000, 280
WAYS = ("fit(x, y)", "generator", "queue", "tensors", "stream")
LATE = 0.1  # seconds: a first batch later than this is counted


def pipeline(way: str, x: Any, y: Any, epochs: int) -> Any:
    """The dataset of ``way`` over ``x``, ``y`` (None: ``fit(x, y)``)."""
    import tensorflow as tf

    n = len(y)

    def chunks() -> Any:
        for s in range(0, n, CHUNK * BATCH):
            e = min(s + CHUNK * BATCH, n)
            yield x[s:e].reshape(-1, BATCH, x.shape[1]), y[s:e].reshape(-1, BATCH)

    spec = (tf.TensorSpec((None, None, x.shape[1]), tf.float32), tf.TensorSpec((None, None), tf.float32))
    count = -(-n // (CHUNK * BATCH))
    if way == "fit(x, y)":
        return None
    if way == "generator":
        ds = tf.data.Dataset.from_generator(chunks, output_signature=spec)
    elif way in ("queue", "stream"):
        queue = tf.queue.FIFOQueue(2, [tf.float32, tf.float32])

        def produce() -> None:
            for _ in range(epochs + 1):
                for c in chunks():
                    queue.enqueue(c)

        threading.Thread(target=produce, daemon=True).start()

        def take(_: Any) -> Any:
            a, b = queue.dequeue()
            a.set_shape(spec[0].shape)
            b.set_shape(spec[1].shape)
            return a, b

        ds = tf.data.Dataset.range(2**62 if way == "stream" else count).map(take)
        if way == "stream":
            ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(
                tf.data.INFINITE_CARDINALITY))
            return ds.prefetch(CHUNK)
    else:
        parts = list(chunks())
        ds = tf.data.Dataset.from_tensors(parts[0])
        for c in parts[1:]:
            ds = ds.concatenate(tf.data.Dataset.from_tensors(c))
    ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(n // BATCH))
    return ds.prefetch(CHUNK)


def run(way: str, rows: int, epochs: int) -> tuple[float, float, int, float]:
    """Steady rows/s, CPU s per steady epoch, steady epochs whose first batch came late, the latest."""
    import keras
    import numpy as np
    from common import quest_mlp

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    y = (rng.random(rows) > 0.5).astype(np.float32)
    times: list[tuple[float, float, float]] = []  # wall, CPU, first batch's wait

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.t, self.c, self.first = time.perf_counter(), time.process_time(), 0.0

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if not self.first:
                self.first = time.perf_counter() - self.t

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            times.append((time.perf_counter() - self.t, time.process_time() - self.c, self.first))

    model = quest_mlp([0.0] * 6, [1.0] * 6)
    ds = pipeline(way, x, y, epochs)
    if ds is None:
        model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[Clock()])
    else:
        steps = {"steps_per_epoch": len(y) // BATCH} if way == "stream" else {}
        model.fit(ds, epochs=epochs, verbose=0, callbacks=[Clock()], **steps)
    steady = times[1:]
    late = [f for _, _, f in steady if f > LATE]
    return (rows / statistics.median(t for t, _, _ in steady),
            statistics.median(c for _, c, _ in steady), len(late), max(late, default=0.0))


def main() -> None:
    """Each way in its own process, in turn, ``--rounds`` times; medians and ratios."""
    import subprocess

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    p.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one fit, in this process
    a = p.parse_args()
    if a.way:
        print(*run(a.way, a.rows - a.rows % BATCH, a.epochs))
        return
    ways = [w for w in WAYS if w in a.ways]
    got: dict[str, list[tuple[float, float, int, float]]] = {w: [] for w in ways}
    for r in range(a.rounds):
        for way in ways:
            out = subprocess.run([sys.executable, __file__, "--rows", str(a.rows), "--epochs",
                                  str(a.epochs), "--way", way], capture_output=True, text=True,
                                 check=True)
            f = out.stdout.split()[-4:]
            got[way].append((float(f[0]), float(f[1]), int(f[2]), float(f[3])))
            print(f"round {r + 1} {way:<10} {float(f[0]):>10,.0f} rows/s  CPU {float(f[1]):.2f} "
                  f"s/epoch  first batch > {LATE:g} s: {f[2]} of {a.epochs - 1} (latest "
                  f"{float(f[3]):.2f} s)", flush=True)
    base = statistics.median(v[0] for v in got[ways[0]])
    for way in ways:
        rate = statistics.median(v[0] for v in got[way])
        cpu = statistics.median(v[1] for v in got[way])
        late = sum(v[2] for v in got[way])
        print(f"{way:<10} median {rate:>10,.0f} rows/s ({rate / base:.2f}x {ways[0]}), CPU "
              f"{cpu:.2f} s/epoch, first batch late in {late} of {a.rounds * (a.epochs - 1)} "
              "steady epochs")


if __name__ == "__main__":
    main()
