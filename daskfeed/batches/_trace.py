"""Which rows a batch of the global order holds, recomputed from the order alone.

An epoch's order is a pure function of the buckets' sizes, the seed and the epoch
(:mod:`daskfeed.batches._order`); batch ``g`` is rows ``[g * batch_size, (g + 1) * batch_size)``
of it, whatever the budget or the number of trainers. This module walks that function back:
the units (buckets) a batch's rows lie in and each row's position in its bucket's canonical
order (:func:`batch_positions`, ``O(K)`` plus the permutation of the one or two units it
touches), then the bucket files' trace columns at those positions — the row's block id and
its place in the block's stored order (:func:`traced`) — and the block's stored order undone
(:func:`file_rows`): each row becomes ``(block, row of the block in file order)``. Nothing is
logged while training: reading one or two buckets' two integer columns is the whole cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daskfeed.batches._order import GlobalOrder, unit_rows
from daskfeed.cache import TRACE_COLUMNS, BlockCache, BucketSet, block_order
from daskfeed.core import DataError


def batch_span(rows: int, batch_size: int, batch: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of an epoch's order that batch ``batch`` holds (the last may be short)."""
    start = int(batch) * int(batch_size)
    return start, min(start + int(batch_size), int(rows))


def batch_positions(order: GlobalOrder, batch_size: int, batch: int) -> list[tuple[int, np.ndarray]]:
    """Batch ``batch``'s rows as ``(bucket, positions in its canonical order)``, in batch order.

    Parameters
    ----------
    order
        The epoch's global order.
    batch_size, batch
        Rows per batch; the batch of the epoch's order (from 0).

    Returns
    -------
    list
        One entry per unit the batch's rows lie in (one, or two where it straddles units).
    """
    start, stop = batch_span(order.rows, batch_size, batch)
    if start >= stop:
        return []
    before = np.asarray([order.rows_before(u) for u in range(order.units + 1)], dtype=np.int64)
    u = int(np.searchsorted(before, start, side="right")) - 1
    out = []
    while start < stop:
        u0, u1 = int(before[u]), int(before[u + 1])
        take = min(stop, u1)
        if take > start:
            perm = unit_rows(u1 - u0, order.unit_seed(u))
            out.append((order.bucket(u), perm[start - u0 : take - u0]))
        start, u = take, u + 1
    return out


def traced(files: BucketSet, picks: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The block ids and stored rows of ``picks`` (:func:`batch_positions`), from the buckets.

    Only the two trace columns of the one or two buckets are read.

    Raises
    ------
    DataError
        A bucket file is missing (the cache was cleared or evicted) or holds other rows.
    """
    ids, rows = [], []
    for b, at in picks:
        try:
            table = files.read_bucket(b, list(TRACE_COLUMNS))
        except OSError as err:
            raise DataError(
                f"Cannot read bucket {b} of the run's global order ({files.bucket_path(b)}). "
                f"Expected the buckets the run trained on.\nReceived: {type(err).__name__}: "
                f"{err}\nHint: the parse cache was cleared or evicted since; run `daskfeed "
                "scan` on the same files with the same cache (--cache DIR) and label, then ask "
                "again: the order is the same.") from err
        if len(at) and int(at.max()) >= table.num_rows:
            raise DataError(
                f"Expected at least {int(at.max()) + 1} rows in bucket {b} "
                f"({files.bucket_path(b)}). Received: {table.num_rows}.\nHint: the buckets "
                "were built again on other data; train again to trace this run's batches.")
        ids.append(table.column(TRACE_COLUMNS[0]).to_numpy()[at])
        rows.append(table.column(TRACE_COLUMNS[1]).to_numpy()[at])
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(ids), np.concatenate(rows)


def block_index(block_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The blocks (indices into ``block_ids``) whose ids are ``wanted`` (int64 views of uint64).

    Raises
    ------
    DataError
        An id that is none of the blocks'.
    """
    keys = np.asarray(block_ids).astype(np.uint64).view(np.int64)
    sort = np.argsort(keys, kind="stable")
    at = np.searchsorted(keys[sort], wanted)
    at = np.minimum(at, len(keys) - 1) if len(keys) else at
    found = sort[at] if len(keys) else at
    if len(wanted) and (not len(keys) or not np.array_equal(keys[found], wanted)):
        raise DataError(
            "Expected the rows of the buckets to come from the run's blocks. Received: block "
            "ids that none of its blocks has.\nHint: the buckets were built again on other "
            "data; train again to trace this run's batches.")
    return found.astype(np.int64)


def file_rows(cache: BlockCache, index: int, stored: Sequence[int] | np.ndarray) -> np.ndarray:
    """Rows of block ``index`` in file order, of its rows ``stored`` in its stored order.

    A block is kept as one or more *pieces* (one table of it each), each in its own seeded
    order (:func:`daskfeed.cache.block_order`), one after another; this undoes that.

    Raises
    ------
    DataError
        The block is not (completely) in the cache any more.
    """
    ranges = cache.lookup(int(index))
    if ranges is None:
        directory = cache.place(int(index))[0]
        raise DataError(
            f"Expected block {index} of the run in its parse cache ({directory}). Received: not "
            "there (the cache was cleared or evicted).\nHint: run `daskfeed scan` on the same "
            "files with the same cache (--cache DIR), then ask again: the order is the same.")
    block_id = cache.block_id(int(index))
    stored = np.asarray(stored, dtype=np.int64)
    out = np.empty(len(stored), dtype=np.int64)
    start = 0
    for piece, (_, _, count, _) in enumerate(ranges):
        mine = (stored >= start) & (stored < start + count)
        if mine.any():
            out[mine] = start + block_order(block_id, count, piece)[stored[mine] - start]
        start += count
    if len(stored) and int(stored.max()) >= start:
        raise DataError(
            f"Expected rows below {start} of block {index} in its parse cache. Received: row "
            f"{int(stored.max())}.\nHint: the cache was rebuilt on other files; train again to "
            "trace this run's batches.")
    return out
