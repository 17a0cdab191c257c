"""Encoding: the manifest's columns as the compact numpy arrays a model takes.

Only what the model needs crosses the wire: numeric features (missing → the mean), int32 codes
for string columns (0 = missing, 1 = out of vocabulary, 2.. = vocabulary), and the label (a
text label as its class code).

A weight column (``Encoding.weight``) travels as float32, the dtype of Keras' sample weights; it
is not a feature. Every row with a label must have a weight >= 0: the sequence checks the
manifest before training (and names the file and line of the first bad weight, see
:mod:`daskfeed.manifest._weights`), and encoding refuses one that slipped through.

Numbers keep their value. A numeric column travels as float32 (the model's dtype) when every
value's magnitude is below 2**24 = 16,777,216, where float32 still holds every whole number
exactly; a column reaching that magnitude travels as int64 (whole numbers) or float64, so ids,
counts and timestamps arrive exactly as the CSV wrote them. Decimal fractions are carried at
float32 precision (about 7 significant digits) in the narrow case. Dates travel as float64
seconds since 1970. The same rule applies to a regression label.

Dates read the same whatever type their block has (:func:`date_seconds`): a block of timestamps
in its own unit (the reader makes timestamps of zoned and naive times mixed, and of markers among
dates), a block left as text (one value that is not a date) value by value, in the ISO 8601
forms pyarrow reads (a zone converted to UTC, a time without one taken as UTC), exactly as
``serving/`` reads them. A value of a date or
number column that is neither missing nor read (``yesterday``, ``20130923`` in a date column,
``12x`` in a number column) gets the training mean, as a missing value does, and is counted:
:func:`encode_features` reports where (``unparsed``), the values ``serving/`` counts in its
``unparsed`` output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from daskfeed.core import DataError, SchemaError
from daskfeed.manifest._labels import class_codes
from daskfeed.manifest._manifest import Column, Manifest
from daskfeed.manifest._numbers import text_numbers
from daskfeed.manifest._weights import checked_weights, number_array
from daskfeed.reading import iso_seconds

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    import pandas as pd
    import pyarrow as pa

    Make: TypeAlias = Callable[[np.ndarray, int, str], np.ndarray]  # see WindowData.allocate

MISSING_CODE = 0
OOV_CODE = 1
VOCAB_OFFSET = 2
EXACT_FLOAT32 = 2**24  # float32 holds every whole number up to this magnitude


def numeric_dtype(column: Column) -> str:
    """The dtype a numeric manifest column travels as: float32, or int64/float64 when wide."""
    bounds = [abs(v) for v in (column.min, column.max) if v is not None]
    if not bounds or max(bounds) < EXACT_FLOAT32:
        return "float32"
    return "int64" if getattr(column, "integer", False) else "float64"


@dataclass(frozen=True)
class ColumnCode:
    """How one column is encoded: its kind, the array dtype, the fill value, the vocabulary."""

    name: str
    kind: str  # numeric | categorical | datetime
    fill: float = 0.0
    vocabulary: tuple[str, ...] = ()
    dtype: str = "float32"  # int32 (categorical) | float32 | float64 | int64

    @property
    def input_dim(self) -> int:
        """Embedding input size for a categorical column (missing + OOV + vocabulary)."""
        return len(self.vocabulary) + VOCAB_OFFSET

    @property
    def fill_value(self) -> np.generic:
        """The fill value in the column's dtype (a whole-number column: the rounded mean)."""
        fill = round(self.fill) if self.dtype == "int64" else self.fill
        value: np.generic = np.dtype(self.dtype).type(fill)
        return value


