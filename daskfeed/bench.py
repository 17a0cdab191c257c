"""Benchmark: daskfeed against in-memory ``fit``, tf.data and the old recipe, in ONE run.

The performance protocol of DESIGN.md: same data, same model (the quest-log MLP: Dense 64-64
relu + sigmoid on numeric columns), same batch size, same machine, and ratios against
references measured in the same run:

(a) ``in_memory``  pyarrow reads every CSV into numpy, then ``model.fit`` (the ceiling);
(b) ``tf_data``    ``tf.data.experimental.CsvDataset`` with a hand-written schema, interleaved
                   over the files, batched, ``prefetch(AUTOTUNE)``;
(c) ``old_recipe`` a ``keras.utils.PyDataset`` reading one pandas CSV per index, two worker
                   processes (threads where multiprocessing fails);
(d) ``daskfeed``   ``DaskSequence(as_matrix=True)`` on a LocalCluster inside ``memory_limit``;
                   epoch 1 timed from cluster start (scan and reading included), then epoch 2;
(e) ``feed_only``  every batch of a ``DaskSequence`` epoch with no model, against
                   ``pyarrow_parse`` (pyarrow parsing every file, all columns).

Each fit runs ``epochs`` (≥ 2) epochs: epoch 1 includes building the model's train function;
the steady state of a method is its fastest later epoch (the same rule for every method: these
shared machines stall at random), the in-memory one is the ceiling. Every epoch is in the JSON.
The order is fixed (parse reference, a, b, c, d, e) after one
warm-up fit that pays TensorFlow's start-up costs. Used by ``daskfeed bench`` / ``make bench``.
keras and TensorFlow are imported only when the benchmark runs.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import json
import math
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_FEATURES", "TARGETS", "format_table", "resolve_files", "run_bench", "run_demo_bench"]

# the demo's numeric columns without missing values (gear_score and gold_spent have blanks,
# which each method would fill differently)
DEFAULT_FEATURES = ("level", "party_size", "attempt", "duration_s", "deaths", "hour")
ORDER = ("pyarrow_parse", "in_memory", "tf_data", "old_recipe", "daskfeed", "feed_only")
# issue 3's targets: (key, description, threshold, higher is better)
TARGETS = (
    ("epoch1_vs_load_fit", "daskfeed epoch 1 cold (scan + epoch) ≥ 0.85× in-memory load + fit", 0.85, True),
    ("epoch2_vs_fit", "daskfeed steady epoch ≥ 0.95× in-memory fit (steady)", 0.95, True),
    ("feed_vs_parse", "feed-only steady epoch ≥ 0.8× pyarrow parse", 0.8, True),
    ("data_wait", "daskfeed data_wait_fraction at steady state < 5 %", 0.05, False),
)


def resolve_files(data: str | Sequence[str]) -> list[str]:
    """Local CSV files of ``data`` (paths, directories, globs), sorted, deduplicated."""
    from daskfeed.exceptions import DataNotFoundError

    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    files: list[str] = []
    for item in items:
        item = os.fspath(item)
        if os.path.isdir(item):
            files += glob.glob(os.path.join(item, "**", "*.csv"), recursive=True)
        elif glob.has_magic(item):
            files += glob.glob(item, recursive=True)
        elif os.path.isfile(item):
            files.append(item)
    files = sorted(set(files))
    if not files:
        raise DataNotFoundError(
            f"Expected local CSV files for the benchmark. Received: {items!r}, which match none.\n"
            "Hint: give a directory, a glob such as 'data/**/*.csv', or use --rows N to generate "
            "demo data."
        )
    return files


# -- helpers ------------------------------------------------------------------------------
def _header(path: str) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return next(csv.reader(f))


def _load_numpy(files: list[str], features: Sequence[str], label: str) -> tuple[np.ndarray, np.ndarray]:
    """Every file's ``features`` and ``label`` as float32 numpy (pyarrow, files read in threads).

    Blanks become 0 (as in the tf.data schema's record defaults).
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    cols = [*features, label]
    opts = pacsv.ConvertOptions(column_types={c: pa.float32() for c in cols}, include_columns=cols)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        tables = list(pool.map(lambda f: pacsv.read_csv(f, convert_options=opts), files))
    table = pa.concat_tables(tables)
    x = np.empty((table.num_rows, len(features)), dtype=np.float32)
    for j, c in enumerate(features):
        x[:, j] = pc.fill_null(table[c], 0.0).to_numpy()
    y = pc.fill_null(table[label], 0.0).to_numpy().astype(np.float32)
    return x, y


def quest_mlp(mean: Sequence[float], variance: Sequence[float], *, hidden: Sequence[int] = (64, 64),
              learning_rate: float = 1e-3, seed: int = 0) -> Any:
    """The benchmark's model: Normalization → Dense 64-64 relu → sigmoid; Adam, binary CE.

    The same architecture as ``daskfeed.default_model(..., as_matrix=True)`` for a 0/1 label;
    seeded so every method starts from the same weights.
    """
    from daskfeed._keras import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(len(mean),), name="features", dtype="float32")
    h = keras.layers.Normalization(mean=np.asarray(mean, "float32"),
                                   variance=np.maximum(np.asarray(variance, "float32"), 1e-12),
                                   name="normalize")(inputs)
    for i, units in enumerate(hidden):
        h = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(h)
    out = keras.layers.Dense(1, activation="sigmoid", name="output")(h)
    model = keras.Model(inputs, out, name="quest_mlp")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model


