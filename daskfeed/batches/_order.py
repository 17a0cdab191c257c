"""One global order: an epoch's rows in an order set by the data, the seed and the epoch alone.

Over the parse cache, whose blocks keep their rows in a seeded random order
(:mod:`daskfeed.cache._scatter`), an epoch is cut into ``S`` *units*. Unit ``u`` takes from every
block ``b`` of ``n_b`` rows the rows ``[u * n_b // S, (u + 1) * n_b // S)`` of its stored order,
rotated by an offset drawn for ``(seed, epoch, b)``: every unit is a proportional stratified
sample of the whole data set (each block gives its share, chosen at random within it), which is
at least as good as an iid sample of the same size. A unit's rows are permuted with their own
seed; the epoch is unit 0's rows, then unit 1's, and so on; batch ``g`` is rows
``[g * batch_size, (g + 1) * batch_size)`` of that order.

Neither the budget nor the number of trainers changes the order. The budget decides how many
consecutive units a *window* holds (what a worker reads at once: one run, or two where the
rotation wraps, of every block); the trainers decide who takes which batch: trainer ``rank`` of
``world`` takes batches ``origin + rank, origin + rank + world, ...``, where ``origin`` is the
first batch of the epoch not yet trained. So a checkpoint is a position in the order (the
batches trained before it), and a resume continues there under any budget, worker count or
world size (:class:`Lanes`).

``S`` (:func:`unit_count`) depends on the rows and the batch size only. Without the parse cache
(or with a dask DataFrame, or no shuffle) the plan is one of windows of blocks
(:func:`daskfeed.batches._plan.make_plan`), whose order depends on the window size.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["UNIT_ROWS", "GlobalOrder", "Lanes", "order_line", "unit_count"]

UNIT_ROWS = 1 << 16  # rows of a unit at most (a window holds whole units)
MIN_UNITS = 64  # units per epoch at least, on small data


def unit_count(rows: int, batch_size: int) -> int:
    """Units of an epoch of ``rows`` rows.

    About ``UNIT_ROWS`` rows each; on small data at least ``MIN_UNITS`` of a batch or more.

    Parameters
    ----------
    rows
        The data's rows (every trainer's together).
    batch_size
        Rows per batch.

    Returns
    -------
    int
        ``S``, at least 1.
    """
    unit = min(UNIT_ROWS, max(int(batch_size), -(-int(rows) // MIN_UNITS)))
    return max(1, -(-int(rows) // max(unit, 1)))


@dataclass(frozen=True)
class GlobalOrder:
    """The units of one epoch (see the module docstring).

    Attributes
    ----------
    blocks, counts
        The blocks with rows and their rows (usable rows: with a label).
    units
        ``S``.
    seed, epoch
        What the rotations and the units' permutations are drawn from.
    """

    blocks: tuple[int, ...]
    counts: tuple[int, ...]
    units: int
    seed: int
    epoch: int

    @classmethod
    def of(cls, counts: Sequence[int], units: int, seed: int, epoch: int) -> GlobalOrder:
        """The order of ``epoch`` over blocks of ``counts`` rows (blocks without rows left out).

        Parameters
        ----------
        counts
            Rows per block, in block order.
        units, seed, epoch
            ``S``, the run's seed, the epoch.

        Returns
        -------
        GlobalOrder
        """
        keep = [(b, int(n)) for b, n in enumerate(counts) if n > 0]
        return cls(tuple(b for b, _ in keep), tuple(n for _, n in keep), max(1, int(units)),
                   int(seed), int(epoch))

    @functools.cached_property
    def n(self) -> np.ndarray:
        """Rows of each block (int64)."""
        return np.asarray(self.counts, dtype=np.int64)

    @functools.cached_property
    def rotations(self) -> np.ndarray:
        """Each block's offset into its stored order this epoch (``0 <= o_b < n_b``)."""
        if not self.counts:
            return np.zeros(0, dtype=np.int64)
        return np.random.default_rng([self.seed, self.epoch, 2]).integers(0, self.n)

    @property
    def rows(self) -> int:
        """Rows of the epoch."""
        return int(self.n.sum())

    def starts(self, u: int) -> np.ndarray:
        """Where unit ``u`` starts in each block's rotated order: ``u * n_b // S``."""
        return (int(u) * self.n) // self.units

    def rows_before(self, u: int) -> int:
        """Rows of units ``0 .. u - 1``: where unit ``u`` starts in the epoch's order."""
        return int(self.starts(u).sum())

    def unit_seed(self, u: int) -> tuple[int, ...]:
        """Entropy of unit ``u``'s row permutation."""
        return (self.seed, self.epoch, 1, int(u))

    def window_order(self, u0: int, u1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where units ``u0 .. u1 - 1`` are, and their rows in order.

        Returns
        -------
        tuple of numpy.ndarray
            ``lo``, ``hi``: each block's rotated range ``[lo, hi)`` the units take; ``order``:
            the units' rows in the epoch's order, as positions in the concatenation of those
            ranges (block by block, each in rotated order).
        """
        lo, hi = self.starts(u0), self.starts(u1)
        base = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]) - lo  # + rotated position
        parts = []
        for u in range(u0, u1):
            a, b = self.starts(u), self.starts(u + 1)
            lengths = b - a
            total = int(lengths.sum())
            if not total:
                continue
            first = base + a  # each block's first position of the unit in the concatenation
            idx = np.repeat(first - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
            idx += np.arange(total)
            parts.append(idx[np.random.default_rng(list(self.unit_seed(u))).permutation(total)])
        order = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return lo, hi, order

    def runs(self, j: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """Block ``j``'s rotated range ``[lo, hi)`` as ranges of its stored order (one, or two)."""
        n = int(self.n[j])
        start, length = (lo + int(self.rotations[j])) % n, hi - lo
        if start + length <= n:
            return [(start, start + length)]
        return [(start, n), (0, start + length - n)]


@dataclass(frozen=True)
class Lanes:
    """Which batches of the global order one trainer takes in an epoch.

    Trainer ``rank`` of ``world`` takes batches ``origin + rank + j * world`` for
    ``j < batches``. ``origin`` is where this run entered the epoch (its first batch not trained
    by an earlier run, modulo ``world``; 0 for a fresh epoch); the batches before
    ``origin + start * world`` were trained before.
    """

    origin: int
    world: int
    rank: int
    batches: int
    batch_size: int

    def global_batch(self, j: int) -> int:
        """The order's batch that is this trainer's batch ``j``."""
        return self.origin + self.rank + j * self.world

    def local(self, x: int) -> int:
        """How many of the order's rows ``[0, x)`` are this trainer's."""
        bs, first = self.batch_size, self.origin + self.rank
        b = x // bs
        full = min(max(-(-(b - first) // self.world), 0), self.batches)
        mine = b >= first and (b - first) % self.world == 0 and (b - first) // self.world < self.batches
        return full * bs + (x - b * bs if mine else 0)

    def keep(self, start: int, stop: int) -> np.ndarray | None:
        """Which of the order's rows ``[start, stop)`` are this trainer's (None: all of them)."""
        if self.world == 1 and self.origin == 0 and self.local(stop) - self.local(start) == stop - start:
            return None
        g = np.arange(start, stop, dtype=np.int64) // self.batch_size - (self.origin + self.rank)
        return (g >= 0) & (g % self.world == 0) & (g // self.world < self.batches)


def order_line(plan: Any, *, units: int, blocks: int, shuffle: bool, why: str) -> str:
    """How an epoch's rows are ordered, in one line: what shuffle quality a run gets, and why.

    Parameters
    ----------
    plan
        The epoch's plan (its windows and rows).
    units
        ``S`` of the global order; 0 when the plan is one of windows of blocks.
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
        return (f"rows in one global order per epoch: {units} units, each a stratified sample of "
                f"all {blocks} blocks, read in {windows} of ~{plan.rows // n:,} rows (an "
                "iid-grade shuffle, whatever the budget)")
    if not shuffle:
        return f"rows in file order (no shuffle), {windows}"
    return (f"rows shuffled within {windows} of ~{plan.rows // n:,} rows, not in one global order "
            f"({why}): a batch draws from the blocks of one window, ~{100 / n:.2g}% of the data")
