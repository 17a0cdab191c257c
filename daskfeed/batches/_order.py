"""One global order: an epoch's rows in an order set by the data, the seed and the epoch alone.

The rows of a data set are dealt once into ``K`` *buckets* (:func:`bucket_count`, from the rows
alone): block ``j``'s ``i``-th row in its stored order (a seeded random order,
:mod:`daskfeed.cache._scatter`) goes to bucket ``(i + o_j) mod K``, where the offset ``o_j``
(:func:`block_offsets`) is drawn from the block's id. Each bucket is so a proportional,
stratified random sample of the whole data set (every block gives it ``n_j / K`` rows, ±1,
chosen at random within the block). The scan's parse cache is turned into one Arrow file per
bucket once per data set (:mod:`daskfeed.batches._buckets`), so reading a bucket costs its
own size, whatever the number of blocks, files or parts.

An epoch is the ``K`` buckets in an order drawn from ``(seed, epoch)``: *unit* ``u`` is bucket
``GlobalOrder.bucket(u)``, its rows permuted with their own seed (:meth:`GlobalOrder.unit_seed`);
the epoch is unit 0's rows, then unit 1's, and so on; batch ``g`` is rows
``[g * batch_size, (g + 1) * batch_size)`` of that order. Within a bucket a batch is an iid
sample of the data set; a bucket holds about ``BUCKET_ROWS`` rows.

Neither the budget nor the number of trainers changes the order. The budget decides how many
consecutive units a *window* holds (what a worker reads at once); the trainers decide who takes
which batch: trainer ``rank`` of ``world`` takes batches ``origin + rank, origin + rank + world,
...``, where ``origin`` is the first batch of the epoch not yet trained. So a checkpoint is a
position in the order (the batches trained before it), and a resume continues there under any
budget, worker count or world size (:class:`Lanes`).

Planning an epoch costs ``O(K)`` (the buckets' sizes, permuted and summed); the sizes come from
the blocks' rows in ``O(blocks + K)`` (:func:`bucket_sizes`) without reading any data. Without
the parse cache (or with a dask DataFrame, or no shuffle) the plan is one of windows of blocks
(:func:`daskfeed.batches._plan.make_plan`), whose order depends on the window size.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from daskfeed.batches._skips import is_skipped, kept_batch, kept_before

# 1: units were a run of every block; 2: buckets; 3: K a power of two, by block id; 4: block ids
# anchored at their part's first file (a part that grew keeps its blocks' ids)
ORDER_VERSION = 4
ORDER_FORMATS = {1: "units of a run of every block", 2: "whole buckets, rows in block order",
                 3: "whole buckets, a power of two of them, rows in block-id order",
                 4: "whole buckets, a power of two of them, block ids anchored at a part's first "
                    "file"}
BUCKET_ROWS = 1 << 16  # rows of a bucket, about (a window holds whole buckets) ...
BUCKET_BYTES = 8 << 20  # ... and at most about this many bytes of CSV (wide rows: fewer rows)
MIN_BUCKETS = 64  # buckets of a data set at least, on small data ...
MIN_BUCKET_ROWS = 1024  # ... while they keep this many rows


def bucket_count(rows: int, nbytes: int = 0) -> int:
    """``K``: the buckets of a data set of ``rows`` rows and ``nbytes`` bytes of CSV.

    A power of two: at most about ``BUCKET_ROWS`` rows each (between half and all of it), and
    no more than about ``BUCKET_BYTES`` of CSV (a window holds whole buckets: this keeps one
    small beside any budget the CLI accepts, whatever the width of a row); on small data up to
    ``MIN_BUCKETS`` of about ``MIN_BUCKET_ROWS`` rows (so that a small data set still has
    several windows). The data alone decide it, and a power of two keeps it through growth: a
    data set keeps its ``K`` (and its buckets, new rows dealt into them) until it doubles.

    Parameters
    ----------
    rows
        The data set's rows (with a label; every trainer's together).
    nbytes
        Its CSV bytes (0: rows alone decide).

    Returns
    -------
    int
        A power of two, at least 1.
    """
    rows = int(rows)
    wide = min(-(-int(nbytes) // BUCKET_BYTES), rows // MIN_BUCKET_ROWS)  # buckets of >= 1,024 rows
    k = max(1, -(-rows // BUCKET_ROWS), wide)
    small = min(MIN_BUCKETS, rows // MIN_BUCKET_ROWS)
    if small > k:  # small data: buckets of at least MIN_BUCKET_ROWS rows (a power of two below)
        return 1 << (small.bit_length() - 1)
    return 1 << (k - 1).bit_length()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 (a seeded hash of block ids, vectorized)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def block_offsets(ids: Sequence[int] | np.ndarray, buckets: int) -> np.ndarray:
    """``o_j``: the bucket that row 0 of each block (by its id) goes to.

    Parameters
    ----------
    ids
        The blocks' ids modulo 2**64 (:meth:`~daskfeed.cache._blocks.BlockCache.block_ids`: the
        same for the same block of the same files in every data set).
    buckets
        ``K``.

    Returns
    -------
    numpy.ndarray
        int64, ``0 <= o_j < K``.
    """
    raw = np.asarray(ids).astype(np.uint64)
    return (_mix(raw) % np.uint64(max(int(buckets), 1))).astype(np.int64)


def bucket_of(offsets: np.ndarray, rows: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each row of blocks, ``(i + o_j) mod K``, block after block.

    Parameters
    ----------
    offsets
        Each block's :func:`block_offsets` offset ``o_j``.
    rows
        Each block's rows dealt (its rows with a label, in its stored order: ``i = 0, 1, ...``).
    buckets
        ``K``.

    Returns
    -------
    numpy.ndarray
        int64, ``rows.sum()`` of them: block 0's rows' buckets, then block 1's, ...
    """
    n = np.asarray(rows, dtype=np.int64)
    firsts = np.cumsum(n) - n  # (each block's first row among all of them)
    shift = np.asarray(offsets).astype(np.int64) - firsts
    out: np.ndarray = (np.arange(int(n.sum()), dtype=np.int64) + np.repeat(shift, n)) % int(buckets)
    return out


