"""Feed: runs ON WORKERS — a window's partitions → compact, shuffled numpy arrays.

Only what the model needs crosses the wire: float32 numeric features (missing → the mean),
int32 codes for string columns (0 = missing, 1 = out of vocabulary, 2.. = vocabulary), and the
label. Rows are permuted across all partitions of the window with the plan's window seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ColumnCode", "Encoding", "WindowData", "concat", "encode_frame", "encode_table",
           "encode_window", "read_window"]

MISSING_CODE = 0
OOV_CODE = 1
VOCAB_OFFSET = 2


@dataclass(frozen=True)
class ColumnCode:
    """How one column is encoded."""

    name: str
    kind: str  # numeric | categorical | datetime
    fill: float = 0.0
    vocabulary: tuple[str, ...] = ()

    @property
    def input_dim(self) -> int:
        """Embedding input size for a categorical column (missing + OOV + vocabulary)."""
        return len(self.vocabulary) + VOCAB_OFFSET


@dataclass(frozen=True)
class Encoding:
    """What a worker needs to turn rows into arrays; derived from a Manifest."""

    label: str
    label_dtype: str  # float32 | int32
    columns: tuple[ColumnCode, ...]
    as_matrix: bool = False

    @classmethod
    def from_manifest(cls, manifest: Any, features: list[str], as_matrix: bool = False) -> Encoding:
        """Build the encoding of ``features`` from a manifest's statistics."""
        from daskfeed.exceptions import SchemaError

        codes = []
        for name in features:
            col = manifest.columns[name]
            if as_matrix and col.kind != "numeric":
                raise SchemaError(
                    f"as_matrix=True stacks numeric columns into one float32 matrix. Received: "
                    f"column {name!r} of kind {col.kind!r}.\nHint: pass features=[...] with "
                    "numeric columns only, or use the dict form (as_matrix=False)."
                )
            codes.append(ColumnCode(name, col.kind, col.fill_value, tuple(col.vocabulary)))
        label_dtype = "int32" if manifest.task == "multiclass" else "float32"
        return cls(manifest.label, label_dtype, tuple(codes), as_matrix)

    @property
    def bytes_per_row(self) -> int:
        """Encoded bytes per row (features + label)."""
        return 4 * (len(self.columns) + 1)


@dataclass
class WindowData:
    """A window's encoded rows: ``x`` (dict or matrix) and ``y``."""

    x: dict[str, np.ndarray] | np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        xs = self.x.values() if isinstance(self.x, dict) else [self.x]
        return int(sum(a.nbytes for a in xs) + self.y.nbytes)

    def take(self, start: int, stop: int) -> WindowData:
        """Rows ``[start, stop)`` as views (no copy)."""
        if isinstance(self.x, dict):
            return WindowData({k: v[start:stop] for k, v in self.x.items()}, self.y[start:stop])
        return WindowData(self.x[start:stop], self.y[start:stop])


def _encode_column(s: pd.Series, code: ColumnCode) -> np.ndarray:
    if code.kind == "categorical":
        values = s if pd.api.types.is_string_dtype(s.dtype) else s.astype("string")
        cat = pd.Categorical(values, categories=list(code.vocabulary))
        codes = cat.codes.astype(np.int32) + VOCAB_OFFSET  # -1 (unknown or NaN) → 1
        missing = s.isna().to_numpy()
        if missing.any():
            codes[missing] = MISSING_CODE
        return codes
    if code.kind == "datetime":
        ts = pd.to_datetime(s, errors="coerce")
        arr = (ts.astype("int64").to_numpy() / 1e9).astype(np.float32)
        arr[ts.isna().to_numpy()] = np.float32(code.fill)
        return arr
    arr = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float32, na_value=np.nan)
    nan = np.isnan(arr)
    if nan.any():
        arr[nan] = np.float32(code.fill)
    return arr


