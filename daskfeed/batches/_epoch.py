"""Epoch state of a sequence: which epoch and batch it serves, what was served, its plan and prefetcher.

Also the cursor rule: which ``on_epoch_end`` moves to the next epoch (:meth:`EpochState.end`).
No keras, no dask: the sequence hands in how plans are made and how windows are prefetched.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypedDict

import numpy as np

from daskfeed.batches._order import GlobalOrder
from daskfeed.batches._plan import EpochPlan, Slice, equal_shard_batches, make_order_plan, make_plan
from daskfeed.batches._prefetch import Prefetcher
from daskfeed.batches._quality import LabelSpread
from daskfeed.batches._skips import Skips
from daskfeed.core import SettingError, warn_user

PEEKED = 2  # batches Keras' TF backend reads before fit starts to infer shapes (0 and 1)


class EpochStats(TypedDict):
    """What :meth:`daskfeed.batches.BatchStream.epoch_stats` reports of the current epoch."""

    epoch: int
    rows: int
    batches: int
    wait_seconds: float
    windows_computed: int
    start_batch: int
    windows: int
    dropped_rows: int
    skipped_batches: int  # batches of the epoch's order left out (--skip-batches), all trainers'
    skipped_rows: int
    seconds: float
    label_spread: float | None  # batch label-mean spread over an iid shuffle's (batches._quality)
    inside_iid: float | None  # share of full batches inside the iid 99 % interval


@dataclass(frozen=True)
class PlanSettings:
    """What fixes every epoch's plan besides the epoch number (see :func:`make_plan`)."""

    counts: tuple[int, ...]
    batch_size: int
    seed: int
    shuffle: bool
    window_rows: int
    drop_remainder: bool
    shard: tuple[int, int]
    buckets: tuple[int, ...] = ()  # rows of the global order's buckets; (): windows of blocks
    skips: Skips = field(default_factory=Skips)  # batches of the global order left out (--skip-batches)

    @property
    def units(self) -> int:
        """``K`` of the global order (:mod:`daskfeed.batches._order`); 0: windows of blocks."""
        return len(self.buckets)

    def plan(self, epoch: int, origin: int = 0) -> EpochPlan:
        """The plan of ``epoch``.

        With several shards (trainers stepping together) every shard serves the same number of
        full batches; each drops the rest of its rows that epoch (counted in ``plan.dropped``).

        Parameters
        ----------
        epoch
            The epoch number.
        origin
            Of the global order's lanes (:class:`~daskfeed.batches._order.Lanes`): 0 but in an
            epoch resumed under another number of trainers.

        Returns
        -------
        EpochPlan
            Its windows and batches.
        """
        if self.units:
            order = GlobalOrder.of(self.buckets, self.seed, epoch)
            return make_order_plan(order, batch_size=self.batch_size, window_rows=self.window_rows,
                                   drop_remainder=self.drop_remainder, shard=self.shard,
                                   origin=origin, skips=self.skips.epoch(epoch))
        counts = list(self.counts)
        equal = (equal_shard_batches(counts, batch_size=self.batch_size, nshards=self.shard[1])
                 if self.shard[1] > 1 else None)
        return make_plan(counts, batch_size=self.batch_size, epoch=epoch, seed=self.seed,
                         shuffle=self.shuffle, window_rows=self.window_rows,
                         drop_remainder=self.drop_remainder, shard=self.shard, max_batches=equal)


# new_prefetcher(plan, order, budget): budget None is the sequence's; an int, room lent to the
# next epoch (its windows start only within it)
NewPrefetcher = Callable[[EpochPlan, list[int], int | None], Prefetcher]


