"""Serving: ``OUTPUT/serving/``, a TensorFlow SavedModel that takes raw column values.

Its ``serve`` signature takes one 1-D tensor per feature column: text as ``tf.string`` (""
is missing), numbers as float64 (NaN is missing), dates as their ISO text (``2024-05-01`` or
``2024-05-01 13:45:00``). Inside, each column is encoded as the feed encodes it for training,
from the manifest's values (vocabulary codes with the missing and OOV codes, the mean for a
missing number, seconds since 1970 for a date), then the trained model runs. SavedModels are
TensorFlow's format: the export needs the TensorFlow backend.

Inputs. Called in Python (``tf.saved_model.load(...).serve({column: tensor})``) the function
takes a dict keyed by column name. The signatures (TF Serving, ``saved_model_cli``,
``.signatures["serve"](**inputs)``) name each input by its column too, where TensorFlow allows
the name: an ASCII letter, then letters, digits and ``_``, and no Python keyword (signature
inputs become Python parameters). Otherwise each other character becomes ``_``, a name that
does not start with a letter or is a keyword gets ``col_`` in front, and a name already taken (a
valid column name keeps its own) gets ``_2``, ``_3``, ... in column order: ``gold spent (€)`` →
``gold_spent____``, ``_rank`` → ``col__rank``, ``class`` → ``col_class``.
``serving/inputs.json`` lists each column with its input name, kind and dtype.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import shutil
from collections.abc import Callable, Sequence

import tensorflow as tf  # the SavedModel is TensorFlow's format whatever the Keras backend

from daskfeed.adapters import keras
from daskfeed.core import replace, temporary_name
from daskfeed.inference._scoring import Scorer, TrainedRun
from daskfeed.manifest import MISSING_CODE, ColumnCode

__all__ = ["export", "input_names"]

VALID_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # a signature input (and not a keyword)
ISO_DATE = r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?"


def input_names(columns: Sequence[str]) -> list[str]:
    """The signature's input name of each column (the rule is in the module docstring).

    Parameters
    ----------
    columns
        The feature columns, in order.

    Returns
    -------
    list of str
        One name per column, each valid for TensorFlow and all distinct.
    """
    def valid(name: str) -> bool:
        return bool(VALID_NAME.fullmatch(name)) and not keyword.iskeyword(name)

    taken = {c for c in columns if valid(c)}
    names = []
    for column in columns:
        if valid(column):
            names.append(column)
            continue
        name = re.sub(r"[^A-Za-z0-9_]", "_", column)
        name = name if valid(name) else f"col_{name}"
        base, n = name, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        names.append(name)
    return names


def _text_codes(raw: tf.Tensor, code: ColumnCode, lookup: keras.layers.StringLookup,
                markers: tf.Tensor) -> tf.Tensor:
    """Vocabulary codes as the feed makes them: 0 missing ("" or a null marker), 1 OOV, 2.."""
    missing = tf.equal(raw, "")
    if markers.shape[0]:
        missing |= tf.reduce_any(tf.equal(raw[:, None], markers[None, :]), axis=1)
    codes = tf.cast(lookup(raw), tf.int32)
    return tf.where(missing, tf.constant(MISSING_CODE, tf.int32), codes)


def _number(raw: tf.Tensor, code: ColumnCode) -> tf.Tensor:
    """A number in the column's dtype, the mean (whole-number columns: rounded) where missing."""
    fill = float(round(code.fill)) if code.dtype == "int64" else float(code.fill)
    value = tf.where(tf.math.is_nan(raw), tf.constant(fill, tf.float64), raw)
    return tf.cast(value, code.dtype)


