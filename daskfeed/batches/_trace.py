"""Which rows a batch of the global order holds, recomputed from the order alone.

An epoch's order is a pure function of the buckets' sizes, the seed and the epoch
(:mod:`daskfeed.batches._order`); batch ``g`` is rows ``[g * batch_size, (g + 1) * batch_size)``
of it, whatever the budget or the number of trainers. This module walks that function back,
from the blocks' row counts and ids alone (no bucket file is read, so a run stays traceable
after its buckets were dealt again or swept): the units (buckets) a batch's rows lie in and each
row's position in its bucket's canonical order (:func:`batch_positions`, ``O(K)`` plus the
permutation of the one or two units it touches); the block and row each position is
(:class:`BucketRows`, ``O(blocks)`` per bucket); then the block's stored order undone
(:func:`file_rows`): each row becomes ``(block, row of the block in file order)``. Nothing is
logged while training.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from daskfeed.batches._order import GlobalOrder, block_offsets, bucket_sizes, unit_rows
from daskfeed.cache import block_order
from daskfeed.core import DataError


def batch_span(rows: int, batch_size: int, batch: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of an epoch's order that batch ``batch`` holds (the last may be short)."""
    start = int(batch) * int(batch_size)
    return start, min(start + int(batch_size), int(rows))


def batch_positions(order: GlobalOrder, batch_size: int, batch: int,
                    units: Callable[[int], np.ndarray] | None = None) -> list[tuple[int, np.ndarray]]:
    """Batch ``batch``'s rows as ``(bucket, positions in its canonical order)``, in batch order.

    Parameters
    ----------
    order
        The epoch's global order.
    batch_size, batch
        Rows per batch; the batch of the epoch's order (from 0).
    units
        Unit ``u``'s permutation (canonical bucket order -> the epoch's); default: drawn here
        (:func:`~daskfeed.batches.unit_rows`). A caller tracing many batches keeps them.

    Returns
    -------
    list
        One entry per unit the batch's rows lie in (one, or two where it straddles units).
    """
    start, stop = batch_span(order.rows, batch_size, batch)
    if start >= stop:
        return []
    before = order.starts
    u = int(np.searchsorted(before, start, side="right")) - 1
    out = []
    while start < stop:
        u0, u1 = int(before[u]), int(before[u + 1])
        take = min(stop, u1)
        if take > start:
            perm = unit_rows(u1 - u0, order.unit_seed(u)) if units is None else units(u)
            out.append((order.bucket(u), perm[start - u0 : take - u0]))
        start, u = take, u + 1
    return out


def dealt_sizes(counts: Sequence[int] | np.ndarray, ids: np.ndarray, buckets: int) -> list[int]:
    """Rows of each of ``buckets`` buckets that blocks of ``counts`` rows and ids ``ids`` deal."""
    return [int(n) for n in bucket_sizes(counts, block_offsets(ids, buckets), buckets)]


