"""The references daskfeed is measured against, each written the way its own users write it.

- :func:`pyarrow_parse`: pyarrow parsing every file (the columns the model uses), threaded;
- :func:`in_memory`: pyarrow → numpy, then ``model.fit(x, y)`` (the ceiling);
- :func:`pydataset_floor`: the same arrays through a ``PyDataset`` that only slices them (what
  Keras' PyDataset adapter itself costs: no PyDataset can be faster);
- :func:`tf_data`: ``list_files`` → ``interleave(TextLineDataset.skip(1))`` → ``batch`` →
  vectorized ``tf.io.decode_csv`` → ``prefetch``, AUTOTUNE throughout, with no cache,
  ``.cache(filename)`` on disk, or ``.cache()`` in RAM;
- :func:`old_recipe`: a ``PyDataset`` reading one pandas CSV per index, with daskfeed's number of
  worker processes.

Every fit function returns per-epoch records (:func:`common.epoch_records`), epoch 1 also timed
from the method's start (reading included), and the peak RSS of the process tree.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import statistics
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from common import epoch_clock, epoch_records, load_numpy, losses, quest_mlp

from daskfeed.core import RSSSampler

Stats = tuple[list[float], list[float]]
Val = tuple[np.ndarray, np.ndarray] | None


def pyarrow_parse(files: Sequence[str], columns: Sequence[str], passes: int = 3) -> dict[str, Any]:
    """Pyarrow parsing ``columns`` of every file: ``read_csv`` in a thread pool, and ``pyarrow.dataset``.

    Parameters
    ----------
    files
        CSV files.
    columns
        The columns read (the same the model and daskfeed's feed deliver).
    passes
        Passes per variant; each variant's figure is the median of its passes.

    Returns
    -------
    dict
        ``rows``, ``rows_per_s`` (the faster variant's median), ``reference`` (its name),
        ``variants`` (every pass of each).
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.csv as pacsv
    import pyarrow.dataset as pads

    cols = list(columns)
    convert = pacsv.ConvertOptions(include_columns=cols)

    def read_all() -> int:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            return sum(pool.map(lambda f: pacsv.read_csv(f, convert_options=convert).num_rows, files))

    def dataset() -> int:
        return pads.dataset(list(files), format="csv").to_table(columns=cols).num_rows

    read_all()  # warms the page cache for every method after this one (not counted)
    passes_of: dict[str, list[float]] = {"read_csv_threadpool": [], "pyarrow_dataset": []}
    rows = 0
    for _ in range(passes):
        for name, fn in (("read_csv_threadpool", read_all), ("pyarrow_dataset", dataset)):
            t0 = time.perf_counter()
            rows = fn()
            passes_of[name].append(rows / (time.perf_counter() - t0))
    medians = {k: statistics.median(v) for k, v in passes_of.items()}
    best = max(medians, key=lambda k: medians[k])
    return {"rows": rows, "rows_per_s": round(medians[best], 1), "reference": best,
            "columns": cols,
            "variants": {k: {"median_rows_per_s": round(medians[k], 1),
                             "passes_rows_per_s": [round(r, 1) for r in v]} for k, v in passes_of.items()},
            "note": f"the model's {len(cols)} columns, page cache warm, median of {passes} passes"}


def in_memory(files: Sequence[str], features: Sequence[str], label: str, batch_size: int, epochs: int,
              val: Val, hidden: Sequence[int] = (64, 64),
              ) -> tuple[dict[str, Any], Stats, tuple[np.ndarray, np.ndarray]]:
    """Read everything into numpy, then ``model.fit(x, y, shuffle=True)``: the ceiling.

    ``hidden``: the model's hidden layers (:func:`common.quest_mlp`).

    Returns
    -------
    record : dict
        Per-epoch records; epoch 1 from the start includes the load.
    stats : tuple
        Per-feature mean and variance (given to the anchors' models).
    arrays : tuple
        ``(x, y)``.
    """
    with RSSSampler(interval=0.1) as rss:
        t0 = time.perf_counter()
        x, y = load_numpy(files, features, label)
        stats = (x.mean(axis=0).tolist(), x.var(axis=0).tolist())
        load_s = time.perf_counter() - t0
        model = quest_mlp(*stats, hidden=hidden)
        clock = epoch_clock()
        hist = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0,
                         callbacks=[clock])
    rows = len(y)
    rec = {"rows": rows, "load_seconds": round(load_s, 4), "epochs": epoch_records(clock, rows, t0),
           "expected_steps": math.ceil(rows / batch_size), "peak_rss_bytes": rss.peak,
           "rss_at_start_bytes": rss.start, "note": "pyarrow (threads) → numpy, fit(x, y, shuffle=True)",
           **losses(model, hist, val, batch_size)}
    return rec, stats, (x, y)


def pydataset_floor(x: np.ndarray, y: np.ndarray, stats: Stats, batch_size: int,
                    epochs: int, hidden: Sequence[int] = (64, 64)) -> dict[str, Any]:
    """The same fit through a ``PyDataset`` whose ``__getitem__`` only slices the arrays."""
    from daskfeed.adapters import keras

    class InMemory(keras.utils.PyDataset):
        def __len__(self) -> int:
            return math.ceil(len(y) / batch_size)

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return x[i * batch_size : (i + 1) * batch_size], y[i * batch_size : (i + 1) * batch_size]

    with RSSSampler(interval=0.1) as rss:
        t0 = time.perf_counter()
        model = quest_mlp(*stats, hidden=hidden)
        clock = epoch_clock()
        model.fit(InMemory(), epochs=epochs, shuffle=False, verbose=0, callbacks=[clock])
    return {"rows": len(y), "epochs": epoch_records(clock, len(y), t0),
            "expected_steps": math.ceil(len(y) / batch_size), "peak_rss_bytes": rss.peak,
            "rss_at_start_bytes": rss.start,
            "note": "PyDataset slicing arrays already in memory: the Keras adapter's own cost"}


def _header(path: str) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return next(csv.reader(f))


def tf_dataset(files: Sequence[str], features: Sequence[str], label: str, batch_size: int,
               cache: str | None = None) -> Any:
    """The tf.data input pipeline as tf.data's guide writes it for CSV files.

    Parameters
    ----------
    files
        CSV files with a header line (skipped).
    features, label
        Columns of ``x`` (stacked float32) and ``y``.
    batch_size
        Rows per batch (batched before decoding: ``decode_csv`` runs vectorized).
    cache
        None: no cache; ``""``: ``.cache()`` in RAM; a path: ``.cache(path)`` on disk.

    Returns
    -------
    tf.data.Dataset
        Of ``(x, y)``.
    """
    import tensorflow as tf

    header = _header(files[0])
    missing = [c for c in [*features, label] if c not in header]
    if missing:
        raise ValueError(f"Expected columns {missing} in {files[0]}. Received: header {header}.")
    select = sorted(header.index(c) for c in [*features, label])
    at = {header[i]: k for k, i in enumerate(select)}
    defaults = [[0.0]] * len(select)  # every selected column float32, a blank is 0

    def parse(lines: Any) -> Any:
        cols = tf.io.decode_csv(lines, record_defaults=defaults, select_cols=select)
        return tf.stack([cols[at[c]] for c in features], axis=1), cols[at[label]]

    ds = tf.data.Dataset.list_files(list(files), shuffle=True, seed=0)
    ds = ds.interleave(lambda f: tf.data.TextLineDataset(f).skip(1), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if cache is not None:
        ds = ds.cache(cache)
    return ds.prefetch(tf.data.AUTOTUNE)


def count_rows(ds: Any) -> int:
    """Rows a ``(x, y)`` dataset delivers in one pass (outside any timing)."""
    import tensorflow as tf

    return int(ds.reduce(tf.constant(0, tf.int64),
                         lambda n, xy: n + tf.cast(tf.shape(xy[1])[0], tf.int64)).numpy())


def tf_data(files: Sequence[str], features: Sequence[str], label: str, batch_size: int, epochs: int,
            rows: int, stats: Stats, val: Val, cache: str | None) -> dict[str, Any]:
    """Fit from :func:`tf_dataset`; epoch 1 from the pipeline's construction.

    ``stats`` (the normalization) is given, not computed: a tf.data user would need a pass of
    ``Normalization.adapt`` for it, which is not counted (in tf.data's favour).
    """
    with RSSSampler(interval=0.1) as rss:
        t0 = time.perf_counter()
        ds = tf_dataset(files, features, label, batch_size, cache)
        model = quest_mlp(*stats)
        clock = epoch_clock()
        with warnings.catch_warnings():  # Keras: "Your input ran out of data" (unknown cardinality)
            warnings.filterwarnings("ignore", message=".*ran out of data.*")
            hist = model.fit(ds, epochs=epochs, shuffle=False, verbose=0, callbacks=[clock])
    how = {None: "no cache", "": ".cache() in RAM"}.get(cache, ".cache(filename) on disk")
    return {"rows": rows, "epochs": epoch_records(clock, rows, t0),
            "expected_steps": math.ceil(rows / batch_size), "cache": how,
            "peak_rss_bytes": rss.peak, "rss_at_start_bytes": rss.start,
            "note": "list_files → interleave(TextLineDataset.skip(1), AUTOTUNE) → batch → "
                    f"map(decode_csv, AUTOTUNE) → {how} → prefetch(AUTOTUNE); normalization "
                    "statistics given (no adapt pass counted)",
            **losses(model, hist, val, batch_size)}


@contextlib.contextmanager
def _default_sigterm() -> Iterator[None]:
    """Default SIGTERM handling while Keras forks its pool (it ends the workers with SIGTERM)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def old_recipe(files: Sequence[str], features: Sequence[str], label: str, epochs: int, rows: int,
               stats: Stats, val: Val, workers: int, batch_size: int,
               use_multiprocessing: bool = True) -> dict[str, Any]:
    """Fit from :class:`old_recipe.OldRecipe` with ``workers`` processes, ``fit(shuffle=True)``.

    Its batch size is the rows of a file (the files were split by hand to the batch size).
    """
    from old_recipe import OldRecipe

    with RSSSampler(interval=0.1) as rss:
        t0 = time.perf_counter()
        seq = OldRecipe(files, features, label, workers=workers, use_multiprocessing=use_multiprocessing,
                        max_queue_size=10)
        model = quest_mlp(*stats)
        clock = epoch_clock()
        with _default_sigterm():
            hist = model.fit(seq, epochs=epochs, shuffle=True, verbose=0, callbacks=[clock])
    mode = "processes" if use_multiprocessing else "threads"
    return {"rows": rows, "epochs": epoch_records(clock, rows, t0), "expected_steps": len(files),
            "workers": workers, "mode": mode, "peak_rss_bytes": rss.peak, "rss_at_start_bytes": rss.start,
            "note": f"PyDataset, one pandas read_csv per index ({len(files)} files of "
                    f"~{rows // len(files)} rows; bench batch size {batch_size}), workers={workers} "
                    f"{mode}, max_queue_size=10, fit(shuffle=True)",
            **losses(model, hist, val, batch_size)}