@dataclass(frozen=True)
class Encoding:
    """What a worker needs to turn rows into arrays; derived from a Manifest."""

    label: str
    label_dtype: str  # float32 | int32 (classes) | int64 / float64 (a wide regression label)
    columns: tuple[ColumnCode, ...]
    as_matrix: bool = False
    weight: str | None = None  # the sample-weight column (float32), not a feature
    label_classes: tuple[str, ...] = ()  # a text label's classes: text → codes 0..K-1

    @classmethod
    def from_manifest(cls, manifest: Manifest, features: list[str], as_matrix: bool = False,
                      weight: str | None = None) -> Encoding:
        """Build the encoding of ``features`` (and the ``weight`` column) from a manifest."""
        if as_matrix:
            text = [n for n in features if manifest.columns[n].kind != "numeric"]
            if text:
                numeric = [n for n in features if n not in text]
                raise SchemaError(
                    f"as_matrix=True stacks numeric columns into one matrix. Received: "
                    f"{len(text)} non-numeric column(s): {', '.join(map(repr, text))}.\nHint: leave "
                    f"them out with exclude={text} (--exclude {','.join(text)}) or pick numeric "
                    f"columns with features=[...] (--features {','.join(numeric) or 'COL,...'}), or "
                    "use the dict form (as_matrix=False)."
                )
        codes = [_column_code(manifest.columns[name]) for name in features]
        return cls(manifest.label, _label_dtype(manifest), tuple(codes), as_matrix, weight,
                   tuple(manifest.classes or ()))

    @property
    def names(self) -> list[str]:
        """The columns a window reads: label, weight (if any), features."""
        return [self.label, *([self.weight] if self.weight else []), *(c.name for c in self.columns)]

    @property
    def matrix_dtype(self) -> str:
        """The dtype of the ``as_matrix`` matrix: float64 when any column needs it."""
        return "float64" if any(c.dtype != "float32" for c in self.columns) else "float32"

    @property
    def bytes_per_row(self) -> int:
        """Encoded bytes per row (features + label)."""
        if self.as_matrix:
            feats = np.dtype(self.matrix_dtype).itemsize * len(self.columns)
        else:
            feats = sum(np.dtype(c.dtype).itemsize for c in self.columns)
        return int(feats + np.dtype(self.label_dtype).itemsize + (4 if self.weight else 0))


def _column_code(col: Column) -> ColumnCode:
    if col.kind == "categorical":
        return ColumnCode(col.name, col.kind, col.fill_value, tuple(col.vocabulary), "int32")
    dtype = "float64" if col.kind == "datetime" else numeric_dtype(col)
    return ColumnCode(col.name, col.kind, col.fill_value, (), dtype)


def _label_dtype(manifest: Manifest) -> str:
    if manifest.task == "multiclass":
        return "int32"
    if manifest.task == "binary":
        return "float32"
    return numeric_dtype(manifest.columns[manifest.label])


