"""Serving: ``OUTPUT/serving/``, a TensorFlow SavedModel that takes raw column values.

Signatures. ``serve`` (also ``serving_default``) takes one 1-D tensor per feature column:
numbers as float64 (NaN is missing), text and dates as ``tf.string``. ``serve_text`` takes every
column as ``tf.string``, the text a CSV holds, so numbers are read as the reader reads them.

Inputs. Called in Python (``tf.saved_model.load(...).serve({column: tensor})``) the functions
take a dict keyed by column name. The signatures (TF Serving, ``saved_model_cli``,
``.signatures["serve"](**inputs)``) name each input by its column too, where TensorFlow allows
the name: an ASCII letter, then letters, digits and ``_``, and no Python keyword (signature
inputs become Python parameters). Otherwise each other character becomes ``_``, a name that
does not start with a letter or is a keyword gets ``col_`` in front, and a name already taken (a
valid column name keeps its own) gets ``_2``, ``_3``, ... in column order: ``gold spent (€)`` →
``gold_spent____``, ``_rank`` → ``col__rank``, ``class`` → ``col_class``.
``serving/inputs.json`` lists each column with its input name, kind and dtypes.

Each value is read as ``daskfeed predict`` reads a block of such values (pyarrow, then the
reader's null markers, :mod:`daskfeed.reading`) and encoded with the training statistics:

- missing: ``""`` (or only spaces) and the run's ``na_values`` in every column; in a number
  column also ``NA``, ``NULL``, ``NaN``, ... (``NA_MARKERS``). A missing number or date gets the
  training mean, a missing text the missing code, as in training.
- numbers: decimal (``-1.5e3``, ``.5``, ``+2``), ``0x1F``, ``inf``, ``true``/``false`` (1, 0);
  spaces around a number are ignored; a run read with ``--decimal ,`` reads ``1.234,5`` as
  1234.5 (dots group thousands), as its training did.
- dates, ISO 8601 as pyarrow reads them: ``YYYY-MM-DD``, optionally followed by ``T`` or a
  space and ``hh``, ``hh:mm``, ``hh:mm:ss`` or ``hh:mm:ss.fff`` (1 to 9 digits), then optionally
  ``Z``, ``+hh``, ``+hhmm`` or ``+hh:mm`` (or ``-``). A time with a zone is converted to UTC, one
  without is taken as it is; the encoding is seconds since 1970, as the reader's timestamps.
  Spaces around a date are ignored.
- unparsed: any other value of a number or date column (``12x``, ``2013-02-30``). It gets the
  training mean, as predict gives it (pandas reads it as NaN), and is counted, not refused:
  one bad value would otherwise fail every row of the request. The outputs ``unparsed``
  (int32, the row's unparsed values) and ``unparsed_columns`` (their inputs, comma-separated;
  ``""``: none) tell which rows were scored on a guess. A text never seen in training is no
  unparsed value: it has the out-of-vocabulary code.

Serving reads value by value: a value reads the same whatever the other rows hold. predict
reads blocks, and a block pyarrow cannot type as dates (one bad value, zoned and naive times
mixed) goes to pandas, which reads its dates otherwise.

Outputs: ``prediction`` (float32) for a regression label; for a class label ``probabilities``
(one column per class, in the order of the manifest's classes), ``class_id`` and
``class_name`` (the class name, or its id as text); ``unparsed`` and ``unparsed_columns``.
SavedModels are TensorFlow's format: the export needs the TensorFlow backend
(:func:`daskfeed.inference.export` runs it in a TensorFlow process for a JAX or PyTorch run).
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
from daskfeed.manifest import HEX, MISSING_CODE, NUMBER, WHOLE, ColumnCode
from daskfeed.reading import NA_MARKERS

VALID_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # a signature input (and not a keyword)
# ISO 8601 as pyarrow's parser takes it: year, month, day, hour, minute, second, fraction, zone
DATE = (r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?"
        r"(Z|[+-]\d{2}(?::?\d{2})?)?)?")
DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


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


def _text_codes(raw: tf.Tensor, lookup: keras.layers.StringLookup, markers: tf.Tensor) -> tf.Tensor:
    """Vocabulary codes as the feed makes them: 0 missing ("" or a null marker), 1 OOV, 2.."""
    missing = tf.equal(raw, "") | _is_in(raw, markers)
    codes = tf.cast(lookup(raw), tf.int32)
    return tf.where(missing, tf.constant(MISSING_CODE, tf.int32), codes)


def _is_in(text: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    if not values.shape[0]:
        return tf.zeros_like(text, tf.bool)
    return tf.reduce_any(tf.equal(tf.expand_dims(text, 1), tf.expand_dims(values, 0)), axis=1)


def _fill(code: ColumnCode) -> tf.Tensor:
    """The training mean in the column's dtype (whole-number columns: rounded)."""
    return tf.constant(code.fill_value, code.dtype)


