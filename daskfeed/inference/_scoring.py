"""Scoring: what a run trained (``OUTPUT/model.keras`` + its manifest), applied to one block.

:class:`TrainedRun` reads an output directory; :func:`score_block` runs on a worker: it reads a
block with the training read options, encodes it with the training encoding and the training
statistics, and scores it with the model the worker loaded once, each input in the dtype the
feed gives it (float64 dates and wide numbers stay float64, as in training: :func:`apply_model`).
A value of a date or number column that is neither missing nor read is scored with the training
mean and counted (:class:`Unparsed`). ``daskfeed predict`` (:mod:`daskfeed.inference._predict`)
puts the blocks in order, writes them and says the count.
"""

from __future__ import annotations

import json
import os
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from daskfeed.core import DataError, DataNotFoundError, SchemaError, SettingError
from daskfeed.inference._runs import check_record
from daskfeed.manifest import Encoding, Manifest, encode_features
from daskfeed.reading import Block, FieldText, ReadOptions, iter_tables, named

if TYPE_CHECKING:
    from keras import Model

PREDICT_BATCH = 8192  # rows per model call on a worker


@dataclass(frozen=True)
class TrainedRun:
    """What a training run left in its output directory that scoring needs.

    Parameters
    ----------
    directory
        The run's ``--output`` directory.
    model_path
        Its ``model.keras`` (takes encoded inputs).
    stamp
        The model file's mtime in ns: workers cache the loaded model under (path, stamp).
    manifest
        The training manifest: read options, statistics, vocabularies, label task.
    features
        The model's feature columns, in input order.
    as_matrix
        The model takes one matrix of the features instead of a dict.
    """

    directory: str
    model_path: str
    stamp: int
    manifest: Manifest
    features: tuple[str, ...]
    as_matrix: bool

    @classmethod
    def open(cls, directory: str | os.PathLike[str],
             features: Sequence[str] | None = None) -> TrainedRun:
        """Read ``directory``'s model inputs and manifest (keras is not needed for this).

        Parameters
        ----------
        directory
            A ``daskfeed train --output`` directory.
        features
            The feature columns of a model that takes one matrix (``as_matrix``); a model
            over a dict of columns names them itself.

        Returns
        -------
        TrainedRun
            The run's model path and stamp, manifest and feature columns.

        Raises
        ------
        DataNotFoundError
            When ``model.keras`` or ``manifest.json`` is missing.
        ManifestMismatchError
            When they are not those the run's ``run.json`` ties together
            (:func:`~daskfeed.inference._runs.check_record`).
        SettingError
            For a matrix model without ``features``.
        SchemaError
            For features the manifest lacks.
        """
        directory = os.fspath(directory)
        model_path = os.path.join(directory, "model.keras")
        manifest_path = os.path.join(directory, "manifest.json")
        missing = [p for p in (model_path, manifest_path) if not os.path.isfile(p)]
        if missing:
            raise DataNotFoundError(
                f"Expected a trained run in {directory!r} (model.keras and manifest.json, as "
                f"'daskfeed train --output {directory}' writes them). Received: no "
                f"{' and no '.join(os.path.basename(p) for p in missing)}.\nHint: pass the "
                "directory given to --output when training (default daskfeed-out)."
            )
        check_record(directory)  # the manifest beside the model is the one it was trained with
        manifest = Manifest.from_json(manifest_path)
        names = _model_inputs(model_path)
        as_matrix = names is None
        if names is None:
            if not features:
                raise SettingError(
                    f"Expected the feature columns of {model_path}, a model taking one matrix "
                    "(as_matrix). Received: no features.\nHint: pass features=[...] in the "
                    "order the model was trained with."
                )
            names = list(features)
        unknown = [n for n in names if n not in manifest.columns]
        if unknown:
            raise SchemaError(
                f"Expected the model's inputs to be columns of the training manifest. Received: "
                f"{unknown}.\nHint: the manifest.json beside model.keras is from another run."
            )
        return cls(directory, model_path, os.stat(model_path).st_mtime_ns, manifest,
                   tuple(names), as_matrix)

    @property
    def encoding(self) -> Encoding:
        """The training encoding of the features (training statistics, no label needed).

        Returns
        -------
        Encoding
            How :func:`~daskfeed.manifest._encoding.encode_features` encodes the features.
        """
        return Encoding.from_manifest(self.manifest, list(self.features), self.as_matrix)

    @property
    def scorer(self) -> Scorer:
        """What a worker needs to score a block (small: no partitions list).

        Returns
        -------
        Scorer
            The model's path and stamp, the encoding and how the output reads.
        """
        named = getattr(self.manifest, "classes", None)
        return Scorer(self.model_path, self.stamp, self.encoding, self.manifest.task,
                      class_names(self.manifest), bool(named))