class BucketRows:
    """Which ``(block, row)`` each position of a bucket's canonical order is, from the blocks alone.

    A bucket's canonical order is its rows by block id, then by row (what its files hold before
    an epoch permutes it); block ``j`` gives bucket ``b`` its rows
    ``(b - o_j) mod K, + K, ...`` — so position ``c`` of a bucket is found with one
    ``searchsorted`` over the blocks' member counts: ``O(blocks)`` per bucket (kept for the
    next batch), no file read.

    Parameters
    ----------
    counts
        Rows with a label of each block (the manifest's).
    ids
        The blocks' ids (:meth:`daskfeed.cache.BlockCache.block_ids`).
    buckets
        ``K``.
    """

    def __init__(self, counts: Sequence[int] | np.ndarray, ids: np.ndarray, buckets: int) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.buckets = int(buckets)
        self.order = np.argsort(np.asarray(ids).astype(np.uint64).view(np.int64), kind="stable")
        self.offsets = block_offsets(ids, self.buckets)
        self._kept: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _bucket(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if b not in self._kept:
            if len(self._kept) > 64:
                self._kept.clear()
            k, n = self.buckets, self.counts
            first = (b - self.offsets) % k
            members = np.where(n > first, (n - first + k - 1) // k, 0)[self.order]
            self._kept[b] = first, members, np.cumsum(members)
        return self._kept[b]

    def rows(self, picks: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """``(block, row)`` of each of ``picks`` (:func:`batch_positions`).

        Returns
        -------
        tuple of numpy.ndarray
            The blocks (indices) and each row's number among its block's rows with a label, in
            the block's stored order (int64 each).
        """
        blocks, rows = [], []
        for b, at in picks:
            first, members, ends = self._bucket(int(b))
            at = np.asarray(at, dtype=np.int64)
            s = np.searchsorted(ends, at, side="right")
            j = self.order[s]
            blocks.append(j)
            rows.append(first[j] + self.buckets * (at - (ends[s] - members[s])))
        if not blocks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(blocks).astype(np.int64), np.concatenate(rows).astype(np.int64)


_KEPT_BYTES = 256 * 2**20  # stored orders kept for the next steps of the same blocks, at most


class _StoredOrders:
    """Pieces' stored orders, the latest kept up to :data:`_KEPT_BYTES` (thread-safe).

    A step of the global order touches up to ``batch_size`` blocks; the next steps touch the same
    ones. Each order is kept as int32 (a piece has fewer than 2**31 rows), read-only.
    """

    def __init__(self, limit: int = _KEPT_BYTES) -> None:
        self.limit = limit
        self._kept: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, block_id: int, rows: int, piece: int) -> np.ndarray:
        key = (block_id, rows, piece)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        order = block_order(block_id, rows, piece).astype(np.int32)  # (numpy lets the GIL go)
        order.flags.writeable = False
        with self._lock:
            if key not in self._kept:
                self._kept[key] = order
                self._bytes += order.nbytes
            while self._bytes > self.limit and len(self._kept) > 1:
                self._bytes -= self._kept.popitem(last=False)[1].nbytes
        return order


_stored_order = _StoredOrders()


def file_rows(block_id: int, stored: Sequence[int] | np.ndarray, pieces: Sequence[int], *,
              index: int) -> np.ndarray:
    """Rows of a block in file order, of its rows ``stored`` in its stored order.

    A block is kept as one or more *pieces* (one table of it each), each in its own seeded
    order (:func:`daskfeed.cache.block_order`), one after another; this undoes that. A block
    parsed as one table (a byte range of a plain CSV file, the usual case) is one piece of all
    its rows; a compressed file's, parsed in pieces, has the cache's ranges of the block
    (:meth:`daskfeed.cache.BlockCache.lookup`).

    Parameters
    ----------
    block_id
        The id that seeds the block's stored order (:meth:`daskfeed.cache.CacheLayout.block_id`).
    stored
        The block's rows in stored order (rows without a label counted).
    pieces
        The rows of each of its pieces, in order.
    index
        The block's number in the manifest (named in an error).

    Raises
    ------
    DataError
        A row past the block's pieces (a cache rebuilt on other files).
    """
    stored = np.asarray(stored, dtype=np.int64)
    total = int(sum(int(c) for c in pieces))
    if len(stored) and (int(stored.max()) >= total or int(stored.min()) < 0):
        raise DataError(
            f"Expected rows 0 to {total - 1} of block {index}. Received: row "
            f"{int(stored.max()) if int(stored.max()) >= total else int(stored.min())}.\nHint: the "
            "cache was rebuilt on other files; train again to trace this run's batches.")
    if len(pieces) == 1:  # (the usual case: one permutation, indexed)
        out: np.ndarray = _stored_order(int(block_id), total, 0)[stored].astype(np.int64)
        return out
    out = np.empty(len(stored), dtype=np.int64)
    start = 0
    for piece, count in enumerate(pieces):
        mine = (stored >= start) & (stored < start + int(count))
        if mine.any():
            out[mine] = start + _stored_order(int(block_id), int(count), piece)[stored[mine] - start]
        start += int(count)
    return out
