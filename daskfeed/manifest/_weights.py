"""Sample weights: the weight column on the workers.

A window's sample weights as float32 (refusing a missing or negative one), the rows of a block
with a label and a missing or negative weight, and the line of its file where such a row starts.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from daskfeed.cache import block_tables
from daskfeed.core import ManifestMismatchError
from daskfeed.reading import compression_of, is_parquet, line_number, open_file, record_range

if TYPE_CHECKING:
    from _csv import Reader

    from daskfeed.cache import BlockCache
    from daskfeed.reading import Block, ReadOptions


def checked_weights(values: np.ndarray, name: str) -> np.ndarray:
    """Weights as float32, refusing a missing or negative one (the scan said there is none).

    Parameters
    ----------
    values
        A window's weights as float64, NaN where missing.
    name
        The weight column, for the message.

    Returns
    -------
    numpy.ndarray
        The weights as float32.

    Raises
    ------
    ManifestMismatchError
        A weight is missing or negative: the data changed after the scan.
    """
    bad = np.isnan(values) | (values < 0)
    if bad.any():
        first = values[bad][0]
        raise ManifestMismatchError(
            f"Expected a weight >= 0 in every row with a label, as the scan found in weight "
            f"column {name!r}. Received: {int(bad.sum())} row(s) with a "
            f"{'missing' if np.isnan(first) else f'negative ({first:g})'} weight in this window. "
            "The data changed after the scan.\nHint: rescan (remove the cached manifest) and "
            "restart."
        )
    return values.astype(np.float32)


def number_array(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column's values as float64, NaN where missing (text read as numbers).

    Parameters
    ----------
    col
        An Arrow column.

    Returns
    -------
    numpy.ndarray
        Its values as float64.
    """
    t = col.type
    if pa.types.is_null(t):
        return np.full(len(col), np.nan)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    import pandas as pd  # text weights only

    values: np.ndarray = pd.to_numeric(col.to_pandas(), errors="coerce").to_numpy(
        dtype=np.float64, na_value=np.nan)
    return values


def weight_faults(index: int, block: Block, options: ReadOptions, label: str, weight: str,
                  cache: BlockCache | None = None) -> dict[str, Any]:
    """Rows of block ``index`` with a label and a missing or negative weight (on a worker).

    Returns ``{"missing": n, "negative": n, "row": k, "value": v}``: the counts, and the first
    such row (``k``: its place among the block's parsed rows, ``None`` when there is
    none) with its weight (NaN: missing).

    Parameters
    ----------
    index, block
        The block's index and its :class:`~daskfeed.reading.Block`.
    options
        The source's read options.
    label, weight
        The label and weight columns.
    cache
        The parse cache on the workers, or None.

    Returns
    -------
    dict
        The counts and the first bad row, as above.
    """
    out: dict[str, Any] = {"missing": 0, "negative": 0, "row": None, "value": None}
    offset = 0
    for table in block_tables(index, block, options, cache, columns=[label, weight]):
        _count_faults(table, label, weight, offset, out)
        offset += table.num_rows
    return out


def frame_weight_faults(table: pa.Table, label: str, weight: str) -> dict[str, Any]:
    """:func:`weight_faults` of a dask DataFrame's block (a partition), as an Arrow table (on a worker)."""
    out: dict[str, Any] = {"missing": 0, "negative": 0, "row": None, "value": None}
    _count_faults(table, label, weight, 0, out)
    return out


def _count_faults(table: pa.Table, label: str, weight: str, offset: int, out: dict[str, Any]) -> None:
    labelled = ~np.isnan(number_array(table.column(label)))
    w = number_array(table.column(weight))
    missing = labelled & np.isnan(w)
    negative = labelled & (w < 0)
    out["missing"] += int(missing.sum())
    out["negative"] += int(negative.sum())
    bad = np.flatnonzero(missing | negative)
    if len(bad) and out["row"] is None:
        out["row"] = offset + int(bad[0])
        out["value"] = float(w[bad[0]])


def record_line(block: Block, options: ReadOptions, row: int) -> int | None:
    """The line of its file (1-based) where row ``row`` of the CSV block ``block`` starts.

    Rows are counted as the reader makes them: blank lines are no rows, a quoted field may
    span lines, and under ``bad_lines="skip"|"quarantine"`` a line with the wrong number of
    fields is no row. None for Parquet, or when the block has fewer rows.

    Parameters
    ----------
    block
        The CSV block.
    options
        The source's read options (encoding, sep, bad_lines, storage options).
    row
        The row's place among the block's parsed rows.

    Returns
    -------
    int or None
        The 1-based line, or None.
    """
    if is_parquet(block.path):
        return None
    compression = compression_of(block.path)
    with open_file(block.path, dict(options.storage_options), compression) as f:
        header = f.readline()
        width = len(next(csv.reader([header.decode(options.encoding, "replace")],
                                    delimiter=options.sep), []))
        if block.length >= 0:  # a byte range: its records' bytes, as the reader takes them
            start, stop = record_range(f, block, len(header), options.sep)
            f.seek(start)
            body = f.read(max(stop - start, 0))
            first = line_number(f, start)
            if first is None:
                return None
            stream: Any = io.StringIO(body.decode(options.encoding, "replace"), newline="")
        else:
            first = 2
            stream = io.TextIOWrapper(f, encoding=options.encoding, errors="replace", newline="")
        return _nth_record_line(csv.reader(stream, delimiter=options.sep), row, width,
                                options.bad_lines != "error", first)


def _nth_record_line(reader: Reader, row: int, width: int, skip_bad: bool, first: int) -> int | None:
    """The line where record ``row`` of ``reader`` starts, counted as the parser counts rows."""
    n = 0
    consumed = 0  # lines read before the current record
    for fields in reader:
        start, consumed = consumed, reader.line_num
        if not fields or (skip_bad and len(fields) != width):
            continue
        if n == row:
            return first + start
        n += 1
    return None
