"""Stored order: each block's rows are kept in the cache in a seeded random order.

The scan writes every block once; while it is in memory its rows are permuted
(:func:`block_order`, seeded by the block's id alone — its part's key and its number there,
:meth:`daskfeed.cache.BlockCache.place`: the same files give the same cache, whatever
the run's seed, budget or model, and whatever other files the data set has). A block parsed
as one table (a byte range of a CSV: the usual case) is permuted as a whole; a block that comes
as several tables (a gzip file or a file streamed in pieces, a Parquet file's row groups) has
each *piece* permuted on its own, so that the scan never holds more than one table of it; a piece
is written whole, as one range of rows of one file, so a block's ranges in the cache are its
pieces.

A contiguous range of a block's stored rows is then a random sample of that block, so a window
that takes a range of every block is a stratified sample of the whole data set
(:mod:`daskfeed.batches._order`) and reads each block in runs, not row by row. Readers that want
the file's order (:func:`daskfeed.cache._blocks.block_tables`) undo the permutation
(:func:`unscatter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

_TAG = 0x5CA7  # the stored order's own stream of random numbers


def block_order(index: int, rows: int, piece: int = 0) -> np.ndarray:
    """Stored position ``k`` holds row ``block_order(index, rows, piece)[k]`` of the piece.

    Parameters
    ----------
    index
        The block's id (:meth:`daskfeed.cache.BlockCache.place`; without a cache, its
        number in its source).
    rows
        The piece's rows (all of them, with or without a label).
    piece
        The piece of the block (0: the first table it is parsed as, the whole block usually).

    Returns
    -------
    numpy.ndarray
        A permutation of ``range(rows)`` (int64).
    """
    return np.random.default_rng([_TAG, int(index), int(piece)]).permutation(int(rows))


def scatter(index: int, table: pa.Table, piece: int = 0) -> pa.Table:
    """Piece ``piece`` of block ``index`` (a table, in file order) in its stored order."""
    if table.num_rows < 2:
        return table
    return table.take(block_order(index, table.num_rows, piece))


def scatter_order(parts: list[tuple[int, int, int]]) -> np.ndarray:
    """Pieces one after another (``(block index, rows, piece)`` each), each in its stored order.

    Parameters
    ----------
    parts
        The pieces, in the order their rows come.

    Returns
    -------
    numpy.ndarray
        The positions to take, in stored order (int64).
    """
    start, order = 0, []
    for index, rows, piece in parts:
        order.append(start + block_order(index, rows, piece))
        start += rows
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)


def unscatter(index: int, table: pa.Table, piece: int = 0) -> pa.Table:
    """Piece ``piece`` of block ``index`` (a table, in stored order) in file order."""
    rows = table.num_rows
    if rows < 2:
        return table
    inverse = np.empty(rows, dtype=np.int64)
    inverse[block_order(index, rows, piece)] = np.arange(rows)
    return table.take(inverse)