def _clock(sequence: Any = None, counter: Callable[[], tuple[int, int]] | None = None) -> Any:
    """A callback recording each epoch's begin/end (perf_counter) and optimizer steps.

    Given a ``DaskSequence``, also a copy of its stats at each epoch's end; given ``counter``
    (returning total batches and rows delivered so far), the batches and rows of each epoch.
    """
    from daskfeed._keras import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.begin: list[float] = []
            self.end: list[float] = []
            self.steps: list[int] = []
            self.stats: list[dict[str, Any]] = []
            self.counted: list[tuple[int, int]] = []
            self._it0 = 0
            self._c0 = (0, 0)

        def _iterations(self) -> int:
            return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._it0 = self._iterations()
            if counter is not None:
                self._c0 = counter()
            self.begin.append(time.perf_counter())

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.end.append(time.perf_counter())
            self.steps.append(self._iterations() - self._it0)
            if sequence is not None:
                self.stats.append(dict(sequence.last_epoch_stats))
            if counter is not None:
                b, r = counter()
                self.counted.append((b - self._c0[0], r - self._c0[1]))

    return EpochClock()


def _epochs(clock: Any, rows: int, fit_start: float) -> list[dict[str, Any]]:
    """Per epoch: seconds (epoch 1 from the ``fit`` call: it builds the train function), rows/s."""
    out = []
    for e, (b, t) in enumerate(zip(clock.begin, clock.end, strict=True)):
        s = t - (fit_start if e == 0 else b)
        out.append({"epoch": e + 1, "seconds": round(s, 4), "rows": rows,
                    "rows_per_s": round(rows / s, 1), "steps": clock.steps[e]})
    return out


def _losses(model: Any, history: Any, val: tuple[np.ndarray, np.ndarray] | None,
            batch_size: int) -> dict[str, float | None]:
    train_loss = float(history.history["loss"][-1])
    val_loss = None
    if val is not None:
        val_loss = float(model.evaluate(val[0], val[1], batch_size=batch_size, verbose=0,
                                        return_dict=True)["loss"])
    return {"train_loss": round(train_loss, 5), "val_loss": None if val_loss is None else round(val_loss, 5)}


_OLD_RECIPE: Any = None


def _old_recipe_class() -> Any:
    """``OldRecipe(keras.utils.PyDataset)``: one pandas CSV per index (built on first use)."""
    global _OLD_RECIPE
    if _OLD_RECIPE is None:
        from daskfeed._keras import keras

        class OldRecipe(keras.utils.PyDataset):
            """The recipe daskfeed replaces: batch = one hand-split file read with pandas."""

            def __init__(self, files: list[str], features: Sequence[str], label: str,
                         **kwargs: Any) -> None:
                super().__init__(**kwargs)
                self.files, self.features, self.label = list(files), list(features), label

            def __len__(self) -> int:
                return len(self.files)

            def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
                import pandas as pd

                df = pd.read_csv(self.files[i], usecols=[*self.features, self.label])
                x = df[self.features].fillna(0).to_numpy(np.float32)
                return x, df[self.label].fillna(0).to_numpy(np.float32)

        OldRecipe.__module__ = __name__
        OldRecipe.__qualname__ = "OldRecipe"
        _OLD_RECIPE = OldRecipe
    return _OLD_RECIPE