@dataclass
class WindowData:
    """A window's encoded rows: ``x`` (dict or matrix), ``y`` and the sample weights ``w``."""

    x: dict[str, np.ndarray] | np.ndarray
    y: np.ndarray
    w: np.ndarray | None = None  # float32 sample weights (a weight column), else None

    def __len__(self) -> int:
        return len(self.y)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        xs = self.x.values() if isinstance(self.x, dict) else [self.x]
        return int(sum(a.nbytes for a in xs) + self.y.nbytes + (0 if self.w is None else self.w.nbytes))

    def rows(self, index: slice | np.ndarray) -> WindowData:
        """The rows ``index`` selects (a slice: views; an index array: copies)."""
        x = {k: v[index] for k, v in self.x.items()} if isinstance(self.x, dict) else self.x[index]
        return WindowData(x, self.y[index], None if self.w is None else self.w[index])

    def take(self, start: int, stop: int) -> WindowData:
        """Rows ``[start, stop)`` as views (no copy)."""
        return self.rows(slice(start, stop))

    def allocate(self, n: int, make: Make | None = None) -> WindowData:
        """Arrays for ``n`` rows of this one's dtypes and shapes, not filled (:meth:`put`).

        ``make(like, n, name)`` makes each (default: ``numpy.empty``); ``name`` is ``"x"``,
        ``"x-<i>"`` (the ``i``-th column of a dict), ``"y"`` or ``"w"``.
        """
        def like(a: np.ndarray, name: str) -> np.ndarray:
            if make is not None:
                return make(a, n, name)
            return np.empty((n, *a.shape[1:]), dtype=a.dtype)

        x = ({k: like(v, f"x-{i}") for i, (k, v) in enumerate(self.x.items())}
             if isinstance(self.x, dict) else like(self.x, "x"))
        return WindowData(x, like(self.y, "y"), None if self.w is None else like(self.w, "w"))

    def put(self, at: int, rows: WindowData) -> None:
        """Copy ``rows`` (of the same dtypes: else ``TypeError``) to rows ``[at, at + len(rows))``."""
        pairs = [(self.y, rows.y)]
        if isinstance(self.x, dict) and isinstance(rows.x, dict):
            pairs += [(v, rows.x[k]) for k, v in self.x.items()]
        elif isinstance(self.x, np.ndarray) and isinstance(rows.x, np.ndarray):
            pairs.append((self.x, rows.x))
        else:
            raise TypeError("Expected rows encoded alike (a dict of columns or one matrix each).")
        if (self.w is None) != (rows.w is None):
            raise TypeError("Expected rows encoded alike (sample weights in both or neither).")
        if self.w is not None and rows.w is not None:
            pairs.append((self.w, rows.w))
        end = at + len(rows)
        for dest, src in pairs:
            if dest.dtype != src.dtype or dest.shape[1:] != src.shape[1:]:
                raise TypeError(f"Expected rows encoded alike. Received {src.dtype} {src.shape[1:]} "
                                f"for {dest.dtype} {dest.shape[1:]}.")
            dest[at:end] = src

    def batch(self) -> tuple[dict[str, np.ndarray] | np.ndarray, ...]:
        """``(x, y)``, or ``(x, y, w)`` with a weight column: what ``fit`` takes."""
        return (self.x, self.y) if self.w is None else (self.x, self.y, self.w)


def _encode_column(s: pd.Series, code: ColumnCode) -> np.ndarray:
    return _encode_series(s, code)[0]


def _encode_series(s: pd.Series, code: ColumnCode) -> tuple[np.ndarray, np.ndarray | None]:
    """One pandas column → the feed's array, and where a value was not read (None: nowhere)."""
    import pandas as pd  # only for what Arrow does not cover (workers need no pandas otherwise)

    if code.kind == "categorical":
        values = s if pd.api.types.is_string_dtype(s.dtype) else s.astype("string")
        cat = pd.Categorical(values, categories=list(code.vocabulary))
        codes = cat.codes.astype(np.int32) + VOCAB_OFFSET  # -1 (unknown or NaN) → 1
        missing = s.isna().to_numpy()
        if missing.any():
            codes[missing] = MISSING_CODE
        return codes, None
    if code.kind == "datetime":  # through Arrow: the one reading of dates (date_seconds)
        import pyarrow as pa

        if pd.api.types.is_datetime64_any_dtype(s.dtype) or pd.api.types.is_numeric_dtype(s.dtype):
            col = pa.Array.from_pandas(s)
        else:
            col = pa.Array.from_pandas(s.astype("string"))
        return _date_column(col, code)
    if not pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        # a block pyarrow left as text (some value is no number)
        return text_numbers(s, code.dtype, code.fill_value)
    num = pd.to_numeric(s, errors="coerce")
    missing = num.isna().to_numpy()
    if pd.api.types.is_integer_dtype(num.dtype):  # exact, whatever the magnitude
        arr = num.to_numpy(dtype=np.int64, na_value=0)
    else:
        arr = num.to_numpy(dtype=np.float64, na_value=0.0)  # missing: the fill, below
        missing = missing | np.isinf(arr)  # (as the read rule has it: inf is missing)
    with np.errstate(invalid="ignore"):  # (inf to int64: filled below)
        arr = arr.astype(code.dtype)
    if missing.any():
        arr[missing] = code.fill_value
    return arr, None