class EpochState:
    """The epoch being served: its plan, first batch, batches served and windows in flight.

    Parameters
    ----------
    settings
        How plans are made.
    new_prefetcher
        ``new_prefetcher(plan, order, budget)``: a prefetcher of ``plan``'s windows in
        ``order``, started; with a ``budget``, one of the next epoch fetching ahead in that
        room (only windows that fit are started).
    tolerance
        Index jumps up to this many batches are still sequential reads (Keras' threads and
        queue read a little ahead); more than that, three times, warns of random order.
    classes
        Classes of a multiclass label (more than 2), else 0: how the shuffle's quality is
        measured (:class:`~daskfeed.batches._quality.LabelSpread`).

    Notes
    -----
    Thread-safe: batches are asked for from Keras' threads while epochs change.
    """

    def __init__(self, settings: PlanSettings, new_prefetcher: NewPrefetcher, tolerance: int,
                 classes: int = 0) -> None:
        self.settings = settings
        self.classes = classes
        self._new_prefetcher = new_prefetcher
        self._tolerance = tolerance
        self.lock = threading.RLock()
        self.epoch = 0
        self.start = 0
        self.origin = 0  # of the plan's lanes (a resume under another number of trainers)
        self._plan: EpochPlan | None = None
        self.prefetcher: Prefetcher | None = None
        self.last_stats: EpochStats | None = None
        self.ended: dict[int, EpochStats] = {}  # stats of the last epochs that ended, by epoch
        self._warned_random = False
        self._begun = False  # Keras called on_epoch_begin since the last on_epoch_end
        self._peeking = False  # Keras is reading batches only to build a model (see peek)
        self._ended = False  # the epoch was complete at an on_epoch_end that could be Keras' reset
        self._next: EpochPlan | None = None  # the next epoch's plan, once looked at
        self._ahead: Prefetcher | None = None  # its windows fetched ahead
        self._last: int | None = None  # the run's last epoch: nothing past it is fetched ahead

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan."""
        assert self._plan is not None
        return self._plan

    def set(self, epoch: int, start: int = 0, origin: int = 0) -> None:
        """Serve ``epoch`` from its batch ``start``.

        Parameters
        ----------
        epoch, start
            The epoch, and the first of its batches served (``> 0`` when resuming).
        origin
            See :meth:`PlanSettings.plan`.

        Raises
        ------
        SettingError
            The epoch has no batch (too few rows for ``batch_size``).
        ValueError
            ``start`` is not a batch of the epoch.
        """
        nxt = self._next  # the next epoch's plan, if made already (read once: set may race)
        reuse = nxt is not None and nxt.epoch == epoch and origin == 0
        plan = nxt if reuse and nxt is not None else self.settings.plan(epoch, origin)
        if plan.num_batches == 0:
            raise SettingError(
                f"Expected at least one batch. Received: {plan.rows + plan.dropped} rows with "
                f"batch_size={self.settings.batch_size}, "
                f"drop_remainder={self.settings.drop_remainder}.\nHint: lower batch_size or add data."
            )
        if not 0 <= start < plan.num_batches:
            raise ValueError(f"Expected 0 <= start < {plan.num_batches} (batches of epoch {epoch}). "
                             f"Received: start={start}.")
        with self.lock:
            old, old_pf = self._plan, self.prefetcher
            self.epoch, self.start, self.origin, self._plan = epoch, start, origin, plan
            self._ended = False
            self._served: set[int] = set()
            self._spread = LabelSpread(self.settings.batch_size, self.classes)
            # batches of each window still to serve (windows wholly before ``start`` have none)
            self._left = {w.index: sum(1 for b in plan.batches_of(w.index) if b >= start)
                          for w in plan.windows}
            self._jumps, self._last_index = 0, -1
            # reading in order: nothing asked for beyond the batches served from ``start`` on
            # (``_prefix``: the first not served) and the readers' lookahead (``tolerance``)
            self._prefix, self._furthest = start, start - 1
            self._t0 = time.perf_counter()
            if old is not None and old_pf is not None and (plan == old or plan.same_batches(old)):
                self._keep_windows(old_pf)  # the next epoch's windows fetched ahead stay too
                return
            ahead = self._ahead if self._next is plan else None  # fetched for this very plan
            if self._ahead is not None and ahead is None:
                self._ahead.reset()
            self._ahead, self._next = None, None
            if old_pf is not None:
                old_pf.reset()
            self._submitted0, self._wait0 = 0, 0.0
            order = [w.index for w in plan.windows if self._left[w.index]]
            if ahead is not None:  # its first windows are on their way
                pf = self.prefetcher = ahead  # (resubmitting their keys would race)
                pf.budget = old_pf.budget if old_pf is not None else pf.budget
                for w in plan.windows:
                    if not self._left[w.index]:  # wholly before ``start``
                        pf.done_serving(w.index)
                pf.start(order[0] if order else None)
            else:
                self.prefetcher = self._new_prefetcher(plan, order, None)
            self._look_ahead()

    def _keep_windows(self, pf: Prefetcher) -> None:
        """Same windows (this epoch at another start, or unshuffled): keep them held or in flight.

        Cancelling and resubmitting the same keys races in distributed.
        """
        self._submitted0, self._wait0 = pf.submitted, pf.wait_seconds
        for w in self.plan.windows:
            if not (self.start and self._left[w.index]):
                pf.done_serving(w.index)  # evictable if room is needed

    def begin(self) -> None:
        """Keras starts an epoch (``on_epoch_begin``): the batches it peeked are trained now."""
        with self.lock:
            self._begun, self._ended, self._peeking = True, False, False

    def peek(self) -> None:
        """Keras begins a pass only to read a batch (to build a model): no epoch begins.

        The ``on_epoch_end`` after it ends no epoch, whatever the pass read (an epoch of one
        batch is whole after it; a reader reading ahead may have read more): the epoch that
        begins then trains those batches. Nor does it end one an earlier fit left (stopped
        mid-epoch, it never called ``on_epoch_end``).
        """
        with self.lock:
            self._begun, self._peeking = False, True

    def end(self) -> bool:
        """``on_epoch_end``: move to the next epoch once every batch of this one was served.

        Keras also calls ``on_epoch_end`` when ``fit`` / ``evaluate`` starts, after the TF
        backend read batches 0 and 1 and before its ``on_epoch_begin``: that call must not
        advance. Only an epoch of at most :data:`PEEKED` batches can be complete then; such an
        epoch ends at an ``on_epoch_end`` without ``on_epoch_begin`` before it only when the
        next batch is asked for (:meth:`settle`) or ``on_epoch_end`` comes again -- Keras'
        ``on_epoch_begin`` in between keeps it. Any other complete epoch ends at once.

        Returns
        -------
        bool
            Whether the next epoch was set.
        """
        with self.lock:
            begun, self._begun = self._begun, False
            if self._peeking:  # the end of a model's build: no epoch ends
                self._peeking = False
                return False
            complete = len(self._served) == self.plan.num_batches - self.start
            if not complete:
                return False
            if not (begun or self._ended) and self.plan.num_batches - self.start <= PEEKED:
                self._ended = True  # maybe Keras' reset after its peek: decided later
                return False
            self._record()
        self.set(self.epoch + 1)
        return True

    def open_pass(self, epoch: int, start: int) -> tuple[EpochPlan, Prefetcher]:
        """A pass over ``epoch`` from batch ``start`` begins (a ``tf.data`` iterator's first read).

        Serves that epoch from ``start`` afresh: the cursor is set there unless it already
        stands there with nothing served (a pass cut short, or a read-ahead Keras threw away,
        leaves batches served: the same epoch starts again, its windows kept).

        Parameters
        ----------
        epoch, start
            The epoch and its first batch.

        Returns
        -------
        tuple
            ``(plan, prefetcher)`` of the pass.
        """
        with self.lock:
            if (epoch, start) != (self.epoch, self.start) or self._served:
                self.set(epoch, start)
            assert self.prefetcher is not None
            return self.plan, self.prefetcher

    def finish(self, plan: EpochPlan, advance: bool = True) -> bool:
        """End ``plan``'s epoch if it is still current and every batch was served: move to the next.

        For feeds that know when a pass ends (see :mod:`daskfeed.adapters._tf_data`).

        Parameters
        ----------
        plan
            The plan the pass served.
        advance
            False: keep the epoch's figures (:attr:`ended`) but stay at it.

        Returns
        -------
        bool
            Whether the epoch ended.
        """
        with self.lock:
            if plan is not self._plan or len(self._served) != plan.num_batches - self.start:
                return False
            self._record()
            if advance:
                self.set(self.epoch + 1)
            return True

    def settle(self) -> None:
        """Move on if an epoch that ended ambiguously (see :meth:`end`) is read on."""
        if self._ended:
            with self.lock:
                if not self._ended:
                    return
                self._record()
            self.set(self.epoch + 1)

    def reserve(self, index: int, run: int = 1) -> tuple[EpochPlan, Prefetcher, int]:
        """The plan, prefetcher and plan batch index of batch ``index`` of this epoch.

        Parameters
        ----------
        index
            ``seq[index]``'s index: from 0 (the epoch's ``start``), negative from the end.
        run
            Batches read from ``index`` on at once (all of them in range): a reader in order.

        Returns
        -------
        tuple
            ``(plan, prefetcher, i)``, ``i`` the plan's batch index.

        Raises
        ------
        IndexError
            ``index`` is out of range.
        """
        i = operator.index(index)
        self.settle()
        with self.lock:
            plan, pf, start = self.plan, self.prefetcher, self.start
            n = plan.num_batches - start
            if i < 0:
                i += n
            if not 0 <= i or not i + run <= n:
                raise IndexError(f"Batch index {index} out of range for {n} batches.")
            self._note_access(i)
            self._last_index = i + run - 1
            self._furthest = max(self._furthest, i + start + run - 1)
        assert pf is not None
        return plan, pf, i + start

    def served(self, plan: EpochPlan, i: int, slices: list[Slice], y: np.ndarray | None = None) -> None:
        """Batch ``i`` of ``plan`` was served: its windows are evictable once all theirs are.

        Parameters
        ----------
        plan, i
            The plan the batch was served from and its batch index.
        slices
            The batch's slices.
        y
            Its labels (the shuffle's quality is measured on them), or None.
        """
        with self.lock:
            if plan is not self._plan or i in self._served:
                return
            self._served.add(i)
            while self._prefix in self._served:
                self._prefix += 1
            if y is not None:
                self._spread.add(y)
            for s in slices:
                self._left[s.window] -= 1
                if self._left[s.window] == 0 and self.prefetcher is not None:
                    self.prefetcher.done_serving(s.window)
            self._look_ahead()

    def _look_ahead(self) -> None:
        """Once every window of this epoch is in flight, fetch the next epoch's first ones.

        They are computed within the room this epoch's prefetcher does not use (it lends it:
        together they stay within the budget), so the next epoch's first batches do not wait for
        a window started only when it begins. Read in order, the loan grows as this epoch's
        windows are served (each served window is let go and its room lent on), so the cluster
        reads the next epoch while this one's last windows are trained. Not when the next epoch
        has the same windows (no shuffle: they are kept), nor for a prefetcher that was never
        started (an unpickled sequence's), nor when no room is left (tried again at the next
        batch).
        """
        pf = self.prefetcher
        if pf is None or not pf.started_all or (self._last is not None and self.epoch >= self._last):
            return
        # windows served are read no more by a reader in order: their room is lent too. Not in
        # order: a jump, or a batch asked for far ahead of those served (another thread reading
        # from the end: it would read the served windows again)
        in_order = not self._jumps and self._furthest < self._prefix + self._tolerance
        if self._ahead is not None:
            more = pf.lend(let_go=in_order)
            if more > 0:
                self._ahead.grow(more)
            return
        if self._next is None or self._next.epoch != self.epoch + 1:
            self._next = self.settings.plan(self.epoch + 1)
        nxt = self._next
        if nxt.num_batches == 0 or nxt.same_batches(self.plan):
            return
        room = pf.lend(let_go=in_order)
        if room <= 0:
            return
        self._ahead = self._new_prefetcher(nxt, [w.index for w in nxt.windows], room)

    def use_skips(self, skips: Skips) -> None:
        """Plan epochs from now on with ``skips`` left out (a resume state's, with the run's).

        The next epoch's plan and the windows fetched ahead for it are let go (they may hold
        batches now left out); the current epoch's plan is made again by the next :meth:`set`.
        """
        if skips == self.settings.skips:
            return
        with self.lock:
            self.settings = replace(self.settings, skips=skips)
            if self._ahead is not None:
                self._ahead.reset()
                if self.prefetcher is not None:
                    self.prefetcher.end_loan()
            self._ahead, self._next = None, None

    def set_last_epoch(self, epoch: int | None) -> None:
        """The run ends after ``epoch`` (None: not known); windows fetched past it are dropped.

        Parameters
        ----------
        epoch
            The run's last epoch.
        """
        with self.lock:
            self._last = epoch
            nxt = self._next  # the ahead's plan whenever there is one
            if self._ahead is not None and nxt is not None and epoch is not None and nxt.epoch > epoch:
                self._ahead.reset()
                self._ahead = None
                if self.prefetcher is not None:
                    self.prefetcher.end_loan()  # the room is this epoch's again
            self._look_ahead()

    def _record(self) -> None:
        """The epoch ends: keep its stats (the last eight epochs' by number)."""
        self.last_stats = self.stats()
        self.ended[self.epoch] = self.last_stats
        for old in sorted(self.ended)[:-8]:
            del self.ended[old]

    def stats(self) -> EpochStats:
        """Rows and batches served, seconds waited for data, windows computed this epoch.

        Returns
        -------
        EpochStats
            The current epoch's figures so far.
        """
        with self.lock:
            plan, pf = self.plan, self.prefetcher
            spread = self._spread.summary()
            return EpochStats(
                epoch=plan.epoch,
                rows=int(sum(plan.batch_rows(i) for i in self._served)),
                batches=len(self._served),
                wait_seconds=(pf.wait_seconds - self._wait0) if pf else 0.0,
                windows_computed=(pf.submitted - self._submitted0) if pf else 0,
                start_batch=self.start,
                windows=len(plan.windows),
                dropped_rows=plan.dropped,
                skipped_batches=plan.skipped_batches,
                skipped_rows=plan.skipped,
                seconds=time.perf_counter() - self._t0,
                label_spread=spread["label_spread"] if spread else None,
                inside_iid=spread["inside_iid"] if spread else None,
            )

    def close(self) -> None:
        """Stop prefetching for good (not under the lock: closing never waits for a batch)."""
        for pf in (self.prefetcher, self._ahead):
            if pf is not None:
                pf.close()

    def _note_access(self, i: int) -> None:
        last, self._last_index = self._last_index, i
        if last < 0 or i == 0 or abs(i - last) <= self._tolerance:
            return
        self._jumps += 1
        if self._jumps >= 3 and not self._warned_random:
            self._warned_random = True
            warn_user(  # at the first line outside daskfeed, however deep the reader
                "DaskSequence is being read in random batch order (Keras' fit(shuffle=True) is "
                "the default). Batches stay correct, but windows may be computed more than "
                "once. daskfeed already shuffles blocks and rows itself: pass "
                "shuffle=False to model.fit() for the fast path.")
