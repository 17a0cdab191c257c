"""What every benchmark method shares: the data's files, the model, the clocks.

The process tree's RSS is sampled by :class:`daskfeed.core._rss.RSSSampler`.

The model is the quest-log MLP (Normalization → Dense 64-64 relu → sigmoid, Adam, binary
cross-entropy) on the numeric columns of the demo data that have no missing values, seeded so
every method starts from the same weights. keras and TensorFlow are imported only when a
function needs them.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# the demo's numeric columns without missing values (gear_score and gold_spent have blanks,
# which each method would fill differently)
DEFAULT_FEATURES = ("level", "party_size", "attempt", "duration_s", "deaths", "hour")
LABEL = "cleared"


def resolve_files(data: str | Sequence[str]) -> list[str]:
    """Local CSV files of ``data`` (paths, directories or globs), sorted, without duplicates.

    Parameters
    ----------
    data
        A path, directory, glob (``**`` too) or a list of them.

    Returns
    -------
    list of str
        The files.

    Raises
    ------
    FileNotFoundError
        When nothing matches.
    """
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    files: list[str] = []
    for item in map(os.fspath, items):
        if os.path.isdir(item):
            files += glob.glob(os.path.join(item, "**", "*.csv"), recursive=True)
        elif glob.has_magic(item):
            files += glob.glob(item, recursive=True)
        elif os.path.isfile(item):
            files.append(item)
    files = sorted(set(files))
    if not files:
        raise FileNotFoundError(
            f"Expected local CSV files for the benchmark. Received: {items!r}, which match none.\n"
            "Hint: give a directory, a glob such as 'data/**/*.csv', or --rows N for demo data."
        )
    return files


def load_numpy(files: Sequence[str], features: Sequence[str], label: str,
               threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every file's ``features`` and ``label`` as float32 numpy, read by pyarrow in threads.

    Parameters
    ----------
    files
        CSV files.
    features, label
        Columns to read (blanks become 0).
    threads
        Reader threads (default: one per core).

    Returns
    -------
    x : numpy.ndarray
        ``(rows, len(features))`` float32.
    y : numpy.ndarray
        ``(rows,)`` float32.
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    cols = [*features, label]
    opts = pacsv.ConvertOptions(column_types={c: pa.float32() for c in cols}, include_columns=cols)
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
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

    Parameters
    ----------
    mean, variance
        Per-feature statistics of the Normalization layer.
    hidden
        Units of the hidden layers.
    learning_rate
        Adam's learning rate.
    seed
        Seed of the initial weights (the same for every method).

    Returns
    -------
    keras.Model
        Compiled.
    """
    from daskfeed.adapters import keras

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


def epoch_clock(on_end: Callable[[int], dict[str, Any]] | None = None) -> Any:
    """A Keras callback recording each epoch's begin and end (``perf_counter``) and its steps.

    Parameters
    ----------
    on_end
        Called with the epoch index at each epoch's end; what it returns is kept in ``extra``.

    Returns
    -------
    keras.callbacks.Callback
        With lists ``begin``, ``end``, ``steps`` (optimizer steps) and ``extra``.
    """
    from daskfeed.adapters import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.begin: list[float] = []
            self.end: list[float] = []
            self.steps: list[int] = []
            self.extra: list[dict[str, Any]] = []
            self._it0 = 0

        def _iterations(self) -> int:
            return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._it0 = self._iterations()
            self.begin.append(time.perf_counter())

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.end.append(time.perf_counter())
            self.steps.append(self._iterations() - self._it0)
            self.extra.append(on_end(epoch) if on_end else {})

    return EpochClock()