def date_seconds(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since 1970 (UTC) of a date column, whatever type pyarrow gave its block.

    A block of timestamps is read in its own unit (:func:`epoch_seconds`); a block left as text
    (it holds a value that is not a date) value by value, each as pyarrow reads a date alone
    (:func:`daskfeed.reading.iso_seconds`: ISO 8601, spaces around it ignored), a zone converted
    to UTC, a time without one taken as UTC, a fraction carried as nanosecond timestamps carry
    it (``ticks / 1e9``). Any other type (numbers: ``20130923`` is
    no date) holds no date. The reading is serving's (:mod:`daskfeed.inference._serving`).

    Parameters
    ----------
    col
        A pyarrow Array or ChunkedArray (timestamps, dates, text, numbers or nulls).

    Returns
    -------
    tuple of numpy.ndarray
        The seconds (float64; NaN where missing or not a date) and where a value is not a date
        although not missing (missing: null, or only spaces).
    """
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    if pa.types.is_dictionary(t):
        col, t = col.cast(t.value_type), t.value_type
    valid = np.asarray(col.is_valid(), dtype=bool)
    if pa.types.is_date(t):
        col, t = col.cast(pa.timestamp("s")), pa.timestamp("s")
    if pa.types.is_timestamp(t):
        secs = epoch_seconds(col)
        secs[~valid] = np.nan
        return secs, np.zeros(len(col), dtype=bool)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return iso_seconds(col)
    return np.full(len(col), np.nan), valid  # numbers, booleans, ...: no date (null: all missing)


def _date_column(col: pa.Array | pa.ChunkedArray, code: ColumnCode) -> tuple[np.ndarray, np.ndarray | None]:
    """A date column's array (the mean where missing or not a date) and where it was not one."""
    secs, unparsed = date_seconds(col)
    secs[np.isnan(secs)] = code.fill
    return secs.astype(code.dtype, copy=False), (unparsed if unparsed.any() else None)


def encode_frame(df: pd.DataFrame, encoding: Encoding) -> WindowData:
    """Encode a pandas frame in row order; rows without a label are dropped."""
    import pandas as pd

    if encoding.label not in df.columns:
        raise SchemaError(
            f"Expected label column {encoding.label!r} in every block. Received: columns "
            f"{list(df.columns)[:20]}.\nHint: give all files the same header."
        )
    label = pd.to_numeric(df[encoding.label], errors="coerce")
    keep = label.notna().to_numpy()
    if not keep.all():
        df = df.loc[keep]
        label = label.loc[keep]
    exact = np.int64 if pd.api.types.is_integer_dtype(label.dtype) else np.float64
    y = label.to_numpy(dtype=exact).astype(encoding.label_dtype)
    w = None
    if encoding.weight:
        w = checked_weights(pd.to_numeric(df[encoding.weight], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan), encoding.weight)
    if encoding.as_matrix:
        x = np.empty((len(df), len(encoding.columns)), dtype=encoding.matrix_dtype)
        for j, code in enumerate(encoding.columns):
            x[:, j] = _encode_column(df[code.name], code)
        return WindowData(x, y, w)
    return WindowData({c.name: _encode_column(df[c.name], c) for c in encoding.columns}, y, w)



def concat(parts: list[WindowData]) -> WindowData:
    """Rows of several window parts, in order (the part itself when there is one)."""
    if len(parts) == 1:
        return parts[0]
    y = np.concatenate([p.y for p in parts])
    w = None if parts[0].w is None else np.concatenate([p.w for p in parts])
    if isinstance(parts[0].x, dict):
        return WindowData({k: np.concatenate([p.x[k] for p in parts]) for k in parts[0].x}, y, w)
    return WindowData(np.concatenate([p.x for p in parts]), y, w)


def empty_window(encoding: Encoding) -> WindowData:
    """A window of no rows, with the columns and dtypes the encoding gives."""
    import pandas as pd

    names = [c.name for c in encoding.columns] + [encoding.label] + (
        [encoding.weight] if encoding.weight else [])
    empty = pd.DataFrame({n: pd.Series([], dtype="float64") for n in names})
    return encode_frame(empty, encoding)


def labelled(table: pa.Table, encoding: Encoding) -> np.ndarray | None:
    """Which rows of an Arrow table have a label (the rows :func:`encode_table` keeps; None: all).

    Parameters
    ----------
    table
        Rows with the encoding's label column.
    encoding
        How the label is read.

    Returns
    -------
    numpy.ndarray or None
        A boolean mask, or None when every row has one.
    """
    return _label_array(table.column(encoding.label), encoding)[1]


def _label_array(col: pa.Array | pa.ChunkedArray, encoding: Encoding) -> tuple[np.ndarray, np.ndarray | None]:
    """Label values (int64 for whole numbers, else float64) and the mask of rows with one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if encoding.label_classes:
        return _class_label(col, encoding)
    if pa.types.is_integer(col.type):
        keep = np.asarray(col.is_valid()) if col.null_count else None
        v = pc.fill_null(col, 0).cast(pa.int64()).to_numpy(zero_copy_only=False)
        return v, keep
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_dictionary(
            col.type):
        import pandas as pd

        v = pd.to_numeric(col.to_pandas(), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        v = col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    keep = np.isfinite(v)  # (NaN and inf: no label, as the read rule has them)
    return v, (None if keep.all() else keep)


def _class_label(col: pa.Array | pa.ChunkedArray, encoding: Encoding) -> tuple[np.ndarray, np.ndarray | None]:
    """A text label's class codes and the mask of rows with one; a text not a class is refused."""
    codes, labelled = class_codes(col, encoding.label_classes)
    unknown = labelled & (codes < 0)
    if unknown.any():
        first = col[int(np.flatnonzero(unknown)[0])].as_py()
        raise DataError(
            f"Expected a class of label {encoding.label!r} the training data have "
            f"({', '.join(encoding.label_classes[:10])}{' ...' if len(encoding.label_classes) > 10 else ''}"
            f"). Received: {first!r} in {int(unknown.sum())} row(s) of this window.\nHint: the data "
            "changed after the scan, or these rows hold a class training never saw: rescan, or "
            "drop those rows."
        )
    return codes, (None if labelled.all() else labelled)


def _table_column(col: pa.Array | pa.ChunkedArray, code: ColumnCode) -> tuple[np.ndarray, np.ndarray | None]:
    """One Arrow column → the feed's array, and where a date or number was not read (None: nowhere).

    Numbers in a number column and text in a text column are encoded by Arrow, dates by
    :func:`date_seconds` whatever their type, anything else by pandas.
    """
    import pyarrow as pa

    if code.kind == "datetime":
        return _date_column(col, code)
    t = col.type
    if pa.types.is_null(t):
        if code.kind == "categorical":
            return np.full(len(col), MISSING_CODE, dtype=np.int32), None
        return np.full(len(col), code.fill_value, dtype=code.dtype), None
    if _plain(col, code):
        return _arrow_column(col, code), None
    return _encode_series(col.to_pandas(), code)


def _plain(col: pa.Array | pa.ChunkedArray, code: ColumnCode) -> bool:
    """Whether Arrow encodes ``col`` alone: numbers in a number column, text in a text column."""
    import pyarrow as pa

    t = col.type
    if code.kind == "numeric":
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t))
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t))


