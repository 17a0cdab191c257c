"""Plan: pure functions from row counts to the batches of one epoch (no dask, no keras).

An epoch is a sequence of *windows*: blocks whose rows are read together, and
shuffled together on a worker. Windows are laid end to end; batch ``i`` covers the global rows
``[i * batch_size, (i + 1) * batch_size)`` of that concatenation, so every batch but the epoch's
last has exactly ``batch_size`` rows and batches span block and window edges.

With ``shuffle=True`` the block order is a permutation drawn from ``(seed, epoch)`` and the
rows of window ``w`` are permuted with ``window_seed(seed, epoch, w)``; the same inputs always
give the same plan (:func:`make_plan`: windows of blocks, what serves without the parse cache).
With the parse cache the windows are units of the global order instead
(:func:`make_order_plan`, :mod:`daskfeed.batches._order`): the same plan structure, another
recipe for what a window reads.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from daskfeed.batches._order import GlobalOrder, Lanes
from daskfeed.batches._skips import kept_batch, skipped_count, skipped_rows
from daskfeed.core import refuse_setting


@dataclass(frozen=True)
class Window:
    """Blocks read and shuffled together; ``offset`` is its first row in the epoch.

    In a plan of the global order (:mod:`daskfeed.batches._order`) a window is the units
    ``units`` (whole buckets, no blocks), ``span`` its rows in the order and ``rows``/``offset``
    count this trainer's rows only.
    """

    index: int
    blocks: tuple[int, ...]
    rows: int
    offset: int
    units: tuple[int, int] | None = None
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` of window ``window`` (in the window's shuffled order)."""

    window: int
    start: int
    stop: int