def _hex(text: tf.Tensor) -> tf.Tensor:
    """The int64 of ``0x`` text (16 digits at most: the bits, as pyarrow reads them)."""
    digits = tf.strings.regex_replace(text, "^0[xX]", "")
    length = tf.strings.length(digits)
    digits = tf.strings.substr("0" * 16 + digits, length, tf.fill(tf.shape(length), 16))
    chars = tf.reshape(tf.cast(tf.io.decode_raw(digits, tf.uint8), tf.int64), [-1, 16])
    nibbles = tf.where(chars <= ord("9"), chars - ord("0"), tf.bitwise.bitwise_or(chars, 32) - 87)
    shifts = tf.constant([4 * (15 - i) for i in range(16)], tf.int64)
    return tf.reduce_sum(tf.bitwise.left_shift(nibbles, shifts), axis=1)


def _read_number(text: tf.Tensor, code: ColumnCode) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Stripped text as pyarrow reads a number: as float64, exactly in ``code.dtype``, and where."""
    decimal = tf.strings.regex_full_match(text, NUMBER)
    hexa = tf.strings.regex_full_match(text, HEX)
    lower = tf.strings.lower(text)
    value = tf.strings.to_number(tf.where(decimal, text, "0"), tf.float64)
    value = tf.where(lower == "true", tf.constant(1.0, tf.float64), value)
    value = tf.where(lower == "false", tf.constant(0.0, tf.float64), value)
    ints = _hex(tf.where(hexa, text, "0x0"))
    value = tf.where(hexa, tf.cast(ints, tf.float64), value)
    ok = decimal | hexa | (lower == "true") | (lower == "false")
    if code.dtype != "int64":
        return value, tf.cast(value, code.dtype), ok
    whole = tf.strings.regex_full_match(text, WHOLE)
    ints = tf.where(whole, tf.strings.to_number(tf.where(whole, text, "0"), tf.int64), ints)
    return value, tf.where(whole | hexa, ints, tf.cast(value, tf.int64)), ok


def _number(raw: tf.Tensor, code: ColumnCode, markers: tf.Tensor,
            numbers: tf.Tensor, decimal: str = ".") -> tuple[tf.Tensor, tf.Tensor]:
    """A number column (float64, or text as the reader reads it), the mean where missing.

    ``markers`` are the null markers of a number column, ``numbers`` those that read as numbers
    (``-999``: any text of that value is missing, as pyarrow compares them). Returns the
    encoded values and where a text was no number (unparsed). ``decimal``: the run's decimal
    point (``--decimal``; with ``,`` dots group thousands, as the reader reads them).
    """
    if raw.dtype == tf.float64:
        value, exact, unparsed = raw, tf.cast(raw, code.dtype), tf.zeros_like(raw, tf.bool)
        missing = tf.zeros_like(raw, tf.bool)
    else:
        text = tf.strings.strip(raw)
        written = text
        if decimal == ",":
            written = tf.strings.regex_replace(written, r"\.", "")
        if decimal != ".":
            written = tf.strings.regex_replace(written, re.escape(decimal), ".")
        value, exact, ok = _read_number(written, code)
        missing = tf.equal(text, "") | _is_in(text, markers)
        unparsed = ~missing & ~ok
        missing |= ~ok
    missing |= tf.math.is_nan(value) | tf.math.is_inf(value)  # (inf: missing, as the read rule has it)
    missing |= tf.reduce_any(tf.equal(tf.expand_dims(value, 1), tf.expand_dims(numbers, 0)), axis=1)
    return tf.where(missing, _fill(code), exact), unparsed


def _days_from_civil(y: tf.Tensor, m: tf.Tensor, d: tf.Tensor) -> tf.Tensor:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y = y - tf.cast(m <= 2, tf.int64)
    era = tf.math.floordiv(y, 400)
    yoe = y - era * 400
    doy = (153 * (m + tf.where(m > 2, tf.constant(-3, tf.int64), 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _seconds(text: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Seconds since 1970 (UTC) of stripped ISO 8601 text as pyarrow reads it, and where it is one.

    A fraction is carried as pyarrow's nanosecond timestamps carry it (``ticks / 1e9``).
    """
    ok = tf.strings.regex_full_match(text, DATE)
    fields = tf.strings.split(tf.strings.regex_replace(
        tf.where(ok, text, "1970-01-01"), f"^{DATE}$", r"\1|\2|\3|\4|\5|\6|\7|\8"), "|")
    fields = fields.to_tensor(default_value="", shape=[None, 8])

    def number(part: tf.Tensor) -> tf.Tensor:
        return tf.strings.to_number(tf.where(tf.equal(part, ""), "0", part), tf.int64)

    y, m, d, hh, mm, ss = (number(fields[:, i]) for i in range(6))
    frac, zone = fields[:, 6], fields[:, 7]
    nanos = number(tf.strings.substr(frac + "000000000", 0, 9))
    zone_h = number(tf.strings.regex_replace(zone, r"^[+-](\d{2}).*$|^Z?$", r"\1"))
    zone_m = number(tf.strings.regex_replace(zone, r"^[+-]\d{2}:?(\d{2})?$|^Z?$", r"\1"))
    west = tf.strings.regex_full_match(zone, "-.*")
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = tf.gather(tf.constant(DAYS_IN_MONTH, tf.int64), tf.clip_by_value(m - 1, 0, 11))
    month_days += tf.cast((m == 2) & leap, tf.int64)
    ok &= ((m >= 1) & (m <= 12) & (d >= 1) & (d <= month_days) & (hh < 24) & (mm < 60)
           & (ss < 60) & (zone_h < 24) & (zone_m < 60))
    offset = (zone_h * 3600 + zone_m * 60) * tf.where(west, tf.constant(-1, tf.int64), 1)
    secs = _days_from_civil(y, m, d) * 86400 + hh * 3600 + mm * 60 + ss - offset
    in_ns = tf.abs(secs) < 9_223_372_035  # in int64 nanoseconds (1677 to 2262), as pyarrow's
    ticks = tf.cast(tf.where(in_ns, secs, 0) * 10**9 + nanos, tf.float64) / 1e9
    value = tf.cast(secs, tf.float64)
    value = tf.where(tf.equal(frac, ""), value,
                     tf.where(in_ns, ticks, value + tf.cast(nanos, tf.float64) / 1e9))
    return value, ok