def bucket_sizes(counts: Sequence[int] | np.ndarray, offsets: np.ndarray, buckets: int) -> np.ndarray:
    """Rows of each bucket, from the blocks' rows and offsets alone (``O(blocks + K)``).

    Block ``j`` of ``n_j = q_j K + r_j`` rows gives every bucket ``q_j`` rows, and one more to
    the ``r_j`` buckets ``o_j, o_j + 1, ...`` (mod ``K``): a circular run, summed with a
    difference array.

    Parameters
    ----------
    counts
        Rows per block.
    offsets
        :func:`block_offsets` of the blocks.
    buckets
        ``K``.

    Returns
    -------
    numpy.ndarray
        int64 of length ``K``.
    """
    k = int(buckets)
    n = np.asarray(counts, dtype=np.int64)
    q, r = np.divmod(n, k)
    diff = np.zeros(k + 1, dtype=np.int64)
    o = np.asarray(offsets, dtype=np.int64)
    end = o + r
    np.add.at(diff, o, 1)
    np.add.at(diff, np.minimum(end, k), -1)
    wrap = end > k
    np.add.at(diff, np.zeros(int(wrap.sum()), dtype=np.int64), 1)
    np.add.at(diff, end[wrap] - k, -1)
    return np.cumsum(diff[:k]) + int(q.sum())


