"""Stored order: each block's rows in a seeded random order, applied as the cache is read.

Every block has a *stored order* (:func:`block_order`, seeded by the block's id alone — its
part's key and its number there, :meth:`daskfeed.cache.BlockCache.place`: the same files give the
same order, whatever the run's seed, budget or model, and whatever other files the data set
has). A block parsed as one table (a byte range of a CSV: the usual case) is permuted as a whole;
a block that comes as several tables (a gzip file or a file streamed in pieces, a Parquet file's
row groups) has each *piece* permuted on its own; a block's ranges in the cache are its pieces.

The cache keeps each piece's rows in its file's order (the scan writes what it parsed, with no
copy to permute it); a reader that wants the stored order (the buckets' deal, a row traced back
from a step) takes its rows by :func:`scatter_order`, a reader of the file's order
(:func:`daskfeed.cache._blocks.block_tables`) reads them as they are. A contiguous range of a
block's stored rows is a random sample of that block: the global order
(:mod:`daskfeed.batches._order`) deals a block's ``i``-th stored row to bucket ``i + o_j``.
"""

from __future__ import annotations

import numpy as np

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
