"""The line of a row: any row of a manifest's block traced to its line in its file.

A block of the manifest has its first line (``line``: that of its first record; the header is
line 1) and, only when its rows are not one per line (a quoted field over lines, blank lines,
lines skipped as malformed), each row's line from there (``row_lines``, packed: the
differences as int64, zlib, base64, as :mod:`daskfeed.manifest._packing` packs; a million
rows, one in a hundred over two lines, pack to 35 kB, unpacked only when asked); the scan
counts them (:mod:`daskfeed.reading._lines`). Rows are numbered in file order from 0, every
row parsed (``raw_rows``, rows without a label too). Lines are counted as an editor counts them: a quoted
field's line breaks and blank lines count. A block without a known line (a manifest of an
older daskfeed, a Parquet file, a dask DataFrame, a block whose rows' lines the scan could not
find) gives None.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from daskfeed.manifest._packing import _pack_bytes, _unpack_bytes


def row_line(block: Mapping[str, Any], row: int) -> int | None:
    """The line of row ``row`` of a manifest's block in its file (1-based; the header is line 1).

    Parameters
    ----------
    block
        One of :attr:`Manifest.blocks <daskfeed.Manifest.blocks>`.
    row
        The row's number in the block, in file order from 0, counting every row parsed
        (``raw_rows``: rows without a label too).

    Returns
    -------
    int or None
        The line its record starts on; None when the block's lines are not known.

    Raises
    ------
    IndexError
        When the block has no such row.

    Examples
    --------
    >>> row_line({"path": "a.csv", "offset": 0, "length": -1, "rows": 3, "raw_rows": 3,
    ...           "line": 2}, 1)
    3
    """
    lines = row_lines(block, [row])
    return None if lines is None else int(lines[0])


def row_lines(block: Mapping[str, Any], rows: Sequence[int] | np.ndarray) -> np.ndarray | None:
    """The lines of many rows of one block (see :func:`row_line`), at once.

    Parameters
    ----------
    block
        One of :attr:`Manifest.blocks <daskfeed.Manifest.blocks>`.
    rows
        Row numbers in the block (file order from 0, every row parsed).

    Returns
    -------
    numpy.ndarray or None
        int64, the line of each row; None when the block's lines are not known.

    Raises
    ------
    IndexError
        When the block has no such row.
    """
    at = np.asarray(rows, dtype=np.int64).reshape(-1)
    n = int(block.get("raw_rows", block.get("rows", 0)))
    bad = at[(at < 0) | (at >= n)]
    if bad.size:
        raise IndexError(
            f"Expected row numbers 0 to {n - 1} of the block {_where(block)} ({n:,} rows). "
            f"Received: row {int(bad[0])}.\nHint: rows are counted in file order from 0 within "
            "their block, every row parsed (raw_rows), rows without a label too.")
    line = block.get("line")
    if not line:
        return None
    packed = block.get("row_lines")
    if packed is None:
        return at + int(line)
    offsets = _unpacked(packed) if isinstance(packed, str) else np.asarray(packed, np.int64)
    if offsets.size != n:  # (damaged: not a line per row) not known, never a wrong line
        return None
    return offsets[at] + int(line)


def pack_row_lines(offsets: Sequence[int] | np.ndarray) -> str:
    """The lines of a block's rows from its first line, packed (the form ``row_lines`` has).

    Parameters
    ----------
    offsets
        One per row, in file order.

    Returns
    -------
    str
        Their differences as int64 little-endian, zlib-compressed, base64 (plain JSON).
    """
    arr = np.asarray(offsets, dtype=np.int64)
    return _pack_bytes(np.diff(arr, prepend=0).astype("<i8").tobytes())


@functools.lru_cache(maxsize=16)
def _unpacked(text: str) -> np.ndarray:
    """:func:`pack_row_lines` undone (the last few kept: one block's rows asked one by one)."""
    try:
        diffs = np.frombuffer(_unpack_bytes(text), "<i8")
    except (ValueError, zlib.error):  # damaged (not base64, not zlib, not whole int64s)
        return np.zeros(0, np.int64)
    out = np.cumsum(diffs, dtype=np.int64)
    out.flags.writeable = False
    return out


def _where(block: Mapping[str, Any]) -> str:
    path, offset, length = block.get("path", "?"), block.get("offset", 0), block.get("length", -1)
    return f"{path} (whole file)" if length is None or length < 0 else (
        f"{path} bytes {offset}-{offset + length}")