def bucket_members(counts: Sequence[int], offsets: np.ndarray, buckets: int,
                   bucket: int, ids: Sequence[int] | np.ndarray | None = None,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Bucket ``bucket``'s rows in their canonical order: ``(block j, stored row i)`` each.

    Canonical: by the block's id (:func:`canonical_order`), then by row — what a bucket's
    Arrow files hold, before an epoch permutes it; the same whatever the generations the
    bucket's rows were dealt in. Reads every block's count: for tests and small data, not for
    the feed.

    Parameters
    ----------
    ids
        The blocks' ids (None: their indices).

    Returns
    -------
    tuple of numpy.ndarray
        The blocks (indices) and rows (int64 each).
    """
    js, rows = [], []
    for j, n in enumerate(counts):
        first = (int(bucket) - int(offsets[j])) % int(buckets)
        i = np.arange(first, int(n), int(buckets), dtype=np.int64)
        js.append(np.full(len(i), j, dtype=np.int64))
        rows.append(i)
    if not js:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    block, row = np.concatenate(js), np.concatenate(rows)
    keys = block if ids is None else np.asarray(ids).astype(np.uint64).view(np.int64)[block]
    at = canonical_order(keys, row)
    return block[at], row[at]


def canonical_order(blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The permutation that sorts rows by block id (as int64), then by row: a bucket's order."""
    return np.lexsort((np.asarray(rows), np.asarray(blocks)))


@dataclass(frozen=True)
class GlobalOrder:
    """The units of one epoch (see the module docstring).

    Attributes
    ----------
    sizes
        Rows of each bucket (``K`` of them).
    seed, epoch
        What the buckets' order and the units' permutations are drawn from.
    """

    sizes: tuple[int, ...]
    seed: int
    epoch: int

    @classmethod
    def of(cls, sizes: Sequence[int] | np.ndarray, seed: int, epoch: int) -> GlobalOrder:
        """The order of ``epoch`` over buckets of ``sizes`` rows.

        Parameters
        ----------
        sizes
            Rows of each bucket (:func:`~daskfeed.batches.dealt_sizes`).
        seed, epoch
            The run's seed, the epoch.

        Returns
        -------
        GlobalOrder
        """
        return cls(tuple(int(s) for s in sizes), int(seed), int(epoch))

    @property
    def units(self) -> int:
        """``K``: units (buckets) of the epoch."""
        return len(self.sizes)

    @functools.cached_property
    def permutation(self) -> np.ndarray:
        """Unit ``u`` is bucket ``permutation[u]``."""
        return np.random.default_rng([self.seed, self.epoch, 3]).permutation(self.units)

    @functools.cached_property
    def _before(self) -> np.ndarray:
        s = np.asarray(self.sizes, dtype=np.int64)[self.permutation]
        return np.concatenate([[0], np.cumsum(s)])

    @property
    def rows(self) -> int:
        """Rows of the epoch."""
        return int(self._before[-1])

    @property
    def starts(self) -> np.ndarray:
        """Where each unit starts in the epoch's order, then the epoch's rows (``K + 1`` ints)."""
        return self._before

    def bucket(self, u: int) -> int:
        """The bucket that is unit ``u``."""
        return int(self.permutation[int(u)])

    def rows_before(self, u: int) -> int:
        """Rows of units ``0 .. u - 1``: where unit ``u`` starts in the epoch's order."""
        return int(self._before[int(u)])

    def unit_seed(self, u: int) -> tuple[int, ...]:
        """Entropy of unit ``u``'s row permutation."""
        return (self.seed, self.epoch, 1, int(u))

    def window(self, u0: int, u1: int) -> list[tuple[int, int, tuple[int, ...]]]:
        """Units ``u0 .. u1 - 1`` as ``(bucket, rows, unit seed)`` each, in order."""
        return [(self.bucket(u), int(self.sizes[self.bucket(u)]), self.unit_seed(u))
                for u in range(int(u0), int(u1))]


def unit_rows(rows: int, seed: Sequence[int]) -> np.ndarray:
    """The permutation of a unit of ``rows`` rows (canonical bucket order → the epoch's)."""
    return np.random.default_rng(list(seed)).permutation(int(rows))


@dataclass(frozen=True)
class Lanes:
    """Which batches of the global order one trainer takes in an epoch.

    The epoch's *kept* batches are its batches but those skipped (``skips``,
    :mod:`daskfeed.batches._skips`), in order; trainer ``rank`` of ``world`` takes kept batches
    ``origin + rank + j * world`` for ``j < batches``. ``origin`` is where this run entered the
    epoch (its first kept batch not trained by an earlier run, modulo ``world``; 0 for a fresh
    epoch); the kept batches before ``origin + start * world`` were trained before.
    """

    origin: int
    world: int
    rank: int
    batches: int
    batch_size: int
    skips: tuple[tuple[int, int], ...] = ()  # the epoch's skipped batches, (first, last) ranges

    def global_batch(self, j: int) -> int:
        """The order's batch that is this trainer's batch ``j``."""
        return kept_batch(self.skips, self.origin + self.rank + j * self.world)

    def local(self, x: int) -> int:
        """How many of the order's rows ``[0, x)`` are this trainer's."""
        bs, first = self.batch_size, self.origin + self.rank
        b = x // bs
        k = int(kept_before(self.skips, b))  # kept batches before b; b's own index if kept
        full = min(max(-(-(k - first) // self.world), 0), self.batches)
        mine = (k >= first and (k - first) % self.world == 0 and (k - first) // self.world < self.batches
                and not bool(is_skipped(self.skips, np.array([b]))[0]))
        return full * bs + (x - b * bs if mine else 0)

    def keep(self, start: int, stop: int) -> np.ndarray | None:
        """Which of the order's rows ``[start, stop)`` are this trainer's (None: all of them)."""
        if self.world == 1 and self.origin == 0 and self.local(stop) - self.local(start) == stop - start:
            return None
        b = np.arange(start, stop, dtype=np.int64) // self.batch_size
        g = np.asarray(kept_before(self.skips, b)) - (self.origin + self.rank)
        kept: np.ndarray = (g >= 0) & (g % self.world == 0) & (g // self.world < self.batches)
        return kept & ~is_skipped(self.skips, b) if self.skips else kept


def window_index(window: list[tuple[int, int, tuple[int, ...]]], span: tuple[int, int],
                 lanes: Lanes) -> np.ndarray:
    """A trainer's rows of a window, in the epoch's order, as positions in its buckets' rows.

    Parameters
    ----------
    window
        :meth:`GlobalOrder.window`: its units as ``(bucket, rows, seed)``.
    span
        The window's rows in the epoch's order.
    lanes
        This trainer's batches.

    Returns
    -------
    numpy.ndarray
        Positions (int64) in the concatenation of the window's buckets, each in canonical order.
    """
    parts, base = [], 0
    for _, rows, seed in window:
        parts.append(unit_rows(rows, seed) + base)
        base += rows
    index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    keep = lanes.keep(*span)
    return index if keep is None else index[keep]


class Windowed(Protocol):
    """What :func:`order_line` reads of an epoch's plan (an :class:`~daskfeed.batches._plan.EpochPlan`)."""

    @property
    def windows(self) -> Sized:
        """The epoch's windows."""
        ...

    @property
    def rows(self) -> int:
        """The epoch's rows."""
        ...


def order_line(plan: Windowed, *, units: int, blocks: int, shuffle: bool, why: str) -> str:
    """How an epoch's rows are ordered, in one line: what shuffle quality a run gets, and why.

    Parameters
    ----------
    plan
        The epoch's plan (its windows and rows).
    units
        ``K`` of the global order; 0 when the plan is one of windows of blocks.
    blocks
        The data's blocks.
    shuffle
        Whether rows are shuffled at all.
    why
        Why there is no global order (said when there is none).

    Returns
    -------
    str
        The line.
    """
    n = max(len(plan.windows), 1)
    windows = f"{n} window{'s' if n > 1 else ''}"
    if units:
        return (f"rows in one global order per epoch: {units} buckets, each a stratified sample of "
                f"all {blocks} blocks, read in {windows} of ~{plan.rows // n:,} rows (an "
                "iid-grade shuffle, whatever the budget)")
    if not shuffle:
        return f"rows in file order (no shuffle), {windows}"
    return (f"rows shuffled within {windows} of ~{plan.rows // n:,} rows, not in one global order "
            f"({why}): a batch draws from the blocks of one window, ~{100 / n:.2g}% of the data")