def __getattr__(name: str) -> Any:
    if name == "OldRecipe":  # lets pickle find the class in a worker process
        return _old_recipe_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tf_dataset(files: list[str], features: Sequence[str], label: str, batch_size: int,
                counters: Any = None) -> Any:
    """tf.data: CsvDataset with a hand-written schema, files shuffled and interleaved.

    ``counters``: two int64 ``tf.Variable`` counting the batches and rows the pipeline delivers.
    """
    import tensorflow as tf

    header = _header(files[0])
    missing = [c for c in [*features, label] if c not in header]
    if missing:
        from daskfeed.exceptions import SchemaError

        raise SchemaError(f"Expected columns {missing} in {files[0]}. Received: header {header}.")
    wanted = sorted(header.index(c) for c in [*features, label])
    position = {header[i]: k for k, i in enumerate(wanted)}
    defaults = [tf.constant(0.0, tf.float32)] * len(wanted)  # the hand-written schema

    def read(path: Any) -> Any:
        return tf.data.experimental.CsvDataset(path, defaults, header=True, select_cols=wanted)

    def to_xy(*cols: Any) -> Any:
        y = cols[position[label]]
        if counters is not None:
            counters[0].assign_add(1)
            counters[1].assign_add(tf.cast(tf.shape(y)[0], tf.int64))
        return tf.stack([cols[position[c]] for c in features], axis=1), y

    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=0)
    ds = ds.interleave(read, cycle_length=tf.data.AUTOTUNE, num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=False)
    return ds.batch(batch_size).map(to_xy, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _cache_kwargs(workdir: str, tag: str) -> dict[str, Any]:
    """A fresh cache directory per sequence where DaskSequence has a ``cache`` option.

    So epoch 1 of every measured sequence is cold (raw CSV) even when an earlier one
    left a cache of the same data.
    """
    import inspect

    from daskfeed.sequence import DaskSequence

    if "cache" in inspect.signature(DaskSequence.__init__).parameters:
        return {"cache": os.path.join(workdir, f"cache-{tag}")}
    return {}


def _cache_note(stats: dict[str, Any]) -> str | None:
    """What the sequence's epoch stats say about its cache, if anything."""
    found = {k: v for k, v in stats.items() if "cache" in k}
    return ", ".join(f"{k}={v}" for k, v in found.items()) if found else None


# -- the methods --------------------------------------------------------------------------
def _bench_pyarrow(files: list[str]) -> dict[str, Any]:
    import pyarrow.csv as pacsv
    import pyarrow.dataset as pads

    rates: dict[str, float] = {}
    rows = 0
    for _ in range(2):  # the first pass also warms the page cache for everyone after
        t0 = time.perf_counter()
        rows = pads.dataset(files, format="csv").to_table().num_rows
        rates["dataset_threads"] = max(rates.get("dataset_threads", 0.0), rows / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        n = sum(pacsv.read_csv(f).num_rows for f in files)
        rates["read_csv_per_file"] = max(rates.get("read_csv_per_file", 0.0), n / (time.perf_counter() - t0))
    best = max(rates, key=lambda k: rates[k])
    return {"rows": rows, "rows_per_s": round(rates[best], 1), "reference": best,
            "variants_rows_per_s": {k: round(v, 1) for k, v in rates.items()},
            "note": "all columns parsed, best of 2 passes; the faster variant is the reference"}


def _bench_in_memory(files: list[str], features: Sequence[str], label: str, batch_size: int,
                     epochs: int, val: Any
                     ) -> tuple[dict[str, Any], tuple[list[float], list[float]], dict[str, Any]]:
    t0 = time.perf_counter()
    x, y = _load_numpy(files, features, label)
    mean, var = x.mean(axis=0).tolist(), x.var(axis=0).tolist()
    load_s = time.perf_counter() - t0
    model = quest_mlp(mean, var)
    clock = _clock()
    t_fit = time.perf_counter()
    hist = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0,
                     callbacks=[clock])
    rows = len(y)
    rec = {"rows": rows, "load_seconds": round(load_s, 4), "epochs": _epochs(clock, rows, t_fit),
           "expected_steps": math.ceil(rows / batch_size),
           "load_fit_epoch1_rows_per_s": round(rows / (clock.end[0] - t0), 1),
           **_losses(model, hist, val, batch_size)}
    return rec, (mean, var), _bench_pydataset_floor(x, y, (mean, var), batch_size, epochs)


def _bench_pydataset_floor(x: np.ndarray, y: np.ndarray, stats: tuple[list[float], list[float]],
                           batch_size: int, epochs: int) -> dict[str, Any]:
    """The same fit through a ``PyDataset`` whose ``__getitem__`` only slices arrays in memory.

    What Keras' PyDataset adapter itself costs (``tf.data.Dataset.from_generator``, one Python
    call and one tensor conversion per batch): no PyDataset, daskfeed's included, can be faster.
    """
    from daskfeed._keras import keras

    class InMemory(keras.utils.PyDataset):
        def __len__(self) -> int:
            return math.ceil(len(y) / batch_size)

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return x[i * batch_size : (i + 1) * batch_size], y[i * batch_size : (i + 1) * batch_size]

    model = quest_mlp(*stats)
    clock = _clock()
    t_fit = time.perf_counter()
    model.fit(InMemory(), epochs=epochs, shuffle=False, verbose=0, callbacks=[clock])
    return {"rows": len(y), "epochs": _epochs(clock, len(y), t_fit),
            "note": "PyDataset slicing arrays already in memory: the Keras adapter's own cost"}


def _bench_tf_data(files: list[str], features: Sequence[str], label: str, batch_size: int, epochs: int,
                   rows: int, stats: tuple[list[float], list[float]], val: Any) -> dict[str, Any]:
    import tensorflow as tf

    counters = (tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64))
    t0 = time.perf_counter()
    ds = _tf_dataset(files, features, label, batch_size, counters)
    model = quest_mlp(*stats)
    clock = _clock(counter=lambda: (int(counters[0].numpy()), int(counters[1].numpy())))
    with warnings.catch_warnings():  # Keras: "Your input ran out of data" (unknown cardinality)
        warnings.filterwarnings("ignore", message=".*ran out of data.*")
        hist = model.fit(ds, epochs=epochs, shuffle=False, verbose=0, callbacks=[clock])
    eps = _epochs(clock, rows, t0)
    for ep, (batches, counted) in zip(eps, clock.counted, strict=True):
        # Keras bumps optimizer.iterations once more on the step that finds the dataset empty
        ep["optimizer_steps"], ep["steps"], ep["rows"] = ep["steps"], batches, counted
        ep["rows_per_s"] = round(counted / ep["seconds"], 1)
    return {"rows": rows, "epochs": eps,
            "expected_steps": math.ceil(rows / batch_size),
            "note": "CsvDataset, float32 record_defaults, files shuffled + interleaved (AUTOTUNE), "
                    "batch, map(stack), prefetch(AUTOTUNE)",
            **_losses(model, hist, val, batch_size)}


