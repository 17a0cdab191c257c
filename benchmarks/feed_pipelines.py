"""What a ``tf.data`` pipeline with Python in it costs each training step, on synthetic data.

    .venv/bin/python benchmarks/feed_pipelines.py [--rows 2000000] [--rounds 2]

The bench's model (``common.quest_mlp``) fits the same 2M in-memory rows (six float32 columns,
batch 1000) four ways, in turn, each round:

- ``fit(x, y)``: Keras' own array path (the in-memory ceiling);
- ``generator``: ``Dataset.from_generator`` yielding 280 batches a call, then ``unbatch``: one
  ``py_function`` call per 280 batches (what ``daskfeed.tf_feed`` did first);
- ``queue``: a Python thread puts the same chunks in a ``tf.queue.FIFOQueue`` that the dataset
  takes from, then ``unbatch``: no Python inside TensorFlow (what ``daskfeed.tf_feed`` does);
- ``tensors``: the chunks as constant tensors, ``unbatch`` (no Python at all).

Prints the median steady rows/s (epochs 2..4) and the process CPU seconds per steady epoch of
each, and their ratios to ``fit(x, y)``.
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

BATCH, CHUNK, EPOCHS = 1000, 280, 4
WAYS = ("fit(x, y)", "generator", "queue", "tensors")


def pipeline(way: str, x: Any, y: Any) -> Any:
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
    elif way == "queue":
        queue = tf.queue.FIFOQueue(2, [tf.float32, tf.float32])

        def produce() -> None:
            for _ in range(EPOCHS):
                for c in chunks():
                    queue.enqueue(c)

        threading.Thread(target=produce, daemon=True).start()

        def take(_: Any) -> Any:
            a, b = queue.dequeue()
            a.set_shape(spec[0].shape)
            b.set_shape(spec[1].shape)
            return a, b

        ds = tf.data.Dataset.range(count).map(take)
    else:
        parts = list(chunks())
        ds = tf.data.Dataset.from_tensors(parts[0])
        for c in parts[1:]:
            ds = ds.concatenate(tf.data.Dataset.from_tensors(c))
    ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(n // BATCH))
    return ds.prefetch(CHUNK)


def run(way: str, rows: int) -> tuple[float, float]:
    """Steady rows/s and CPU seconds per steady epoch of one fit of ``way``."""
    import keras
    import numpy as np
    from common import quest_mlp

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    y = (rng.random(rows) > 0.5).astype(np.float32)
    times: list[tuple[float, float]] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.t, self.c = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            times.append((time.perf_counter() - self.t, time.process_time() - self.c))

    model = quest_mlp([0.0] * 6, [1.0] * 6)
    ds = pipeline(way, x, y)
    if ds is None:
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[Clock()])
    else:
        model.fit(ds, epochs=EPOCHS, verbose=0, callbacks=[Clock()])
    steady = times[1:]
    return rows / statistics.median(t for t, _ in steady), statistics.median(c for _, c in steady)


def main() -> None:
    """Each way in its own process, in turn, ``--rounds`` times; medians and ratios."""
    import subprocess

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one fit, in this process
    a = p.parse_args()
    if a.way:
        rate, cpu = run(a.way, a.rows - a.rows % BATCH)
        print(f"{rate} {cpu}")
        return
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    for r in range(a.rounds):
        for way in WAYS:
            out = subprocess.run([sys.executable, __file__, "--rows", str(a.rows), "--way", way],
                                 capture_output=True, text=True, check=True)
            rate, cpu = map(float, out.stdout.split()[-2:])
            got[way].append((rate, cpu))
            print(f"round {r + 1} {way:<10} {rate:>10,.0f} rows/s  CPU {cpu:.2f} s/epoch", flush=True)
    base = statistics.median(v for v, _ in got["fit(x, y)"])
    for way in WAYS:
        rate = statistics.median(v for v, _ in got[way])
        cpu = statistics.median(c for _, c in got[way])
        print(f"{way:<10} median {rate:>10,.0f} rows/s ({rate / base:.2f}x fit(x, y)), CPU {cpu:.2f} s/epoch")


if __name__ == "__main__":
    main()