def epoch_records(clock: Any, rows: int, t_start: float) -> list[dict[str, Any]]:
    """Per epoch: seconds, rows/s, steps; epoch 1 also from ``t_start`` (the method's start).

    Parameters
    ----------
    clock
        An :func:`epoch_clock` after ``fit``.
    rows
        Rows per epoch.
    t_start
        ``perf_counter`` at the method's start (before reading anything).

    Returns
    -------
    list of dict
        ``epoch``, ``seconds`` (the epoch alone), ``rows_per_s``, ``steps`` and what the
        clock's ``on_end`` returned; epoch 1 also ``seconds_from_start`` and
        ``rows_per_s_from_start``.
    """
    out = []
    for e, (b, t) in enumerate(zip(clock.begin, clock.end, strict=True)):
        rec = {"epoch": e + 1, "seconds": round(t - b, 4), "rows": rows,
               "rows_per_s": round(rows / (t - b), 1), "steps": clock.steps[e], **clock.extra[e]}
        if e == 0:
            rec["seconds_from_start"] = round(t - t_start, 4)
            rec["rows_per_s_from_start"] = round(rows / (t - t_start), 1)
        out.append(rec)
    return out


def steady(epochs: Sequence[dict[str, Any]], key: str = "rows_per_s") -> float:
    """Median of ``key`` over the epochs after the first (the steady state).

    Parameters
    ----------
    epochs
        Per-epoch records, epoch 1 first; at least 4 (three steady epochs).
    key
        The figure.

    Returns
    -------
    float
    """
    later = [e[key] for e in epochs[1:] if e.get(key) is not None]
    if len(later) < 3:
        raise ValueError(f"Expected at least 3 steady epochs. Received: {len(later)}.")
    return float(statistics.median(later))


def losses(model: Any, history: Any, val: tuple[np.ndarray, np.ndarray] | None,
           batch_size: int) -> dict[str, float | None]:
    """The last epoch's training loss and, given validation arrays, the validation loss.

    Parameters
    ----------
    model, history
        The fitted model and what ``fit`` returned.
    val
        Validation ``(x, y)`` or None.
    batch_size
        Batch size of the evaluation.

    Returns
    -------
    dict
        ``train_loss`` and ``val_loss`` (None without ``val``).
    """
    val_loss = None
    if val is not None:
        val_loss = float(model.evaluate(val[0], val[1], batch_size=batch_size, verbose=0,
                                        return_dict=True)["loss"])
    return {"train_loss": round(float(history.history["loss"][-1]), 5),
            "val_loss": None if val_loss is None else round(val_loss, 5)}


def code_state() -> dict[str, Any]:
    """The commit measured, and the daskfeed files that differ from it (a shared work tree).

    Returns
    -------
    dict
        ``commit`` (None outside a git checkout) and ``uncommitted`` (paths under
        ``daskfeed/`` with changes not in that commit).
    """
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "daskfeed"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "uncommitted": []}
    return {"commit": commit, "uncommitted": [line[3:] for line in changed]}


def byte_compile() -> None:
    """Compile daskfeed's bytecode, as pip's install of a wheel does.

    A source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (these machines) compiles every
    module it imports at every process start: ~0.1 s in the trainer and in each worker, a cost
    an installed daskfeed does not have.
    """
    import compileall

    import daskfeed

    compileall.compile_dir(os.path.dirname(daskfeed.__file__), quiet=1)


def warm_up(batch_size: int, nfeatures: int) -> float:
    """One tiny fit so TensorFlow's one-time start-up costs land on no method; its seconds."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * batch_size, nfeatures)).astype(np.float32)
    y = (rng.random(len(x)) < 0.5).astype(np.float32)
    model = quest_mlp([0.0] * nfeatures, [1.0] * nfeatures)
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    return time.perf_counter() - t0


def write_results(out: str, stem: str, result: dict[str, Any], lines: Sequence[str]) -> str:
    """``<out>/<stem>.json`` (``result``) and ``.txt`` (``lines``, one a line); returns the path stem."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, stem)
    with open(path + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(path + ".txt", "w") as f:
        f.write("\n".join([*lines, ""]))
    return path