def _arrow_column(col: pa.Array | pa.ChunkedArray, code: ColumnCode) -> np.ndarray:
    """A :func:`_plain` column's array, without pandas."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if code.kind == "numeric":
        valid = None if not col.null_count else np.asarray(col.is_valid())
        if pa.types.is_integer(t):  # whole numbers: exact in int64, and in float32 below 2**24
            arr: np.ndarray = pc.fill_null(col, 0).cast(pa.int64()).to_numpy(zero_copy_only=False)
            arr = arr.astype(code.dtype, copy=False)
        else:
            raw = col.to_numpy(zero_copy_only=False)
            bad = ~np.isfinite(raw)  # NaN and inf: missing, as the read rule has them
            with np.errstate(invalid="ignore"):  # (NaN or inf to int64: filled below)
                arr = raw.astype(code.dtype)
            valid = ~bad if bad.any() else valid
        if valid is not None:
            arr = arr if arr.flags.writeable else arr.copy()
            arr[~valid] = code.fill_value
        return arr
    if not pa.types.is_dictionary(t):  # text in a text column
        col = pc.dictionary_encode(col)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(col, pa.ChunkedArray):  # zero chunks
        return np.zeros(0, dtype=np.int32)
    values = col.dictionary.cast(pa.string())
    found = pc.index_in(values, value_set=pa.array(list(code.vocabulary), pa.string()))
    lookup = (pc.fill_null(found, -1).to_numpy(zero_copy_only=False) + VOCAB_OFFSET).astype(np.int32)
    lookup[lookup < VOCAB_OFFSET] = OOV_CODE  # not in the vocabulary
    idx = pc.fill_null(col.indices, 0).to_numpy(zero_copy_only=False)
    valid = np.asarray(col.is_valid())
    out = lookup[idx] if len(lookup) else np.full(len(idx), OOV_CODE, np.int32)
    out[~valid] = MISSING_CODE
    return out.astype(np.int32, copy=False)


def epoch_seconds(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Seconds since 1970 of a timestamp column, in its own unit (no overflow past 2262)."""
    import pyarrow as pa

    scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[col.type.unit]
    ticks = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return np.asarray(ticks, dtype=np.float64) / scale