@contextlib.contextmanager
def _default_sigterm() -> Iterator[None]:
    """Default SIGTERM handling while the old recipe forks its pool.

    Keras ends its pool workers with SIGTERM; a Python handler inherited from the CLI would
    make each of them print a traceback. (No cluster is running at this point.)
    """
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


def _bench_old_recipe(files: list[str], features: Sequence[str], label: str, batch_size: int,
                      epochs: int, rows: int, stats: tuple[list[float], list[float]], val: Any,
                      threads: bool) -> dict[str, Any]:
    OldRecipe = _old_recipe_class()
    modes = ["threads"] if threads else ["processes", "threads"]
    error = None
    for mode in modes:
        seq = OldRecipe(files, features, label, workers=2, use_multiprocessing=mode == "processes",
                        max_queue_size=10)
        model = quest_mlp(*stats)
        clock = _clock()
        t0 = time.perf_counter()
        try:
            with _default_sigterm():
                hist = model.fit(seq, epochs=epochs, shuffle=True, verbose=0, callbacks=[clock])
        except Exception as err:  # multiprocessing + TF may break: fall back to threads
            error = f"{type(err).__name__}: {err}"
            continue
        return {"rows": rows, "epochs": _epochs(clock, rows, t0), "expected_steps": len(files),
                "mode": mode, "workers": 2, "multiprocessing_error": error,
                "note": f"PyDataset, one pandas read_csv per index ({len(files)} files, "
                        f"~{rows // len(files)} rows each), workers=2, {mode}, fit(shuffle=True)",
                **_losses(model, hist, val, batch_size)}
    raise RuntimeError(f"The old recipe failed in every mode: {error}")