def encode_frame(df: pd.DataFrame, encoding: Encoding) -> WindowData:
    """Encode a pandas frame in row order; rows without a label are dropped."""
    if encoding.label not in df.columns:
        from daskfeed.exceptions import SchemaError

        raise SchemaError(
            f"Expected label column {encoding.label!r} in every partition. Received: columns "
            f"{list(df.columns)[:20]}.\nHint: give all files the same header."
        )
    label = pd.to_numeric(df[encoding.label], errors="coerce")
    keep = label.notna().to_numpy()
    if not keep.all():
        df = df.loc[keep]
        label = label.loc[keep]
    y = label.to_numpy(dtype=np.float64).astype(encoding.label_dtype)
    if encoding.as_matrix:
        x = np.empty((len(df), len(encoding.columns)), dtype=np.float32)
        for j, code in enumerate(encoding.columns):
            x[:, j] = _encode_column(df[code.name], code)
        return WindowData(x, y)
    return WindowData({c.name: _encode_column(df[c.name], c) for c in encoding.columns}, y)


def concat(parts: list[WindowData]) -> WindowData:
    """Rows of several pieces, in order (the piece itself when there is one)."""
    if len(parts) == 1:
        return parts[0]
    y = np.concatenate([p.y for p in parts])
    if isinstance(parts[0].x, dict):
        return WindowData({k: np.concatenate([p.x[k] for p in parts]) for k in parts[0].x}, y)
    return WindowData(np.concatenate([p.x for p in parts]), y)


def _permute(data: WindowData, seed: Any) -> WindowData:
    if seed is None or len(data) < 2:
        return data
    perm = np.random.default_rng(list(seed)).permutation(len(data))
    if isinstance(data.x, dict):
        return WindowData({k: v[perm] for k, v in data.x.items()}, data.y[perm])
    return WindowData(data.x[perm], data.y[perm])


def _empty(encoding: Encoding) -> WindowData:
    empty = pd.DataFrame({c.name: pd.Series([], dtype="float64") for c in encoding.columns}
                         | {encoding.label: pd.Series([], dtype="float64")})
    return encode_frame(empty, encoding)


def encode_window(*frames: pd.DataFrame, encoding: Encoding, seed: Any = None) -> WindowData:
    """Encode a window's partitions and shuffle rows across all of them (on a worker)."""
    parts = [encode_frame(f, encoding) for f in frames if len(f)]
    return _permute(concat(parts), seed) if parts else _empty(encoding)