def _model_inputs(model_path: str) -> list[str] | None:
    """Feature names of a model over a dict of columns (read from the archive); None: a matrix."""
    try:
        with zipfile.ZipFile(model_path) as z:
            config = json.loads(z.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
        raise DataError(
            f"Cannot read {model_path} as a Keras model archive. Received: {err}.\nHint: "
            "train again; model.keras is written by 'daskfeed train'."
        ) from err
    layers = config.get("config", {}).get("input_layers")
    if isinstance(layers, dict):
        return list(layers)
    return None


def class_names(manifest: Manifest) -> tuple[str, ...] | None:
    """The label's class names (the manifest's, else the class ids as text); None: regression.

    Parameters
    ----------
    manifest
        The trained run's manifest.

    Returns
    -------
    tuple of str or None
        One name per class, in class id order; None for a regression.
    """
    if manifest.task == "regression":
        return None
    named = getattr(manifest, "classes", None)
    if named:
        return tuple(str(c) for c in named)
    count = 2 if manifest.task == "binary" else manifest.num_classes
    return tuple(str(i) for i in range(count))


def output_columns(manifest: Manifest) -> list[str]:
    """The prediction columns: ``prediction``, and ``probability_<class>`` for each class.

    Parameters
    ----------
    manifest
        The trained run's manifest.

    Returns
    -------
    list of str
        The column names, in output order.
    """
    names = class_names(manifest)
    return ["prediction", *(f"probability_{n}" for n in names or ())]


@dataclass(frozen=True)
class Scorer:
    """The model and the encoding of a trained run, and how its output reads.

    Parameters
    ----------
    model_path, stamp
        ``model.keras`` and its mtime in ns (workers cache the loaded model by both).
    encoding
        The training encoding of the features.
    task
        ``binary`` | ``multiclass`` | ``regression``.
    classes
        Class names (or ids as text) of a class label; None for regression.
    named
        The classes have names (a text label): ``prediction`` is the name, else the id.
    """

    model_path: str
    stamp: int
    encoding: Encoding
    task: str
    classes: tuple[str, ...] | None
    named: bool

    def outputs(self, raw: np.ndarray) -> dict[str, np.ndarray]:
        """The model's output rows as prediction columns (the most probable class).

        Parameters
        ----------
        raw
            What the model returned: ``(n, 1)`` (sigmoid or regression) or ``(n, K)``.

        Returns
        -------
        dict of str to numpy.ndarray
            ``prediction`` (the value, or the class name / id) and ``probability_<class>``.
        """
        rows = np.asarray(raw)
        rows = rows if rows.ndim == 2 else rows.reshape(-1, 1)
        if self.classes is None:
            return {"prediction": rows[:, 0]}
        probs = np.stack([1 - rows[:, 0], rows[:, 0]], axis=1) if self.task == "binary" else rows
        best = np.argmax(probs, axis=1)
        pred = np.asarray(self.classes, dtype=object)[best] if self.named else best.astype(np.int64)
        out = {"prediction": pred}
        out.update({f"probability_{n}": probs[:, j] for j, n in enumerate(self.classes)})
        return out

    def score(self, table: pa.Table, model: Model,
              unparsed: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Encode ``table``'s rows as training did and score them with ``model``.

        Parameters
        ----------
        table
            Rows as the reader parses them (a label column, if any, is ignored).
        model
            The Keras model at ``model_path``.
        unparsed
            Filled, when given, with the rows of each column whose value was neither missing
            nor read (scored with the training mean), as
            :func:`~daskfeed.manifest._encoding.encode_features` fills it.

        Returns
        -------
        dict of str to numpy.ndarray
            The prediction columns, one value per row, in row order.
        """
        if not table.num_rows:
            return self.outputs(np.zeros((0, len(self.classes or ()) if self.task == "multiclass"
                                          else 1), dtype=np.float32))
        x = encode_features(table, self.encoding, unparsed)
        return self.outputs(apply_model(model, x, table.num_rows))


def apply_model(model: Model, x: dict[str, np.ndarray] | np.ndarray, rows: int) -> np.ndarray:
    """``model`` on the encoded rows ``x``, each input in its own dtype, as training feeds it.

    ``model.predict`` would narrow float64 inputs to float32 first (Keras' array adapter casts
    every float array to floatx): a 2013 date, about 1.38e9 seconds, would move by up to 64 s,
    and a wide number column would lose its digits before the model's float64 normalization.
    ``predict_on_batch`` hands the arrays over as they are (the compiled predict step converts
    each to its input's dtype, as in training and in ``serving/``), ``PREDICT_BATCH`` rows at a
    time.

    Parameters
    ----------
    model
        The Keras model.
    x
        One array per input (by name), or one matrix, as
        :func:`~daskfeed.manifest._encoding.encode_features` gives them.
    rows
        The number of rows.

    Returns
    -------
    numpy.ndarray
        The model's outputs, one row per input row, in order.
    """
    parts = []
    for start in range(0, rows, PREDICT_BATCH):
        part = slice(start, start + PREDICT_BATCH)
        batch = {k: v[part] for k, v in x.items()} if isinstance(x, dict) else x[part]
        parts.append(np.asarray(model.predict_on_batch(batch)))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


# ------------------------------------------------------------------------------ workers
_MODELS: dict[tuple[str, int], Model] = {}
_MODELS_LOCK = threading.Lock()


def _model(path: str, stamp: int) -> Model:
    """The model at ``path``, loaded once per worker process (and again when the file changes)."""
    with _MODELS_LOCK:
        model = _MODELS.get((path, stamp))
        if model is None:
            # imported here, on the worker: predict's own process never loads TF
            from daskfeed.adapters import keras

            _MODELS.clear()
            model = _MODELS[(path, stamp)] = keras.saving.load_model(path, compile=False)
        return model


@dataclass(frozen=True)
class Unparsed:
    """The values of one column that were neither missing nor read, in one block or more.

    Parameters
    ----------
    count
        How many (each scored with the training mean, as a missing value is).
    first
        The first of them, as written (``repr``).
    where
        The block it is in (:meth:`~daskfeed.reading.Block.describe`).
    """

    count: int
    first: str
    where: str

    def plus(self, other: Unparsed | None) -> Unparsed:
        """The sum of both counts (``other``: a later block's), the first value kept."""
        return self if other is None else Unparsed(self.count + other.count, self.first, self.where)


def score_block(index: int, block: Block, options: ReadOptions, scorer: Scorer, keep: tuple[str, ...],
                schema: pa.Schema, as_text: bool = False) -> tuple[pa.Table, int, dict[str, Unparsed]]:
    """Score one block (on a worker): predictions in row order, rejected lines, unparsed values.

    Parameters
    ----------
    index, block
        The block's index in the source and the block.
    options
        How the source is read.
    scorer
        The trained run's scorer (:attr:`TrainedRun.scorer`).
    keep
        Input columns passed through to the output (``--keep``).
    schema
        The output's schema (:func:`output_schema`).
    as_text
        Pass the kept columns through as their fields' text, as written (a CSV output: see
        :class:`~daskfeed.reading.FieldText`); else as read, in the training data's types.

    Returns
    -------
    tuple
        The block's output table (``schema``, row order), the number of lines rejected, and
        by column the values neither missing nor read (a date column's ``yesterday``, a number
        column's ``12x``), which got the training mean.

    Raises
    ------
    SchemaError
        When the block lacks a column the model or ``keep`` needs.
    DataError
        When a kept column's values do not fit the training data's type.
    """
    model = _model(scorer.model_path, scorer.stamp)
    needed = (*(c.name for c in scorer.encoding.columns), *keep)
    parts = []
    rejects: list[str] = []
    unparsed: dict[str, Unparsed] = {}
    text = FieldText(keep) if as_text and keep else None
    # a read that hangs: predict's timeout names it (the scoring between reads is not a read)
    for i, table in enumerate(named(iter_tables(block, options, rejects, text), block.describe)):
        _check_columns(table, needed, block)
        where: dict[str, np.ndarray] = {}
        cols = scorer.score(table, model, where)
        for name, rows in where.items():
            first = table.column(name)[int(np.flatnonzero(rows)[0])].as_py()
            found = Unparsed(int(rows.sum()), repr(first), block.describe())
            unparsed[name] = unparsed[name].plus(found) if name in unparsed else found
        if text is not None:  # the same rows, parsed from the same bytes
            arrays = [_as_written(text.tables[i].column(k), k, block) for k in keep]
        else:
            arrays = [_kept(table.column(k), schema.field(k).type, k, block) for k in keep]
        arrays += [pa.array(cols[name], type=schema.field(name).type) for name in cols]
        parts.append(pa.Table.from_arrays(arrays, schema=schema))
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    return table, len(rejects), unparsed


def _check_columns(table: pa.Table, needed: Sequence[str], block: Block) -> None:
    missing = [n for n in needed if n not in table.column_names]
    if missing:
        raise SchemaError(
            f"Expected the columns the model was trained on in {block.describe()}. Received: no "
            f"column {', '.join(map(repr, missing))} (columns: {table.column_names[:20]}).\n"
            "Hint: give the data the training header; the label may be left out."
        )


def _kept(col: pa.ChunkedArray, target: pa.DataType, name: str, block: Block) -> pa.ChunkedArray:
    """A passed-through column in the output's type (the same in every block)."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    try:
        return col.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(
            f"Expected column {name!r} (--keep) to hold {target} values as in the training data. "
            f"Received: {col.type} in {block.describe()} ({err}).\nHint: keep it as text with "
            f"--dtype {name}=string when training, or leave it out of --keep."
        ) from err


def _as_written(col: pa.ChunkedArray, name: str, block: Block) -> pa.ChunkedArray:
    """A passed-through column as text: a CSV field's own, or a Parquet column's values as text."""
    if pa.types.is_string(col.type):
        return col
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    try:
        return col.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(
            f"Expected column {name!r} (--keep) to be writable as CSV text. Received: {col.type} "
            f"in {block.describe()} ({err}).\nHint: write the predictions as Parquet "
            "(--output predictions.parquet), or leave the column out of --keep."
        ) from err


def output_schema(run: TrainedRun, keep: Sequence[str], as_text: bool = False) -> pa.Schema:
    """The output's columns: the kept ones, then the predictions.

    A kept column is its fields' text with ``as_text`` (a CSV output), else as read, in the
    training data's types: numbers as int64 or float64, dates as the instants read (UTC; a time
    without a zone is taken as UTC, as training reads it), text as text.

    Parameters
    ----------
    run
        The trained run.
    keep
        Input columns passed through to the output (``--keep``).
    as_text
        The kept columns as text.

    Returns
    -------
    pyarrow.Schema
        The kept columns, then ``prediction`` and the class probabilities.
    """
    fields = []
    for k in keep:
        col = run.manifest.columns.get(k)
        if as_text or col is None or col.kind == "categorical" or col.kind == "empty":
            t = pa.string()
        elif col.kind == "datetime":
            t = pa.timestamp("s", tz="UTC")
        else:
            t = pa.int64() if col.integer else pa.float64()
        fields.append(pa.field(k, t))
    names = class_names(run.manifest)
    named = getattr(run.manifest, "classes", None)
    if names is None:
        fields.append(pa.field("prediction", pa.float32()))
    else:
        fields.append(pa.field("prediction", pa.string() if named else pa.int64()))
        fields += [pa.field(f"probability_{n}", pa.float32()) for n in names]
    return pa.schema(fields)