def _days_from_civil(y: tf.Tensor, m: tf.Tensor, d: tf.Tensor) -> tf.Tensor:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y = y - tf.cast(m <= 2, tf.int64)
    era = tf.math.floordiv(y, 400)
    yoe = y - era * 400
    doy = (153 * (m + tf.where(m > 2, tf.constant(-3, tf.int64), 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _seconds(raw: tf.Tensor, code: ColumnCode) -> tf.Tensor:
    """Seconds since 1970 of ISO date text, as the reader's timestamps; the mean where missing."""
    text = tf.strings.strip(raw)
    valid = tf.strings.regex_full_match(text, ISO_DATE)
    text = tf.where(valid, text, "1970-01-01")

    def part(start: int, length: int) -> tf.Tensor:
        return tf.strings.to_number(tf.strings.substr(text, start, length), tf.int64)

    days = _days_from_civil(part(0, 4), part(5, 2), part(8, 2))
    clock = tf.strings.regex_replace(text, r"^.{10}[T ]?", "")  # no substr past the end
    clock = tf.where(tf.equal(clock, ""), "00:00", clock)
    secs = tf.strings.regex_replace(clock, r"^\d{2}:\d{2}:?", "")
    secs = tf.where(tf.equal(secs, ""), "0", secs)
    value = (tf.cast(days * 86400, tf.float64)
             + tf.strings.to_number(tf.strings.substr(clock, 0, 2), tf.float64) * 3600
             + tf.strings.to_number(tf.strings.substr(clock, 3, 2), tf.float64) * 60
             + tf.strings.to_number(secs, tf.float64))
    return tf.where(valid, value, tf.constant(float(code.fill), tf.float64))


class _Serve:
    """The ``serve`` function: raw columns → training encoding → model → named outputs."""

    def __init__(self, model: keras.Model, scorer: Scorer, na_values: list[str]) -> None:
        self.model = model
        self.scorer = scorer
        self.codes = scorer.encoding.columns
        self.inputs = input_names([c.name for c in self.codes])
        self.markers = tf.constant(list(na_values), tf.string)
        self.lookups = {
            c.name: keras.layers.StringLookup(vocabulary=list(c.vocabulary), mask_token="",
                                              num_oov_indices=1, name=f"lookup_{i}")
            for i, c in enumerate(scorer.encoding.columns) if c.kind == "categorical"}
        for layer in self.lookups.values():  # built before the export tracks it
            layer(tf.constant([""]))
        names = scorer.classes or ()
        self.class_names = tf.constant(list(names), tf.string)

    def specs(self) -> dict[str, tf.TensorSpec]:
        """The input signature by column: numbers as float64, text and dates as text."""
        return {c.name: tf.TensorSpec([None], tf.float64 if c.kind == "numeric" else tf.string,
                                      name=name)
                for name, c in zip(self.inputs, self.codes, strict=True)}

    def encode(self, columns: dict[str, tf.Tensor]) -> tf.Tensor | dict[str, tf.Tensor]:
        """The model input, as the feed gives it for training.

        Parameters
        ----------
        columns
            The raw columns, by name (strings or numbers, one value per row).

        Returns
        -------
        tf.Tensor or dict of str to tf.Tensor
            One matrix (``as_matrix``) or the encoded columns by name.
        """
        x = {}
        for code in self.scorer.encoding.columns:
            raw = columns[code.name]
            if code.kind == "categorical":
                x[code.name] = _text_codes(raw, code, self.lookups[code.name], self.markers)
            elif code.kind == "datetime":
                x[code.name] = tf.cast(_seconds(raw, code), code.dtype)
            else:
                x[code.name] = _number(raw, code)
        if not self.scorer.encoding.as_matrix:
            return x
        dtype = self.scorer.encoding.matrix_dtype
        return tf.stack([tf.cast(x[c.name], dtype) for c in self.scorer.encoding.columns], axis=1)

    def __call__(self, columns: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        out = self.model(self.encode(columns), training=False)
        out = tf.reshape(out, [tf.shape(out)[0], -1])
        if self.scorer.classes is None:
            return {"prediction": out[:, 0]}
        probs = tf.concat([1 - out, out], axis=1) if self.scorer.task == "binary" else out
        best = tf.argmax(probs, axis=1)
        return {"probabilities": probs, "class_id": best,
                "class_name": tf.gather(self.class_names, best)}

    def describe(self) -> dict[str, object]:
        """What ``inputs.json`` says: each column's input, kind and dtype, and the outputs."""
        specs = self.specs()
        outputs = (["prediction"] if self.scorer.classes is None
                   else ["probabilities", "class_id", "class_name"])
        return {"signatures": ["serve"],
                "inputs": [{"column": c.name, "input": name, "kind": c.kind,
                            "serve": specs[c.name].dtype.name}
                           for name, c in zip(self.inputs, self.codes, strict=True)],
                "outputs": outputs}


def export(output_dir: str | os.PathLike[str], *, model: keras.Model | None = None,
           features: list[str] | None = None, echo: Callable[[str], None] = print) -> str | None:
    """Write ``output_dir/serving/``: the trained model behind the training encoding, raw inputs in.

    Parameters
    ----------
    output_dir
        A ``daskfeed train --output`` directory (``model.keras``, ``manifest.json``).
    model
        The trained Keras model (default: ``model.keras`` loaded); any model over the encoded
        columns, the default one or a builder's.
    features
        Only for a model over one matrix (``as_matrix``): its feature columns, in order.
    echo
        Where the closing line goes.

    Returns
    -------
    str or None
        The path written; None (with a line through ``echo``) on a backend other than
        TensorFlow, which cannot write a SavedModel around this encoding.

    Outputs of ``serve``: ``prediction`` (float32) for a regression label; for a class label
    ``probabilities`` (one column per class, in the order of the manifest's classes),
    ``class_id`` and ``class_name`` (the class name, or its id as text). ``inputs.json`` beside
    ``saved_model.pb`` maps the columns to the signature's inputs.
    """
    if keras.backend.backend() != "tensorflow":
        echo(f"serving/ not written: a SavedModel needs KERAS_BACKEND=tensorflow (this run: "
             f"{keras.backend.backend()}); use 'daskfeed predict' or model.keras")
        return None
    run = TrainedRun.open(output_dir, features)
    net = model if model is not None else keras.saving.load_model(run.model_path, compile=False)
    serve = _Serve(net, run.scorer, list((run.manifest.read_options or {}).get("na_values") or []))
    archive = keras.export.ExportArchive()
    archive.track(net)
    for layer in serve.lookups.values():
        archive.track(layer)
    archive.add_endpoint("serve", serve, input_signature=[serve.specs()])
    path = os.path.join(os.fspath(output_dir), "serving")
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    archive.write_out(tmp, verbose=False)
    with open(os.path.join(tmp, "inputs.json"), "w", encoding="utf-8") as f:
        json.dump(serve.describe(), f, indent=1, ensure_ascii=False)
    shutil.rmtree(path, ignore_errors=True)
    replace(tmp, path)
    renamed = [f"{c.name!r} as {n}" for c, n in zip(serve.codes, serve.inputs, strict=True)
               if c.name != n]
    echo(f"wrote {path} (SavedModel: serve() takes the raw columns {', '.join(run.features)}"
         f"{'; signature inputs ' + ', '.join(renamed) if renamed else ''}; inputs.json names "
         "each input)")
    return path