def _label_array(col: Any, encoding: Encoding) -> tuple[np.ndarray, np.ndarray | None]:
    """Label values as float64 and the mask of rows that have one (None: all do)."""
    import pyarrow as pa

    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_dictionary(
            col.type):
        v = pd.to_numeric(col.to_pandas(), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        v = col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    keep = ~np.isnan(v)
    return v, (None if keep.all() else keep)


def _table_column(col: Any, code: ColumnCode) -> np.ndarray:
    """One Arrow column → the feed's array (the pandas path for anything unusual)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if pa.types.is_null(t):
        if code.kind == "categorical":
            return np.full(len(col), MISSING_CODE, dtype=np.int32)
        return np.full(len(col), np.float32(code.fill), dtype=np.float32)
    if code.kind == "numeric" and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        # safe=False: rounding to float32 as numpy does (ints above 2**24, e.g. timestamps)
        arr = col.cast(pa.float32(), safe=False).to_numpy(zero_copy_only=False)
        nan = np.isnan(arr)
        if nan.any():
            arr = arr.copy() if not arr.flags.writeable else arr
            arr[nan] = np.float32(code.fill)
        return arr
    if code.kind == "categorical" and (pa.types.is_string(t) or pa.types.is_large_string(t)
                                       or pa.types.is_dictionary(t)):
        if not pa.types.is_dictionary(t):
            col = pc.dictionary_encode(col)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if isinstance(col, pa.ChunkedArray):  # zero chunks
            return np.zeros(0, dtype=np.int32)
        lookup = pd.Index(list(code.vocabulary)).get_indexer(col.dictionary.to_pandas())
        lookup = (lookup + VOCAB_OFFSET).astype(np.int32)
        lookup[lookup < VOCAB_OFFSET] = OOV_CODE  # not in the vocabulary
        idx = pc.fill_null(col.indices, 0).to_numpy(zero_copy_only=False)
        valid = np.asarray(col.is_valid())
        out = lookup[idx] if len(lookup) else np.full(len(idx), OOV_CODE, np.int32)
        out[~valid] = MISSING_CODE
        return out.astype(np.int32, copy=False)
    if code.kind == "datetime" and pa.types.is_timestamp(t):
        arr = epoch_seconds(col).astype(np.float32)
        arr[~np.asarray(col.is_valid())] = np.float32(code.fill)
        return arr
    return _encode_column(col.to_pandas(), code)


def epoch_seconds(col: Any) -> np.ndarray:
    """Seconds since 1970 of a timestamp column, in its own unit (no overflow past 2262)."""
    import pyarrow as pa

    scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[col.type.unit]
    ticks = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return np.asarray(ticks, dtype=np.float64) / scale


def encode_table(table: Any, encoding: Encoding) -> WindowData:
    """Encode an Arrow table in row order, without pandas (rows without a label are dropped).

    Same result as :func:`encode_frame`; columns are taken by name, so files whose header
    lists the same columns in another order line up.
    """
    if encoding.label not in table.column_names:
        from daskfeed.exceptions import SchemaError

        raise SchemaError(
            f"Expected label column {encoding.label!r} in every partition. Received: columns "
            f"{table.column_names[:20]}.\nHint: give all files the same header."
        )
    y, keep = _label_array(table.column(encoding.label), encoding)
    if keep is not None:
        import pyarrow as pa

        table = table.filter(pa.array(keep))
        y = y[keep]
    y = y.astype(encoding.label_dtype)
    if encoding.as_matrix:
        x = np.empty((table.num_rows, len(encoding.columns)), dtype=np.float32)
        for j, code in enumerate(encoding.columns):
            x[:, j] = _table_column(table.column(code.name), code)
        return WindowData(x, y)
    return WindowData({c.name: _table_column(table.column(c.name), c) for c in encoding.columns}, y)


ENCODE_BYTES = 16 << 20  # tables of small partitions are concatenated up to this, then encoded


def read_window(blocks: list[tuple[int, Any]], options: Any, encoding: Encoding, seed: Any = None,
                cache: Any = None) -> WindowData:
    """Read, encode and shuffle a window of ``(index, block)`` partitions in one task (on a worker).

    Tables come from the parse cache when ``cache`` holds the partition (only the columns the
    encoding needs), else are parsed from CSV (and written to the cache). They are encoded in
    runs of about ``ENCODE_BYTES`` (thousands of small files are not encoded one by one), so the
    task's peak memory is one such run plus the window's compact arrays, and no parsed frame
    crosses the network.
    """
    from daskfeed.cache import block_tables

    parts: list[WindowData] = []
    run: list[Any] = []
    size = 0
    columns = [encoding.label, *(c.name for c in encoding.columns)]
    readers: dict[str, Any] = {}  # each cache file opened once per window
    for index, block in blocks:
        for table in block_tables(index, block, options, cache, columns=columns, readers=readers):
            if table.num_rows:
                run.append(table)
                size += table.nbytes
            del table
            if size >= ENCODE_BYTES:
                parts.extend(_encode_run(run, encoding))
                run, size = [], 0
                readers.clear()  # unmap what was read: the task holds one run, not the window
    parts.extend(_encode_run(run, encoding))
    return _permute(concat(parts), seed) if parts else _empty(encoding)


def _encode_run(tables: list[Any], encoding: Encoding) -> list[WindowData]:
    """Encode tables in order: as one when their columns line up, else one by one."""
    import pyarrow as pa

    if len(tables) > 1:
        try:
            tables = [pa.concat_tables(tables, promote_options="permissive")]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers in one file, text in another
            pass
    return [encode_table(t, encoding) for t in tables]