def _date(raw: tf.Tensor, code: ColumnCode, markers: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A date column: seconds since 1970, the mean where missing; and where it is unparsed."""
    text = tf.strings.strip(raw)
    value, ok = _seconds(text)
    missing = tf.equal(text, "") | _is_in(raw, markers)
    return tf.where(ok & ~missing, tf.cast(value, code.dtype), _fill(code)), ~ok & ~missing


class _Serve:
    """The serving function: raw columns → training encoding → model → named outputs."""

    def __init__(self, model: keras.Model, scorer: Scorer, na_values: list[str],
                 decimal: str = ".") -> None:
        self.model = model
        self.decimal = decimal
        self.scorer = scorer
        self.codes = scorer.encoding.columns
        self.inputs = input_names([c.name for c in self.codes])
        self.markers = tf.constant(list(na_values), tf.string)
        self.number_markers = tf.constant(list(dict.fromkeys((*NA_MARKERS, *na_values))))
        self.numbers = tf.constant([float(v) for v in na_values if _is_float(v)], tf.float64)
        self.lookups = {
            c.name: keras.layers.StringLookup(vocabulary=list(c.vocabulary), mask_token="",
                                              num_oov_indices=1, name=f"lookup_{i}")
            for i, c in enumerate(self.codes) if c.kind == "categorical"}
        for layer in self.lookups.values():  # built before the export tracks it
            layer(tf.constant([""]))
        self.class_names = tf.constant(list(scorer.classes or ()), tf.string)

    def specs(self, text: bool) -> dict[str, tf.TensorSpec]:
        """The input signature by column: ``text``: every column as text, else numbers as float64."""
        return {c.name: tf.TensorSpec([None], tf.float64 if c.kind == "numeric" and not text
                                      else tf.string, name=name)
                for name, c in zip(self.inputs, self.codes, strict=True)}

    def encode(self, columns: dict[str, tf.Tensor]) -> tuple[tf.Tensor | dict[str, tf.Tensor],
                                                            tf.Tensor]:
        """The model input, as the feed gives it for training, and the unparsed values.

        Parameters
        ----------
        columns
            The raw columns, by column name (text or float64 numbers, one value per row).

        Returns
        -------
        tuple
            One matrix (``as_matrix``) or the encoded columns by name; and a bool matrix,
            one column per input, true where a value was not missing and not read.
        """
        x, flags = {}, []
        for code in self.codes:
            raw = columns[code.name]
            if code.kind == "categorical":
                x[code.name] = _text_codes(raw, self.lookups[code.name], self.markers)
                flags.append(tf.zeros_like(raw, tf.bool))
                continue
            if code.kind == "datetime":
                x[code.name], unparsed = _date(raw, code, self.markers)
            else:
                x[code.name], unparsed = _number(raw, code, self.number_markers, self.numbers,
                                                 self.decimal)
            flags.append(unparsed)
        unparsed = tf.stack(flags, axis=1)
        if not self.scorer.encoding.as_matrix:
            return x, unparsed
        dtype = self.scorer.encoding.matrix_dtype
        return tf.stack([tf.cast(x[c.name], dtype) for c in self.codes], axis=1), unparsed

    def __call__(self, columns: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        x, unparsed = self.encode(columns)
        out = self.model(x, training=False)
        out = tf.reshape(out, [tf.shape(out)[0], -1])
        names = tf.broadcast_to(tf.constant(self.inputs), tf.shape(unparsed))
        counts = {"unparsed": tf.reduce_sum(tf.cast(unparsed, tf.int32), axis=1),
                  "unparsed_columns": tf.strings.reduce_join(
                      tf.ragged.boolean_mask(names, unparsed), axis=1, separator=",")}
        if self.scorer.classes is None:
            return {"prediction": out[:, 0], **counts}
        probs = tf.concat([1 - out, out], axis=1) if self.scorer.task == "binary" else out
        best = tf.argmax(probs, axis=1)
        return {"probabilities": probs, "class_id": best,
                "class_name": tf.gather(self.class_names, best), **counts}

    def describe(self) -> dict[str, object]:
        """What ``inputs.json`` says: each column's input, kind and dtypes, and the outputs."""
        typed, text = self.specs(text=False), self.specs(text=True)
        outputs = (["prediction"] if self.scorer.classes is None
                   else ["probabilities", "class_id", "class_name"])
        return {"signatures": ["serve", "serve_text"],
                "inputs": [{"column": c.name, "input": name, "kind": c.kind,
                            "serve": typed[c.name].dtype.name,
                            "serve_text": text[c.name].dtype.name}
                           for name, c in zip(self.inputs, self.codes, strict=True)],
                "outputs": [*outputs, "unparsed", "unparsed_columns"]}


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _resources(*objects: object) -> list[object]:
    """The TensorFlow resources (lookup tables) ``objects`` hold, as Keras' export finds them."""
    from tensorflow.saved_model.experimental import TrackableResource

    found: dict[int, object] = {}
    for obj in objects:
        try:
            descendants = tf.train.TrackableView(obj).descendants()
        except TypeError:  # (as Keras: an object it cannot walk; a table of it is then refused)
            continue
        for item in descendants:
            if isinstance(item, TrackableResource):
                found.setdefault(id(item), item)
    return list(found.values())


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

    The signatures, their inputs and outputs are in the module docstring; ``inputs.json``
    beside ``saved_model.pb`` maps the columns to the inputs.
    """
    if keras.backend.backend() != "tensorflow":
        echo(f"serving/ not written: a SavedModel needs KERAS_BACKEND=tensorflow (this process: "
             f"{keras.backend.backend()}); daskfeed.inference.export writes it in a TensorFlow "
             "process")
        return None
    run = TrainedRun.open(output_dir, features)
    net = model if model is not None else keras.saving.load_model(run.model_path, compile=False)
    read = run.manifest.read_options or {}
    serve = _Serve(net, run.scorer, list(read.get("na_values") or []), read.get("decimal", "."))
    # what the SavedModel holds, as Keras' ExportArchive keeps it: the model's variables and
    # the resources it holds (a lookup layer's table, one of the model itself), the serving
    # lookups' tables; written by TensorFlow, each endpoint traced once (the archive traces
    # each a second time to list their variables: ~0.4 s a trace)
    lookups = list(serve.lookups.values())
    root = tf.__internal__.tracking.AutoTrackable()
    root.variables = [*net.variables, *(v for layer in lookups for v in layer.variables)]
    root.trainable_variables = list(net.trainable_variables)
    trainable = {id(v) for v in net.trainable_variables}
    root.non_trainable_variables = [v for v in root.variables if id(v) not in trainable]
    root.resources = _resources(net, *lookups)
    signatures = {}
    for name, text in (("serve", False), ("serve_text", True)):
        signatures[name] = tf.function(serve, input_signature=[serve.specs(text=text)],
                                       autograph=False)
        setattr(root, name, signatures[name])
    path = os.path.join(os.fspath(output_dir), "serving")
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tf.saved_model.save(root, tmp, signatures={**signatures, "serving_default": signatures["serve"]})
    with open(os.path.join(tmp, "inputs.json"), "w", encoding="utf-8") as f:
        json.dump(serve.describe(), f, indent=1, ensure_ascii=False)
    shutil.rmtree(path, ignore_errors=True)
    replace(tmp, path)
    renamed = [f"{c.name!r} as {n}" for c, n in zip(serve.codes, serve.inputs, strict=True)
               if c.name != n]
    echo(f"wrote {path} (SavedModel: serve() and serve_text() take the raw columns "
         f"{', '.join(run.features)}{'; signature inputs ' + ', '.join(renamed) if renamed else ''}"
         "; inputs.json names each input)")
    return path