def encode_table(table: pa.Table, encoding: Encoding,
                 unparsed: dict[str, np.ndarray] | None = None) -> WindowData:
    """Encode an Arrow table in row order, without pandas (rows without a label are dropped).

    Same result as the same rows encoded from a pandas frame; columns are taken by name, so files whose header
    lists the same columns in another order line up. ``unparsed``: as :func:`encode_features`
    fills it, over the rows kept.
    """
    if encoding.label not in table.column_names:
        raise SchemaError(
            f"Expected label column {encoding.label!r} in every block. Received: columns "
            f"{table.column_names[:20]}.\nHint: give all files the same header."
        )
    y, keep = _label_array(table.column(encoding.label), encoding)
    if keep is not None:
        import pyarrow as pa

        table = table.filter(pa.array(keep))
        y = y[keep]
    y = y.astype(encoding.label_dtype)
    w = None
    if encoding.weight:
        w = checked_weights(number_array(table.column(encoding.weight)), encoding.weight)
    return WindowData(encode_features(table, encoding, unparsed), y, w)


def encode_features(table: pa.Table, encoding: Encoding,
                    unparsed: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray] | np.ndarray:
    """The model input ``x`` of an Arrow table's rows, in order (no label needed).

    What :func:`encode_table` gives as ``x``; also what ``daskfeed predict`` scores.

    Parameters
    ----------
    table
        The rows, as the reader parses them.
    encoding
        The training encoding.
    unparsed
        Filled, when given, with the columns where a value of a date or number column was
        neither missing nor read (it got the training mean, as a missing value does): column
        → bool mask over the rows. Serving counts the same values (its ``unparsed`` output).

    Returns
    -------
    dict of str to numpy.ndarray, or numpy.ndarray
        One array per feature column, or one matrix (``as_matrix``).
    """
    x: dict[str, np.ndarray] = {}
    matrix = None
    if encoding.as_matrix:
        matrix = np.empty((table.num_rows, len(encoding.columns)), dtype=encoding.matrix_dtype)
    for j, code in enumerate(encoding.columns):
        arr, where = _table_column(table.column(code.name), code)
        if where is not None and unparsed is not None:
            unparsed[code.name] = where
        if matrix is None:
            x[code.name] = arr
        else:
            matrix[:, j] = arr
    return x if matrix is None else matrix



ENCODE_BYTES = 16 << 20  # tables of small blocks are concatenated up to this, then encoded