def _bench_daskfeed(data: Any, features: Sequence[str], label: str, batch_size: int, epochs: int,
                    memory_limit: str | int, nworkers: int | None, val: Any, workdir: str,
                    echo: Callable[[str], None]) -> tuple[dict[str, Any], Any, Any]:
    from daskfeed.cluster import Budget, close_client, start_local_cluster
    from daskfeed.model import EpochTelemetry
    from daskfeed.sequence import DaskSequence
    from daskfeed.train import RSSSampler

    rss = RSSSampler(interval=0.1).__enter__()
    trainer_rss_before = rss.sample()
    t0 = time.perf_counter()
    budget = Budget.split(memory_limit, nworkers=nworkers)
    client = start_local_cluster(budget, dashboard_address="")
    try:
        t_cluster = time.perf_counter()
        seq = DaskSequence(data, label=label, features=list(features), as_matrix=True,
                           batch_size=batch_size, client=client, seed=0,
                           window_bytes=budget.window_bytes, blocksize=budget.blocksize,
                           prefetch_bytes=budget.prefetch * 2 // 3, **_cache_kwargs(workdir, "fit"))
        t_scan = time.perf_counter()
        m = seq.manifest
        model = quest_mlp([m.columns[c].mean for c in seq.features], [m.columns[c].var for c in seq.features])
        telemetry = EpochTelemetry(seq, rss)
        clock = _clock(seq)
        t_fit = time.perf_counter()
        hist = model.fit(seq, epochs=epochs, shuffle=False, verbose=0, callbacks=[telemetry, clock])
        seq.close()
        peak = rss.overall_peak
    except BaseException:
        rss.__exit__(None, None, None)
        close_client(client)
        raise
    rows = m.rows
    eps = _epochs(clock, rows, t_fit)
    for ep, tel, stats in zip(eps, telemetry.epochs, clock.stats, strict=False):
        ep["rows"] = tel["rows"]  # rows the sequence actually served
        ep["rows_per_s"] = round(tel["rows"] / ep["seconds"], 1)
        ep["data_wait_fraction"] = tel["data_wait_fraction"]
        ep["data_wait_seconds"] = tel["data_wait_seconds"]
        ep["peak_rss_bytes"] = tel.get("peak_rss_bytes")
        ep["windows_computed"] = tel.get("windows_computed")
        ep["cache"] = _cache_note(stats)
        ep["sequence_stats"] = stats
    cold_s = clock.end[0] - t0
    rec = {"rows": rows, "epochs": eps, "expected_steps": math.ceil(rows / batch_size),
           "epoch1_cold_seconds": round(cold_s, 4),
           "epoch1_cold_rows_per_s": round(rows / cold_s, 1),
           # the figure: from reading the files to the end of epoch 1 (scan + epoch)
           "epoch1_from_files_rows_per_s": round(rows / (clock.end[0] - t_cluster), 1),
           "cluster_start_seconds": round(t_cluster - t0, 4),
           "scan_seconds": round(t_scan - t_cluster, 4),
           "windows": len(seq.plan.windows), "window_rows": seq.window_rows,
           "cache_status": getattr(seq, "cache_status", None),
           "budget": {**budget.__dict__, "text": str(memory_limit)},
           "trainer_rss_before_bytes": trainer_rss_before, "peak_rss_bytes": peak,
           **_losses(model, hist, val, batch_size)}
    echo(f"  daskfeed budget: {budget.describe(str(memory_limit))}")
    return rec, client, rss


def _bench_feed_only(data: Any, features: Sequence[str], label: str, batch_size: int, epochs: int,
                     client: Any, budget: dict[str, Any], workdir: str) -> dict[str, Any]:
    from daskfeed.sequence import DaskSequence

    t0 = time.perf_counter()
    seq = DaskSequence(data, label=label, features=list(features), as_matrix=True,
                       batch_size=batch_size, client=client, seed=0,
                       window_bytes=budget["window_bytes"], blocksize=budget["blocksize"],
                       prefetch_bytes=budget["prefetch"] * 2 // 3, **_cache_kwargs(workdir, "feed"))
    scan_s = time.perf_counter() - t0
    cache_status = getattr(seq, "cache_status", None)
    eps = []
    try:
        for e in range(epochs):
            t = time.perf_counter()
            rows = 0
            for i in range(len(seq)):
                _, y = seq[i]
                rows += len(y)
            s = time.perf_counter() - t
            stats = seq.epoch_stats()
            eps.append({"epoch": e + 1, "seconds": round(s, 4), "rows": rows,
                        "rows_per_s": round(rows / s, 1), "steps": len(seq),
                        "data_wait_seconds": round(stats.get("wait_seconds", 0.0), 4),
                        "cache": _cache_note(stats)})
            if e + 1 < epochs:
                seq.on_epoch_end()
    finally:
        seq.close()
    rows = eps[0]["rows"]
    return {"rows": rows, "epochs": eps, "expected_steps": math.ceil(rows / batch_size),
            "scan_seconds": round(scan_s, 4), "cache_status": cache_status,
            "epoch1_cold_incl_scan_rows_per_s": round(rows / (scan_s + eps[0]["seconds"]), 1)}


def _warm_up(batch_size: int) -> float:
    """One tiny fit so TensorFlow's start-up costs land on no method."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * batch_size, len(DEFAULT_FEATURES))).astype(np.float32)
    y = (rng.random(len(x)) < 0.5).astype(np.float32)
    model = quest_mlp([0.0] * x.shape[1], [1.0] * x.shape[1])
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    return time.perf_counter() - t0


# -- the run --------------------------------------------------------------------------------
def run_bench(
    data: str | Sequence[str],
    *,
    validation: str | Sequence[str] | None = None,
    label: str = "cleared",
    features: Sequence[str] = DEFAULT_FEATURES,
    batch_size: int = 1024,
    epochs: int = 3,
    memory_limit: str | int = "4GB",
    nworkers: int | None = None,
    old_recipe_threads: bool = False,
    workdir: str | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every method on the same data and model; return the results (see :func:`format_table`).

    Parameters
    ----------
    data, validation
        Local CSV files: paths, directories or globs. ``validation`` (optional) gives each
        method's validation loss (evaluated outside the timed part).
    features, label
        Numeric feature columns of the model and its 0/1 label.
    epochs
        Epochs per fit (≥ 2): epoch 1 is the cold one, epoch 2 the steady state.
    memory_limit, nworkers
        daskfeed's budget for the whole process tree and its local workers.
    old_recipe_threads
        Run the old recipe's two workers as threads instead of processes.
    workdir
        Scratch directory (e.g. daskfeed caches); default a temporary one, removed after.
    """
    import shutil

    if epochs < 2:
        raise ValueError(f"Expected epochs >= 2 (epoch 1 cold, epoch 2 steady). Received: {epochs}.")
    files = resolve_files(data)
    features = list(features)
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="daskfeed-bench-")
    daskfeed_data: Any = data if isinstance(data, (str, os.PathLike)) else list(data)
    results: dict[str, Any] = {}
    t_all = time.perf_counter()
    client = rss = None
    try:
        echo(f"bench: {len(files)} files, label {label!r}, features {features}, batch {batch_size}, "
             f"{epochs} epochs; order: {', '.join(ORDER)} (fixed)")
        warm = _warm_up(batch_size)
        echo(f"  TensorFlow warm-up fit: {warm:.1f}s (not counted)")
        val = _load_numpy(resolve_files(validation), features, label) if validation else None

        results["pyarrow_parse"] = _bench_pyarrow(files)
        echo(f"  pyarrow parse: {results['pyarrow_parse']['rows_per_s']:,.0f} rows/s")
        results["in_memory"], stats, results["pydataset_floor"] = _bench_in_memory(
            files, features, label, batch_size, epochs, val)
        rows = results["in_memory"]["rows"]
        echo(f"  in-memory: load {results['in_memory']['load_seconds']:.2f}s, fit "
             f"{results['in_memory']['epochs'][1]['rows_per_s']:,.0f} rows/s; through a PyDataset "
             f"{results['pydataset_floor']['epochs'][1]['rows_per_s']:,.0f} rows/s")
        results["tf_data"] = _bench_tf_data(files, features, label, batch_size, epochs, rows, stats, val)
        echo(f"  tf.data: {results['tf_data']['epochs'][1]['rows_per_s']:,.0f} rows/s")
        results["old_recipe"] = _bench_old_recipe(files, features, label, batch_size, epochs, rows,
                                                  stats, val, old_recipe_threads)
        echo(f"  old recipe ({results['old_recipe']['mode']}): "
             f"{results['old_recipe']['epochs'][1]['rows_per_s']:,.0f} rows/s")
        results["daskfeed"], client, rss = _bench_daskfeed(daskfeed_data, features, label, batch_size,
                                                          epochs, memory_limit, nworkers, val, workdir,
                                                          echo)
        echo(f"  daskfeed: epoch 1 cold {results['daskfeed']['epoch1_cold_rows_per_s']:,.0f} rows/s, "
             f"epoch 2 {results['daskfeed']['epochs'][1]['rows_per_s']:,.0f} rows/s")
        results["feed_only"] = _bench_feed_only(daskfeed_data, features, label, batch_size, epochs,
                                                client, results["daskfeed"]["budget"], workdir)
    finally:
        if rss is not None:
            rss.__exit__(None, None, None)
        if client is not None:
            from daskfeed.cluster import close_client

            close_client(client)
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return _summarize(results, files=files, features=features, label=label, batch_size=batch_size,
                      epochs=epochs, memory_limit=memory_limit, seconds=time.perf_counter() - t_all,
                      warm_up=warm)


def run_demo_bench(rows: int, *, data_dir: str = "bench-data", validate_rows: int | None = None,
                   echo: Callable[[str], None] = print, **kwargs: Any) -> dict[str, Any]:
    """Write ``rows`` rows of demo quest logs (1000-row files) under ``data_dir`` and bench them."""
    from daskfeed.demo import write_demo_data

    vrows = validate_rows if validate_rows is not None else min(50_000, max(1000, rows // 10))
    t0 = time.perf_counter()
    demo = write_demo_data(data_dir, rows=rows, validate_rows=vrows)
    echo(f"demo data: {rows:,} train + {vrows:,} validation rows in {os.path.abspath(data_dir)} "
         f"({time.perf_counter() - t0:.1f}s, reused when already there)")
    result = run_bench(demo.train_glob, validation=demo.validate_glob, echo=echo, **kwargs)
    result["config"]["generated_rows"] = rows
    return result


# -- summary ----------------------------------------------------------------------------------
def _summarize(results: dict[str, Any], **config: Any) -> dict[str, Any]:
    import psutil

    mem, tfd, old, dsk, feed, parse, floor = (results[k] for k in (
        "in_memory", "tf_data", "old_recipe", "daskfeed", "feed_only", "pyarrow_parse", "pydataset_floor"))
    def steady(m: dict[str, Any]) -> dict[str, Any]:
        """The fastest epoch after the first (shared machines stall at random; one rule for all)."""
        return max(m["epochs"][1:], key=lambda e: e["rows_per_s"])

    ceiling = steady(mem)["rows_per_s"]  # in-memory fit alone, steady state (as the targets)
    load_fit = mem["load_fit_epoch1_rows_per_s"]

    def row(method: str, rate: float, *, vs_load_fit: bool = False, vs_parse: bool = False,
            notes: str = "") -> dict[str, Any]:
        return {"method": method, "rows_per_s": round(rate, 1),
                "x_fit": round(rate / ceiling, 3),
                "x_load_fit": round(rate / load_fit, 3) if vs_load_fit else None,
                "x_parse": round(rate / parse["rows_per_s"], 3) if vs_parse else None,
                "notes": notes}

    def wait(e: dict[str, Any]) -> str:
        peak = e.get("peak_rss_bytes")
        return (f"wait {100 * e['data_wait_fraction']:.1f}%"
                + (f", peak RSS {peak / 1e9:.2f} GB" if peak else "")
                + (f", {e['cache']}" if e.get("cache") else ""))

    table = [
        row("in-memory load + fit, epoch 1", load_fit, vs_load_fit=True,
            notes=f"load {mem['load_seconds']:.2f}s (pyarrow → numpy)"),
        row("in-memory fit, epoch 1", mem["epochs"][0]["rows_per_s"], vs_load_fit=True),
        row(f"in-memory fit, steady (epoch {steady(mem)['epoch']}): ceiling", ceiling),
        row(f"in-memory PyDataset, steady (epoch {steady(floor)['epoch']})", steady(floor)["rows_per_s"],
            notes="Keras' PyDataset adapter: the fastest any PyDataset can be"),
        row("tf.data CsvDataset, epoch 1", tfd["epochs"][0]["rows_per_s"], vs_load_fit=True),
        row(f"tf.data CsvDataset, steady (epoch {steady(tfd)['epoch']})", steady(tfd)["rows_per_s"]),
        row(f"old recipe ({old['mode']}), epoch 1", old["epochs"][0]["rows_per_s"], vs_load_fit=True),
        row(f"old recipe ({old['mode']}), steady (epoch {steady(old)['epoch']})",
            steady(old)["rows_per_s"]),
        row("daskfeed epoch 1 cold (scan+epoch)", dsk["epoch1_from_files_rows_per_s"], vs_load_fit=True,
            notes=f"scan {dsk['scan_seconds']:.1f}s"
                  + (f", {_short(dsk['cache_status'])}" if dsk.get("cache_status") else "")),
        row("daskfeed epoch 1 cold incl. cluster start", dsk["epoch1_cold_rows_per_s"], vs_load_fit=True,
            notes=f"cluster {dsk['cluster_start_seconds']:.1f}s"),
        *[row(f"daskfeed epoch {e['epoch']}{' (steady)' if e is steady(dsk) else ''}", e["rows_per_s"],
              vs_load_fit=e["epoch"] == 1, notes=wait(e)) for e in dsk["epochs"]],
        row("feed-only epoch 1 cold incl. scan", feed["epoch1_cold_incl_scan_rows_per_s"], vs_parse=True,
            notes=f"scan {feed['scan_seconds']:.1f}s"),
        *[row(f"feed-only epoch {e['epoch']}", e["rows_per_s"], vs_parse=True,
              notes=e.get("cache") or "") for e in feed["epochs"]],
        *[row(f"pyarrow parse ({k})", v, vs_parse=True) for k, v in parse["variants_rows_per_s"].items()],
    ]
    values = {
        "epoch1_vs_load_fit": dsk["epoch1_from_files_rows_per_s"] / load_fit,
        "epoch2_vs_fit": steady(dsk)["rows_per_s"] / ceiling,
        "feed_vs_parse": steady(feed)["rows_per_s"] / parse["rows_per_s"],
        "data_wait": steady(dsk)["data_wait_fraction"],
    }
    targets = [{"target": key, "description": text, "value": round(values[key], 4), "threshold": thr,
                "pass": bool(values[key] >= thr if higher else values[key] < thr)}
               for key, text, thr, higher in TARGETS]
    fits = ("in_memory", "tf_data", "old_recipe", "daskfeed")
    ref_val = mem.get("val_loss")
    losses = {k: {"train_loss": results[k]["train_loss"], "val_loss": results[k]["val_loss"]} for k in fits}
    # sanity: every method's validation (else training) loss within 10 % of the in-memory fit's
    key = "val_loss" if ref_val is not None else "train_loss"
    ref = mem[key]
    similar = all(abs(results[k][key] - ref) <= 0.1 * ref + 1e-3 for k in fits)
    rows = {k: v["rows"] for k, v in results.items()}
    rows.update({f"{k}_epoch{e['epoch']}": e["rows"] for k in ("daskfeed", "feed_only")
                 for e in results[k]["epochs"]})
    import daskfeed

    config.update({
        "files": len(config["files"]), "rows": mem["rows"], "order": list(ORDER), "order_fixed": True,
        "seconds": round(config["seconds"], 1), "warm_up_seconds": round(config["warm_up"], 2),
        "memory_limit": str(config["memory_limit"]),
        "machine": {"cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
                    "platform": platform.platform(), "python": platform.python_version()},
        "versions": _versions(), "daskfeed": daskfeed.__version__,
    })
    config.pop("warm_up")
    return {"config": config, "methods": results, "table": table, "targets": targets,
            "losses": losses, "losses_similar": similar, "loss_compared": key,
            "rows_consistent": len(set(rows.values())) == 1, "rows_seen": rows}


def _short(cache_status: str) -> str:
    """The cache status without the (temporary) directory."""
    import re

    return re.sub(r"^cache: /\S+", "cache: on, fresh dir", cache_status)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("keras", "tensorflow", "tensorflow-cpu", "dask", "distributed", "pyarrow", "pandas", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def format_table(result: dict[str, Any]) -> str:
    """The result as a text table: rows/s and ratios, targets with pass/fail, losses."""
    cfg = result["config"]

    def ratio(v: float | None) -> str:
        return f"{v:.2f}×" if v is not None else ""

    lines = [f"{cfg['rows']:,} rows in {cfg['files']} files, batch {cfg['batch_size']}, "
             f"{cfg['epochs']} epochs per fit, {cfg['machine']['cpus']} CPUs, "
             f"memory limit {cfg['memory_limit']}; order (fixed): {', '.join(cfg['order'])}",
             "",
             f"{'method':<44} {'rows/s':>11} {'× fit':>7} {'× load+fit':>10} {'× parse':>8}  notes",
             "-" * 110]
    for r in result["table"]:
        lines.append(f"{r['method']:<44} {r['rows_per_s']:>11,.0f} {ratio(r['x_fit']):>7} "
                     f"{ratio(r['x_load_fit']):>10} {ratio(r['x_parse']):>8}  {r['notes']}")
    lines += ["", "targets (issue 3):"]
    for t in result["targets"]:
        shown = f"{100 * t['value']:.1f} %" if t["target"] == "data_wait" else f"{t['value']:.2f}×"
        lines.append(f"  [{'PASS' if t['pass'] else 'FAIL'}] {t['description']}: {shown}")
    lines += ["", f"sanity: losses after {cfg['epochs']} epochs (same model, same data):"]
    for k, v in result["losses"].items():
        val = f"{v['val_loss']:.4f}" if v["val_loss"] is not None else "—"
        lines.append(f"  {k:<12} train {v['train_loss']:.4f}  val {val}")
    lines.append(f"  {result['loss_compared'].replace('_', ' ')}es within 10 % of in-memory: "
                 f"{'yes' if result['losses_similar'] else 'NO'}; rows the same in every method: "
                 f"{'yes' if result['rows_consistent'] else 'NO ' + json.dumps(result['rows_seen'])}")
    old = result["methods"]["old_recipe"]
    if old.get("multiprocessing_error"):
        lines.append(f"  old recipe: multiprocessing failed ({old['multiprocessing_error']}); used threads")
    return "\n".join(lines)