@dataclass(frozen=True)
class EpochPlan:
    """The windows and batches of one epoch (see module docstring)."""

    epoch: int
    seed: int
    batch_size: int
    shuffle: bool
    windows: tuple[Window, ...]
    rows: int
    num_batches: int
    _starts: tuple[int, ...] = field(repr=False, default=())
    dropped: int = 0  # rows of this shard left out this epoch (max_batches / drop_remainder)
    order: GlobalOrder | None = None  # the global order the windows are units of (None: blocks)
    lanes: Lanes | None = None  # which of the order's batches are this trainer's
    skipped_batches: int = 0  # batches of the epoch's order left out (--skip-batches), all trainers'
    skipped: int = 0  # their rows

    def __len__(self) -> int:
        return self.num_batches

    def batch(self, i: int) -> list[Slice]:
        """The window slices that make up batch ``i``.

        Parameters
        ----------
        i
            The batch index, ``0 <= i < num_batches``.

        Returns
        -------
        list of Slice
            The slices, in row order.

        Raises
        ------
        IndexError
            When ``i`` is out of range.
        """
        if not 0 <= i < self.num_batches:
            raise IndexError(f"batch index {i} out of range [0, {self.num_batches})")
        lo = i * self.batch_size
        hi = min(lo + self.batch_size, self.rows)
        out = []
        w = bisect.bisect_right(self._starts, lo) - 1
        while lo < hi:
            win = self.windows[w]
            stop = min(hi, win.offset + win.rows)
            out.append(Slice(w, lo - win.offset, stop - win.offset))
            lo = stop
            w += 1
        return out

    def batch_rows(self, i: int) -> int:
        """Number of rows in batch ``i``.

        Parameters
        ----------
        i
            The batch index.

        Returns
        -------
        int
            ``batch_size``, or fewer for the epoch's last batch.
        """
        return min(self.batch_size, self.rows - i * self.batch_size)

    def batches_of(self, w: int) -> range:
        """Batch indices that take rows from window ``w``.

        Parameters
        ----------
        w
            The window index.

        Returns
        -------
        range
            The batches, in order.
        """
        win = self.windows[w]
        first = win.offset // self.batch_size
        last = min((win.offset + win.rows - 1) // self.batch_size, self.num_batches - 1)
        return range(first, last + 1)

    def seed_of(self, w: int) -> tuple[int, ...] | None:
        """Row-shuffle seed of window ``w`` (None when not shuffling).

        Parameters
        ----------
        w
            The window index.

        Returns
        -------
        tuple of int or None
            The seed, ``(seed, epoch, 1, w)``: entropy for ``numpy.random.default_rng``; None
            without shuffling.
        """
        return window_seed(self.seed, self.epoch, w) if self.shuffle else None

    def same_batches(self, other: EpochPlan) -> bool:
        """True when ``other`` yields exactly the same batches (e.g. unshuffled epochs).

        Parameters
        ----------
        other
            Another epoch's plan.

        Returns
        -------
        bool
            True when both serve the same batches in the same order.
        """
        return (
            self.windows == other.windows
            and self.batch_size == other.batch_size
            and not self.shuffle
            and not other.shuffle
            and self.order is None
            and other.order is None
        )


def window_seed(seed: int, epoch: int, w: int) -> tuple[int, ...]:
    """Entropy for the row permutation of window ``w`` of ``epoch``.

    Parameters
    ----------
    seed
        The run's seed.
    epoch
        The epoch.
    w
        The window index.

    Returns
    -------
    tuple of int
        Entropy for ``numpy.random.default_rng``.
    """
    return (int(seed), int(epoch), 1, int(w))


def make_plan(
    counts: Sequence[int],
    *,
    batch_size: int,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    window_rows: int | None = None,
    drop_remainder: bool = False,
    shard: tuple[int, int] = (0, 1),
    max_batches: int | None = None,
) -> EpochPlan:
    """Plan one epoch.

    Parameters
    ----------
    counts
        Rows per block, in block order.
    batch_size
        Rows per batch; only the epoch's last batch may be shorter (or dropped).
    epoch, seed
        Determine the block permutation and the per-window row permutations.
    shuffle
        Permute blocks and rows. ``False`` keeps the file order.
    window_rows
        Target rows per window: blocks are added to a window until it holds at least
        this many rows. ``None``: one block per window.
    drop_remainder
        Drop the epoch's last batch if it is short.
    shard
        ``(index, count)``: keep only blocks ``p`` with ``p % count == index``; each
        shard then sees its own rows exactly once per epoch.
    max_batches
        At most this many (full) batches: the rows after them in this epoch's order are left
        out and counted in ``dropped``; windows they would need are not planned. Several
        trainers pass the least of their shards' ``rows // batch_size`` so every shard has the
        same count (see ``docs/scale-out.md``, "Several trainers").

    Returns
    -------
    EpochPlan
        The epoch's windows and batches (of this shard).

    Raises
    ------
    SettingError
        When ``batch_size`` < 1 or the shard index is not below the shard count.
    """
    if batch_size < 1:
        refuse_setting("Expected batch_size >= 1 (rows per batch).", f"batch_size={batch_size!r}",
                       "e.g. batch_size=1024 (--batch-size 1024).")
    index, nshards = shard
    if not 0 <= index < nshards:
        refuse_setting("Expected 0 <= shard index < shard count.", f"shard={shard}",
                       "the rank is below the world size (--rank 0 --world-size 2).")
    blocks = [b for b in range(len(counts)) if b % nshards == index and counts[b] > 0]
    if shuffle:
        order = np.random.default_rng([int(seed), int(epoch), 0]).permutation(len(blocks))
        blocks = [blocks[j] for j in order]
    windows = _windows(blocks, counts, max(1, int(window_rows or 1)))
    total = windows[-1].offset + windows[-1].rows if windows else 0
    num_batches = total // batch_size if drop_remainder else -(-total // batch_size)
    rows = num_batches * batch_size if drop_remainder else total
    if max_batches is not None and max_batches < num_batches:
        num_batches = max(int(max_batches), 0)
        rows = num_batches * batch_size
        windows = [w for w in windows if w.offset < rows]
    return EpochPlan(
        epoch=int(epoch),
        seed=int(seed),
        batch_size=int(batch_size),
        shuffle=bool(shuffle),
        windows=tuple(windows),
        rows=rows,
        num_batches=num_batches,
        _starts=tuple(w.offset for w in windows),
        dropped=total - rows,
    )


def _windows(blocks: list[int], counts: Sequence[int], target: int) -> list[Window]:
    """Consecutive ``blocks`` grouped into windows of at least ``target`` rows (the last: fewer)."""
    windows: list[Window] = []
    members: list[int] = []
    rows = offset = 0
    for b in blocks:
        members.append(b)
        rows += int(counts[b])
        if rows >= target:
            windows.append(Window(len(windows), tuple(members), rows, offset))
            offset += rows
            members, rows = [], 0
    if members:
        windows.append(Window(len(windows), tuple(members), rows, offset))
    return windows


def shard_rows(counts: Sequence[int], nshards: int) -> list[int]:
    """Rows of each shard when block ``p`` goes to shard ``p % nshards``.

    Parameters
    ----------
    counts
        Rows per block, in block order.
    nshards
        The number of shards.

    Returns
    -------
    list of int
        Rows per shard.
    """
    rows = [0] * int(nshards)
    for p, n in enumerate(counts):
        rows[p % nshards] += max(int(n), 0)
    return rows


def equal_shard_batches(counts: Sequence[int], *, batch_size: int, nshards: int) -> int:
    """Full batches every shard can serve: ``min`` over shards of ``rows // batch_size``.

    Trainers that step together (one gradient step per batch on every rank) need the same
    number of batches per epoch. Each rank plans this many full batches of its own shard;
    the rest of its rows this epoch (the tail of its shuffled order: other rows each epoch)
    are dropped and counted (:attr:`EpochPlan.dropped`). The shards differ by at most the
    rows of one block plus a partial batch, so little is dropped when there are many
    blocks per shard.

    Parameters
    ----------
    counts
        Rows per block, in block order.
    batch_size
        Rows per batch.
    nshards
        The number of shards.

    Returns
    -------
    int
        Full batches per shard per epoch.
    """
    return min(r // int(batch_size) for r in shard_rows(counts, nshards))


def make_order_plan(order: GlobalOrder, *, batch_size: int, window_rows: int,
                    drop_remainder: bool = False, shard: tuple[int, int] = (0, 1),
                    origin: int = 0, skips: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
    """The plan of one trainer's batches of ``order``'s epoch.

    Parameters
    ----------
    order
        The epoch's global order.
    batch_size
        Rows per batch.
    window_rows
        Rows a window of this trainer should hold: whole units, about this many of its rows.
    drop_remainder
        Leave out the epoch's last batch if it is short. With several trainers only full
        batches are taken, the same number by each: the last ``< world`` batches (and the
        short one) are left out, a different few each epoch.
    shard
        ``(rank, world)``.
    origin
        See :class:`Lanes` (0: the epoch from its start).
    skips
        The epoch's batches left out, ``(first, last)`` ranges of the order's batches
        (:meth:`~daskfeed.batches.Skips.epoch`): the trainers deal the rest.

    Returns
    -------
    EpochPlan
        Windows of consecutive units (only those holding some of this trainer's rows), with
        this trainer's rows counted locally: its batch ``j`` is its rows
        ``[j * batch_size, (j + 1) * batch_size)``.
    """
    if batch_size < 1:
        refuse_setting("Expected batch_size >= 1 (rows per batch).", f"batch_size={batch_size!r}",
                       "e.g. batch_size=1024 (--batch-size 1024).")
    rank, world = shard
    if not 0 <= rank < world:
        refuse_setting("Expected 0 <= shard index < shard count.", f"shard={shard}",
                       "the rank is below the world size (--rank 0 --world-size 2).")
    total = order.rows
    n = (total // batch_size if drop_remainder else -(-total // batch_size)) if world == 1 else \
        total // batch_size  # the order's batches the trainers may take (several: full ones)
    kept = n - skipped_count(skips, 0, n)
    batches = max(kept - origin, 0) if world == 1 else max((kept - origin) // world, 0)
    lanes = Lanes(int(origin), int(world), int(rank), batches, int(batch_size), tuple(skips))
    per_unit = max(total / order.units, 1.0)
    k = max(1, int(window_rows * world / per_unit))
    windows: list[Window] = []
    for u0 in range(0, order.units, k):
        u1 = min(u0 + k, order.units)
        r0, r1 = order.rows_before(u0), order.rows_before(u1)
        a, b = lanes.local(r0), lanes.local(r1)
        if b > a:
            windows.append(Window(len(windows), (), b - a, a, units=(u0, u1), span=(r0, r1)))
    rows = lanes.local(total)
    end = min(kept_batch(lanes.skips, origin + batches * world), n)  # the batches taken end here

    skipped = skipped_rows(skips, 0, n, batch_size, total)
    tail = skipped_rows(skips, end, n, batch_size, total)  # skipped after the last batch taken
    return EpochPlan(
        epoch=order.epoch, seed=order.seed, batch_size=int(batch_size), shuffle=True,
        windows=tuple(windows), rows=rows, num_batches=batches,
        _starts=tuple(w.offset for w in windows),
        dropped=max(total - min(end * batch_size, total) - tail, 0),
        order=order, lanes=lanes, skipped_batches=skipped_count(skips, 0, n), skipped=skipped,
    )
