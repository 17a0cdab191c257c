"""BatchStream: a prepared data set's batches, epoch after epoch, with no keras in it.

Every Keras hand-off stands on it: :class:`~daskfeed.DaskSequence` (a ``PyDataset``, one batch per
call: :meth:`BatchStream.batch`), the dataloader hand-off and ``TorchDataset`` (runs of batches:
:meth:`BatchStream.runs`) and the tf.data hand-off (chunks of batches:
:meth:`BatchStream.open_pass`, :meth:`BatchStream.take`, :meth:`BatchStream.finish`). It owns the
client it was handed, the window tasks and the epoch being served (an
:class:`~daskfeed.batches._epoch.EpochState`). Its resume state is :meth:`BatchStream.get_state`
/ :meth:`BatchStream.set_state` (:class:`~daskfeed.batches._state.StreamState`: where it stands
and what fixes its order, one versioned value), as Grain's checkpointable iterators have it.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from dask.utils import format_bytes

from daskfeed.batches._buckets import bucket_set
from daskfeed.batches._epoch import EpochState, EpochStats, PlanSettings
from daskfeed.batches._here import reads_here, workers_here
from daskfeed.batches._layout import window_rows_for
from daskfeed.batches._order import ORDER_VERSION, order_line
from daskfeed.batches._plan import EpochPlan, Slice
from daskfeed.batches._prefetch import Prefetcher
from daskfeed.batches._prepare import Prepared
from daskfeed.batches._skips import Skips, kept_batch, kept_before
from daskfeed.batches._state import StreamState
from daskfeed.batches._windows import WindowTasks
from daskfeed.cluster import Owner, WindowCancelled, connect
from daskfeed.core import (
    PROCESS_STOP,
    ClusterError,
    DaskfeedError,
    ManifestMismatchError,
    SettingError,
    Stop,
    warn_user,
)
from daskfeed.dashboard import EpochSpans
from daskfeed.manifest import WindowData, concat
from daskfeed.reading import long_reads

if TYPE_CHECKING:
    import numpy.typing as npt
    from distributed import Client

    from daskfeed.cluster import Pending

RUN_BYTES = 8 * 2**20  #: encoded bytes of batches read at once, at most (a run, a tf.data chunk)

#: a batch: ``(x, y)`` or ``(x, y, w)``; ``x`` a dict of arrays by column, or one matrix
Batch = tuple["dict[str, npt.NDArray[Any]] | npt.NDArray[Any]", ...]


class Closes(Protocol):
    """What :meth:`BatchStream.close_with` closes with the stream (a run closes at its end)."""

    def close(self) -> None:
        """Close it."""
        ...


class BatchStream:
    """Every epoch's batches of :class:`~daskfeed.batches.Prepared` data.

    ``batch(i)`` is deterministic for ``(data, seed, batch_size, epoch)`` in any call order and
    from any thread; every row is delivered once per epoch.

    Parameters
    ----------
    data
        The prepared data; the stream takes over its client (:meth:`Prepared.hand_over`).
    window_rows
        Rows per window (e.g. a checkpoint's, so that a resumed epoch has its windows); None:
        from the settings' ``window_bytes``.
    spans
        One ``distributed.span`` per epoch for the windows (the dashboard), or None.
    stop
        A stop request ending every wait; None: the process-wide one.
    tolerance
        Index jumps up to this many batches are still sequential reads (readers' threads and
        queues read a little ahead).

    Notes
    -----
    A stream owns threads and futures: :meth:`close` it. It is also closed when
    garbage-collected or at interpreter exit.
    """

    def __init__(self, data: Prepared, *, window_rows: int | None = None,
                 spans: EpochSpans | None = None, stop: Stop | None = None,
                 tolerance: int = 2) -> None:
        self.data = data
        self._owner = data.hand_over()  # the client: this stream's to close if owned
        self._finalizer = weakref.finalize(self, self._owner.close)
        self._closed = False
        self._dependents: weakref.WeakSet[Closes] = weakref.WeakSet()  # closed with the stream
        st = data.settings
        self.window_rows = window_rows_for(window_rows, st.window_bytes, data.manifest,
                                           data.encoding.bytes_per_row, st.prefetch_bytes,
                                           st.batch_size)
        self.tolerance = int(tolerance)
        self.failure: DaskfeedError | None = None  # the last error a batch raised
        self.assembly_seconds = 0.0  # spent assembling batches (waiting + slicing), all epochs
        self._class_weights: np.ndarray | None = None  # multiplied into the sample weights
        self._stop = stop
        self._windows = WindowTasks(data.source, data.manifest.fingerprint, data.encoding,
                                    data.cache, spans)
        # the global order reads buckets dealt from the parse cache, on files: built in the
        # background where every worker shares this disk (the epoch needs only their sizes
        # until its first window is read: see _buckets_built)
        ordered = data.cache is not None and data.source.frame is None and st.shuffle
        here = workers_here(self._owner.client)  # (the trainer reads the cache's files)
        self.buckets = bucket_set(data, background=here,
                                  in_memory=here and st.window_reads == "auto"
                                  and st.buckets_in_memory) \
            if ordered and any(data.manifest.counts) else None
        if self.buckets is not None:  # (collected unclosed: a build in the background stops)
            weakref.finalize(self, self.buckets.close, 0.0)
        self._built = threading.Lock()  # (one thread takes the built files in, see _buckets_built)
        self._buckets_built(False)  # (built here and now: the windows read them from the start)
        ordered = self.buckets is not None
        self.units = self.buckets.count if self.buckets is not None else 0
        self._origins: dict[int, int] = {}  # an epoch resumed under another number of trainers
        self._other_plan: tuple[int, int, PlanSettings, EpochPlan] | None = None  # order_batch's
        if st.skip_batches and not ordered:
            why = self._why_no_order()
            raise SettingError(
                "Expected batches to skip in the global order (batches numbered as daskfeed rows "
                f"numbers them). Received: --skip-batches {st.skip_batches.text()} in a run "
                f"without one ({why}): its batches come from windows of blocks, numbered by the "
                "window size.\nHint: turn the parse cache on (drop --no-cache / cache=False), or "
                "leave the rows out of the data.")
        self._cursor = self._new_cursor(0, 0)
        if st.shuffle and not ordered and data.manifest.looks_ordered:
            warn_user(f"{self.order_line()}. The label's mean varies from block to block "
                      f"{data.manifest.label_order:,.0f}x more than rows in random order give: the "
                      "data look ordered, and batches of windows of blocks will be far from an iid "
                      "sample.\nHint: turn the parse cache on (drop --no-cache / cache=False; "
                      "--cache DIR gives it a disk with room) for the global order, an iid-grade "
                      "shuffle.")
        self._position = 0  # batches of this epoch yielded by __iter__

    # -- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch whose batches :meth:`batch` returns."""
        return self._cursor.epoch

    @property
    def start(self) -> int:
        """First batch of the current epoch served (``batch(0)``): 0 except when resuming."""
        return self._cursor.start

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan."""
        return self._cursor.plan

    def __len__(self) -> int:
        """Batches left to serve of the current epoch from its ``start``."""
        return self.plan.num_batches - self.start

    def begin(self) -> None:
        """A reader starts an epoch: batches it read before (a peek) are trained now."""
        self._cursor.begin()

    def peek(self) -> None:
        """A reader begins a pass only to read a batch (Keras building a model): no epoch begins."""
        self._cursor.peek()

    def end(self) -> None:
        """Keras ends an epoch: move to the next epoch's order once every batch was delivered.

        The ``on_epoch_end`` Keras also calls when ``fit`` / ``evaluate`` starts (its reset after
        the TF backend's peek at the first batches) never advances.
        """
        self._cursor.end()

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Serve ``epoch`` from its batch ``start`` (``DaskSequence.set_epoch`` tells more).

        Raises
        ------
        ValueError
            ``start`` is not a batch of the epoch.
        """
        epoch, start = int(epoch), int(start)
        if epoch != self._cursor.epoch or start != self._cursor.start:  # (else as set: its origin)
            self._cursor.set(epoch, start)
        self._position = 0

    @property
    def iterated(self) -> int:
        """Batches of the current epoch yielded by :meth:`__iter__` / :meth:`runs` so far."""
        return self._position

    def rewind(self, iterated: int) -> None:
        """Serve the current epoch again from its batch ``start + iterated`` (a pass cut short).

        Windows still held are not read again, and batches served before are not counted twice
        in the epoch's figures.

        Raises
        ------
        ValueError
            ``iterated`` is beyond what was yielded.
        """
        if not 0 <= int(iterated) <= self._position:
            raise ValueError(f"Expected 0 <= iterated <= {self._position}. Received: {iterated}.")
        self._position = int(iterated)

    @property
    def global_order(self) -> bool:
        """Whether batches follow the global order (see ``docs/how-it-works.md``, step 2).

        They do with the parse cache on files, shuffled; else they come from windows of blocks.
        """
        return self.units > 0

    def position(self, batch: int | None = None, epoch: int | None = None) -> int:
        """Batches of ``epoch`` trained once this trainer's ``batch`` is next.

        In the global order, by every trainer together (all step together): a position in the
        order that a resume under any budget or number of trainers continues from
        (:meth:`set_position`). Otherwise this trainer's own batch.

        Parameters
        ----------
        batch
            This trainer's first batch not trained (default: where the stream stands).
        epoch
            Its epoch (default: the current one). Readers that fetch ahead (the tf.data hand-off)
            may be serving a later epoch than the one trained.

        Returns
        -------
        int
            The position.
        """
        b = self.start + self._position if batch is None else int(batch)
        if not self.global_order:
            return b
        e = self.epoch if epoch is None else int(epoch)
        kept = self._origins.get(e, 0) + b * self.data.settings.shard[1]
        return kept_batch(self.skips.epoch(e), kept)  # (with the skipped batches before it)

    def order_batch(self, batch: int, epoch: int | None = None) -> int | None:
        """The batch of the epoch's global order that this trainer's ``batch`` is (from 0).

        What ``daskfeed rows OUTPUT --epoch E --step S`` names (``S`` = this + 1, ``E`` =
        ``epoch`` + 1), whatever the number of trainers and the batches skipped.

        Parameters
        ----------
        batch
            This trainer's batch of the epoch (``start`` + Keras' index in a resumed epoch).
        epoch
            Its epoch (default: the current one).

        Returns
        -------
        int or None
            None without the global order (windows of blocks).
        """
        if not self.global_order:
            return None
        plan = self.plan_of(self.epoch if epoch is None else int(epoch))
        assert plan.lanes is not None
        return plan.lanes.global_batch(int(batch))

    def plan_of(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` as this stream serves it (its origin, its skips).

        The current epoch's, or another's, kept: a reader a little behind the stream (Keras
        training the last steps of an epoch the tf.data hand-off has read to its end) asks for
        the epoch it trains.
        """
        e = int(epoch)
        if e == self.epoch:
            return self.plan
        origin, settings, kept = self._origins.get(e, 0), self._cursor.settings, self._other_plan
        if kept is None or kept[:2] != (e, origin) or kept[2] is not settings:
            kept = self._other_plan = (e, origin, settings, settings.plan(e, origin))
        return kept[3]

    def epoch_runs(self, first: int, end: int) -> list[tuple[int, int]]:
        """Epochs ``first .. end - 1`` in runs of the same number of batches (``[(a, b), ...]``).

        Keras fixes the steps per epoch when ``fit`` starts: an epoch whose skipped batches
        (``skip_batches``) change its count is fitted apart.

        Raises
        ------
        SettingError
            An epoch left with no batch by the batches skipped.
        """
        if first >= end:
            return []
        if not self.skips:
            return [(int(first), int(end))]
        counts = [self._cursor.settings.plan(e).num_batches for e in range(first, end)]
        empty = [first + i + 1 for i, n in enumerate(counts) if n == 0]
        if empty:
            raise SettingError(
                f"Expected every epoch to keep a batch. Received: --skip-batches "
                f"{self.skips.text()} leaves epoch{'s' if len(empty) > 1 else ''} "
                f"{', '.join(map(str, empty))} with none ({self.data.settings.shard[1]} "
                "trainer(s) take full batches only, the same number each).\nHint: skip fewer "
                "batches of that epoch, or train fewer --epochs.")
        runs: list[tuple[int, int]] = []
        for i, n in enumerate(counts):
            if runs and counts[runs[-1][0] - first] == n:
                runs[-1] = (runs[-1][0], first + i + 1)
            else:
                runs.append((first + i, first + i + 1))
        return runs

    def _why_no_order(self) -> str:
        """Why the run reads windows of blocks rather than one global order."""
        data = self.data
        if data.source.frame is not None:
            return "the data are a dask DataFrame"
        if not data.settings.shuffle:
            return "rows are not shuffled"
        if data.cache is None:
            return "the parse cache is off"
        if not any(data.manifest.counts):
            return "the data have no rows"
        return ("the global order's buckets could not be dealt: no disk room, or workers that "
                "cannot read one another's files (the warning above says which)")

    def order_line(self) -> str:
        """How the epoch's rows are ordered, in one line (what shuffle quality the run gets, why)."""
        line = order_line(self.plan, units=self.units, blocks=len(self.data.manifest.counts),
                          shuffle=self.data.settings.shuffle, why=self._why_no_order())
        if self.buckets is not None and self.buckets.held:
            return (f"{line}; its buckets held in the trainer's memory, taken from the parse cache "
                    f"(~{format_bytes(self.buckets.held)} at most: none written)")
        if self.buckets is not None and self.buckets.building:
            return f"{line}; its buckets being dealt from the parse cache as training starts"
        if self.buckets is None or self.buckets.seconds is None:
            return line
        work = f": {self.buckets.work}" if self.buckets.work else ""
        return (f"{line}; its buckets dealt from the parse cache in {self.buckets.seconds:.1f}s"
                f"{work} (new rows only, as the data grow)")

    def built_line(self) -> str:
        """How long the buckets took, built in the background as training started ("": not so)."""
        b = self.buckets
        if b is None or not b.background or b.building or b.seconds is None:
            return ""
        if b.held:
            return (f"global order: its buckets held in the trainer's memory, taken from the "
                    f"parse cache in {b.seconds:.1f}s as training started: {b.work}")
        return (f"global order: its buckets dealt from the parse cache in {b.seconds:.1f}s as "
                f"training started{': ' + b.work if b.work else ''}")

    def set_position(self, epoch: int, position: int) -> None:
        """Serve ``epoch`` from ``position`` (see :meth:`position`), in this stream's layout.

        In the global order this trainer of ``world`` continues at the order's batch
        ``position + rank``: from its batch ``position // world`` of lanes whose origin is
        ``position % world``. An epoch with nothing left for it moves to the next.

        Raises
        ------
        ValueError
            ``position`` is beyond the epoch (windows of blocks).
        """
        epoch, position = int(epoch), int(position)
        if not self.global_order:
            self.set_epoch(epoch, position)
            return
        world = self.data.settings.shard[1]
        kept = int(kept_before(self.skips.epoch(epoch), position))
        origin, start = kept % world, kept // world
        plan = self._cursor.settings.plan(epoch, origin)
        if start >= plan.num_batches:
            self.set_epoch(epoch + 1, 0)
            return
        self._cursor.set(epoch, start, origin)
        self._origins = {epoch: origin}
        self._position = 0

    def set_last_epoch(self, epoch: int | None) -> None:
        """The run ends after ``epoch`` (None: not known): no window past it is fetched ahead."""
        self._cursor.set_last_epoch(None if epoch is None else int(epoch))

    def state(self, epoch: int | None = None, batch: int | None = None) -> StreamState:
        """The resume state once this trainer's ``batch`` of ``epoch`` is next (default: here).

        Where the stream stands is its epoch's ``start`` plus the batches :meth:`__iter__` has
        yielded (an epoch read to its end: the next epoch's batch 0). Readers that fetch ahead of
        what they train (Keras) pass their own count.

        Parameters
        ----------
        epoch, batch
            The epoch and this trainer's first batch not trained (default: where the stream
            stands).

        Returns
        -------
        StreamState
        """
        if epoch is None and batch is None:
            epoch, batch = self.epoch, self.start + self._position
            if batch >= self.plan.num_batches:
                epoch, batch = epoch + 1, 0
        epoch, batch = int(epoch if epoch is not None else self.epoch), int(batch or 0)
        st, ordered = self.data.settings, self.global_order
        return StreamState(
            epoch=epoch, batch=batch, seed=st.seed, batch_size=st.batch_size,
            fingerprint=self.data.manifest.fingerprint, num_batches=self.plan.num_batches,
            rows=self.plan.rows, window_rows=self.window_rows,
            blocksize=self.data.source.options.blocksize, shuffle=st.shuffle,
            drop_remainder=st.drop_remainder, label=st.label, features=tuple(self.data.features),
            shard=st.shard, validation_split=float(st.validation_split), units=self.units,
            position=self.position(batch, epoch) if ordered else None,
            order=ORDER_VERSION, skips=self.skips.ranges)

    def get_state(self, epoch: int | None = None, batch: int | None = None) -> dict[str, Any]:
        """The resume state (:meth:`state`) as plain JSON values, versioned: what is persisted.

        A stream of the same data and settings given it (:meth:`set_state`) serves exactly the
        batches this one would serve next, under any budget and, in the global order, any
        number of trainers. As Grain's checkpointable iterators have it: the stream owns its
        state; a Keras checkpoint (``state.json``) and ``TorchDataset.state_dict`` store it as
        it is.
        """
        return self.state(epoch, batch).to_dict()

    def set_state(self, state: dict[str, Any] | StreamState, *,
                  where: str = "The resume state", cli: bool = False) -> None:
        """Go on from a state :meth:`get_state` returned (of this stream or another's), checked.

        Parameters
        ----------
        state
            The state (a dict as :meth:`get_state` returned it, or of an older format; see
            :meth:`daskfeed.batches.StreamState.from_dict`).
        where, cli
            The errors' subject and their hints' style (:meth:`daskfeed.batches.StreamState.check`).

        Raises
        ------
        CheckpointError
            The state is of other data, or of settings that give other batches.
        ValueError
            The state's batch is not a batch of its epoch (windows of blocks).
        """
        mine = self.state()
        theirs = state if isinstance(state, StreamState) else StreamState.from_dict(state, like=mine)
        theirs.check(mine, where, cli=cli)
        if theirs.skips or self.data.settings.skip_batches:
            self._cursor.use_skips(self._resumed_skips(theirs))
        if theirs.position is not None:
            self.set_position(theirs.epoch, theirs.position)
        else:
            self.set_epoch(theirs.epoch, theirs.batch)

    def keep_skips(self, state: StreamState) -> None:
        """Keep on record the batches ``state`` left out, with this run's (nothing left to train).

        A resume at the end of its run trains nothing and positions nothing (its settings are
        not checked against the state's); what the run skipped is still said in its outputs.
        """
        if self.global_order and state.skips:
            self._cursor.use_skips(Skips.from_json(state.skips).union(self.data.settings.skip_batches))

    @property
    def skips(self) -> Skips:
        """The batches of the global order left out: the run's, and a resume state's."""
        return self._cursor.settings.skips

    def _resumed_skips(self, theirs: StreamState) -> Skips:
        """The batches left out going on from ``theirs``: those it recorded, and this run's after it.

        This run's ``skip_batches`` before the state's position (epoch ``theirs.epoch``,
        ``theirs.at``) were trained already: said, and not counted as skipped.
        """
        recorded = Skips.from_json(theirs.skips)
        asked = self.data.settings.skip_batches
        late = asked.before(theirs.epoch, theirs.at).without(recorded)
        if late:
            warn_user(f"--skip-batches {late.text()}: trained before the checkpoint (epoch "
                      f"{theirs.epoch + 1}, {theirs.at:,} batches of its order trained), so not "
                      "skipped; the batches after it are.")
        return recorded.union(asked.without(late))

    def __iter__(self) -> Iterator[Batch]:
        """The current epoch's batches in order from where the stream stands; then the next epoch.

        One epoch per iteration (as a ``torch`` ``IterableDataset`` or a plain loop reads it):
        as its last batch is yielded the stream moves to the next epoch, so the next ``iter()``
        serves that one, also when this iterator is not read to its end (Keras' epochs over a
        ``DataLoader`` of known length take its ``len`` batches and start a new iterator).
        :meth:`get_state` at any point between two batches resumes exactly after the last one
        yielded.
        """
        while self._position < len(self):
            batch = self.batch(self._position)
            self._position += 1
            if self._moved_on():
                yield batch
                return
            yield batch
        self._moved_on()

    def batches_per_run(self, nbytes: int | None = None) -> int:
        """Batches of at most ``nbytes`` encoded bytes, at least one (a run, a tf.data chunk).

        Default: ``RUN_BYTES`` (8 MiB), or a sixteenth of the prefetch where that is less (a run is
        held beside the windows the prefetch bounds).
        """
        st = self.data.settings
        cap = nbytes or min(RUN_BYTES, max(st.prefetch_bytes // 16, 1))
        return max(1, int(cap) // max(st.batch_size * self.data.encoding.bytes_per_row, 1))

    def runs(self, batches: int | None = None) -> Iterator[Batch]:
        """What ``iter()`` gives, read ``batches`` batches at a time into arrays of their own.

        Each run's rows are taken from their windows at once into new arrays (one copy,
        writable, contiguous) and its batches are views of them: per batch a slice, not a
        window's lookup and a copy (what a torch loop pays at every step). As with ``iter()``:
        the rest of the current epoch, then the stream moves on, and :meth:`get_state` between
        two batches resumes exactly after the last one yielded. A run's arrays are the
        caller's while it holds a batch of them.

        Parameters
        ----------
        batches
            Batches per run (at least 1; default: :meth:`batches_per_run`).
        """
        batches = self.batches_per_run() if batches is None else max(int(batches), 1)
        while self._position < len(self):
            count = min(batches, len(self) - self._position)
            plan, first, data = self._run(self._position, count)
            at = 0
            for b in range(first, first + count):
                n = plan.batch_rows(b)
                self._position += 1
                batch = data.take(at, at + n).batch()
                at += n
                if self._moved_on():
                    yield batch
                    return
                yield batch
        self._moved_on()

    def _moved_on(self) -> bool:
        """After the epoch's last batch (every batch served): the next epoch, from its start.

        Done as the last batch is handed out, not when the iterator is asked for one more: a
        reader that takes exactly ``len`` batches (Keras) would otherwise find the epoch it
        read still there, at its end, and get an empty epoch from its next iterator.
        """
        if self._position < len(self) or not self._cursor.finish(self.plan):
            return False
        self._position = 0
        return True

    def _run(self, index: int, count: int) -> tuple[EpochPlan, int, WindowData]:
        """Batches ``index .. index + count - 1`` of the current epoch: plan, plan index, rows owned."""
        self.check_usable()
        try:
            for _ in range(3):
                try:
                    return self._take_run(index, count)
                except WindowCancelled:
                    continue  # the epoch changed while we waited: take from the current plan
            return self._take_run(index, count)
        except DaskfeedError as err:
            self.failure = err
            raise

    def _take_run(self, index: int, count: int) -> tuple[EpochPlan, int, WindowData]:
        plan, pf, first = self._cursor.reserve(index, count)
        data = self.take(plan, pf, first, first + count)
        return plan, first, WindowData(_owned(data.x), np.array(data.y), _owned(data.w))

    @property
    def last_epoch_stats(self) -> EpochStats | dict[str, Any]:
        """:meth:`epoch_stats` of the last epoch that ended (empty before the first)."""
        return self._cursor.last_stats or {}

    def stats_of(self, epoch: int) -> EpochStats | dict[str, Any]:
        """:meth:`epoch_stats` of ``epoch`` once it ended (one of the last eight); else empty."""
        return self._cursor.ended.get(int(epoch), {})

    def epoch_stats(self) -> EpochStats:
        """Rows and batches served, seconds waited for data, windows computed this epoch."""
        return self._cursor.stats()

    # -- batches -----------------------------------------------------------------------
    def weigh_classes(self, class_weights: dict[int, float] | None) -> None:
        """Multiply each row's sample weight by its class's weight (None: stop doing so).

        What ``fit(class_weight=...)`` does to batches without sample weights, for batches
        that carry them (Keras takes one or the other). Only rows of the classes named in
        ``class_weights`` change (others keep weight x 1).

        Raises
        ------
        SettingError
            The data have no weight column, or ``class_weights`` names a class the label lacks.
        """
        if class_weights is None:
            self._class_weights = None
            return
        manifest = self.data.manifest
        if self.data.settings.weight is None:
            raise SettingError("Expected a weight column to multiply class weights into. "
                              "Received: no weight column.\nHint: pass class_weight to fit().")
        n = max(manifest.num_classes, 2 if manifest.task == "binary" else 0)
        if any(not 0 <= int(k) < n for k in class_weights):
            raise SettingError(f"Expected class ids 0..{n - 1} in the class weights. Received: "
                              f"{sorted(class_weights)}.\nHint: weigh the label's classes only.")
        table = np.ones(n, dtype="float32")
        for k, w in class_weights.items():
            table[int(k)] = w
        self._class_weights = table


    def batch(self, index: int) -> Batch:
        """Batch ``index`` of the current epoch as ``(x, y)``, or ``(x, y, w)`` with a weight.

        Raises
        ------
        IndexError
            ``index`` is out of range.
        DaskfeedError
            Reading the batch's windows failed (kept in ``failure`` too).
        """
        self.check_usable()  # first: a forked child must not touch the parent's locks
        try:
            for _ in range(3):
                try:
                    return self._batch(index)
                except WindowCancelled:
                    continue  # the epoch changed while we waited: serve from the current plan
            return self._batch(index)
        except DaskfeedError as err:
            self.failure = err
            raise

    def _batch(self, index: int) -> Batch:
        plan, pf, i = self._cursor.reserve(index)
        slices = plan.batch(i)
        batch = self._rows(plan, pf, slices)
        self._cursor.served(plan, i, slices, batch.y)
        return batch.batch()

    def open_pass(self, epoch: int, start: int) -> tuple[EpochPlan, Prefetcher]:
        """A pass over ``epoch`` from batch ``start`` begins: its plan and prefetcher."""
        self.check_usable()
        return self._cursor.open_pass(epoch, start)

    def take(self, plan: EpochPlan, pf: Prefetcher, first: int, end: int) -> WindowData:
        """Batches ``first .. end - 1`` of ``plan`` as one run of rows, marked served.

        Parameters
        ----------
        plan, pf
            What :meth:`open_pass` returned.
        first, end
            The batches (consecutive).

        Returns
        -------
        WindowData
            Their rows in order.
        """
        per_batch = [plan.batch(b) for b in range(first, end)]
        data = self._rows(plan, pf, _merged(per_batch))
        at = 0
        for b, slices in zip(range(first, end), per_batch, strict=True):
            n = plan.batch_rows(b)
            self._cursor.served(plan, b, slices, data.y[at : at + n])
            at += n
        return data

    def finish(self, plan: EpochPlan, advance: bool = True) -> bool:
        """End ``plan``'s epoch once every batch was served (its figures kept); maybe move on."""
        return self._cursor.finish(plan, advance=advance)

    def _rows(self, plan: EpochPlan, pf: Prefetcher, slices: list[Slice]) -> WindowData:
        """The rows of ``slices`` of ``plan``'s windows, in order (waiting for their windows)."""
        t = time.perf_counter()
        try:
            pieces = []
            for s in slices:
                data: WindowData = pf.get(s.window)
                expected = plan.windows[s.window].rows
                if len(data) != expected:
                    raise ManifestMismatchError(
                        f"Window {s.window} ({self._windows.describe(plan, s.window)}) has "
                        f"{len(data)} rows; the manifest says {expected}. The data changed after "
                        "the scan.\nHint: rescan (remove the cached manifest) and restart."
                    )
                pieces.append(data.take(s.start, s.stop))
            rows = concat(pieces)
            if self._class_weights is not None and rows.w is not None:  # a new array: windows
                rows = WindowData(rows.x, rows.y,  # may be held for other batches
                                  rows.w * self._class_weights[rows.y.astype("int64")])
            return rows
        finally:
            self.assembly_seconds += time.perf_counter() - t

    # -- the cluster side ---------------------------------------------------------------
    @property
    def spans(self) -> EpochSpans | None:
        """The epochs' spans the windows are submitted in (settable before the first epoch)."""
        return self._windows.spans

    @spans.setter
    def spans(self, spans: EpochSpans | None) -> None:
        self._windows.spans = spans

    @property
    def client(self) -> Client | None:
        """The ``distributed.Client`` (None once closed, or in an unpickled copy before use)."""
        return self._owner.client

    @property
    def owns_client(self) -> bool:
        """Whether closing the stream closes its client (it started it)."""
        return self._owner.owns

    def _client_or_connect(self) -> Client:
        """The client; after unpickling, a new connection to the same scheduler (owned)."""
        self.check_usable()
        if self._owner.client is None:
            self._owner.client = connect(self.data.scheduler_address, security=self.data.security)
            self._owner.owns = True
        if self._owner.client.status in ("closing", "closed"):
            raise ClusterError(  # (a client that lost its scheduler closes itself too)
                f"Lost the connection to the Dask scheduler ({self.data.scheduler_address}), or "
                "the client of this DaskSequence was closed. Expected a running client.\nHint: "
                "check that the scheduler is still running (or restart it and its workers), then "
                "run again; in a script, close the DaskSequence before its client, or create it "
                "again with a running client."
            )
        return self._owner.client

    def _submit(self, plan: EpochPlan, w: int) -> Pending[Any]:
        return self._windows.submit(self._client_or_connect(), plan, w)

    def _long_reads(self, older_than: float) -> str:
        """The reads running that long, on the workers and the trainer's reading threads."""
        return long_reads(self._owner.client, older_than, here=self._windows.here is not None)

    def _new_prefetcher(self, plan: EpochPlan, order: list[int], budget: int | None) -> Prefetcher:
        """A prefetcher bound to ``plan``, whatever epoch comes next (``budget``: room lent to it)."""
        pf = Prefetcher(
            functools.partial(self._submit, plan),
            functools.partial(self._windows.estimate, plan), order,
            budget=self._prefetch_room() if budget is None else budget,
            timeout=self.data.settings.timeout, describe=functools.partial(self._windows.describe, plan),
            long_reads=self._long_reads, stop=self._stop, ready=self._buckets_built,
        )
        if self._owner.client is not None:  # unpickled copies start on their first batch
            pf.start(within_budget=budget is not None)  # (not while the buckets are built)
        return pf

    def _prefetch_room(self) -> int:
        """The prefetch bytes the windows may hold: less the buckets the trainer holds, if any."""
        held = self.buckets.held if self.buckets is not None else 0
        return max(self.data.settings.prefetch_bytes - held, self.data.settings.prefetch_bytes // 2)

    def _buckets_built(self, wait: bool = True) -> bool:
        """Whether the buckets' files are there (or no global order); ``wait``: until they are.

        Built in the background, the windows read them from the first call that finds them
        built.

        Raises
        ------
        DaskfeedError
            Why the build in the background failed (``wait``).
        Aborted
            The process was asked to stop while waiting.
        """
        if self.buckets is None or self._windows.buckets is not None:
            return True
        if not wait and (self.buckets.building or self.buckets.failed):
            return False  # (the first batch waits, and raises what failed)
        files = self.buckets.wait(self._stop if self._stop is not None else PROCESS_STOP,
                                  self._closed_error)
        with self._built:
            if self._windows.buckets is None:
                self._windows.here = reads_here(self._owner.client, files,
                                                self.data.settings.window_reads)
                self._windows.buckets = files
        return True

    def _closed_error(self) -> BaseException | None:
        """Why a wait for this stream's data ends now: it was closed (None: it was not)."""
        if self._closed:
            return WindowCancelled("no batch: the sequence was closed while its buckets were built")
        return None

    def _new_cursor(self, epoch: int, start: int) -> EpochState:
        st = self.data.settings
        settings = PlanSettings(
            counts=tuple(self.data.manifest.counts), batch_size=st.batch_size, seed=st.seed,
            shuffle=st.shuffle, window_rows=self.window_rows, drop_remainder=st.drop_remainder,
            shard=st.shard,
            buckets=() if self.buckets is None else tuple(int(n) for n in self.buckets.sizes),
            skips=st.skip_batches)
        manifest = self.data.manifest
        classes = manifest.num_classes if manifest.task == "multiclass" else 0
        cursor = EpochState(settings, self._new_prefetcher, tolerance=self.tolerance,
                             classes=classes)
        cursor.set(epoch, start)
        return cursor

    # -- lifecycle ---------------------------------------------------------------------
    def close_with(self, dependent: Closes) -> None:
        """Close ``dependent`` (anything with ``close()``, e.g. the tf.data hand-off) with the stream."""
        self._dependents.add(dependent)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stop prefetching and building, release windows in flight, close the client if owned.

        A build of the buckets in the background stops too, at its next look at its tasks.
        Idempotent and quick. In a forked child it does nothing (the parent's connection is not
        the child's to close).
        """
        if self._owner.pid != os.getpid():
            return
        self._closed = True
        for dependent in list(self._dependents):
            dependent.close()
        self._cursor.close()
        self._windows.close()
        if self.buckets is not None:  # a build still running stops (before the client closes)
            self.buckets.close()
        self._owner.close()

    def check_usable(self) -> None:
        """Refuse a closed stream, and a fork's copy (e.g. Keras' worker processes)."""
        self._owner.check_process()
        if self._closed:
            raise DaskfeedError(
                "This DaskSequence is closed. Expected an open sequence.\nHint: create a new "
                "DaskSequence (pass manifest=old.manifest to skip the scan)."
            )

    def __getstate__(self) -> dict[str, Any]:
        self._buckets_built()  # (a copy reads the files this one waits for)
        state = self.__dict__.copy()
        for k in ("_owner", "_finalizer", "_closed", "_cursor", "_dependents", "_built"):
            state.pop(k, None)
        state["_resume"] = self.state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy in this process: it connects to the same scheduler on its first batch."""
        resume = state.pop("_resume")
        self.__dict__.update(state)
        self._owner = Owner()
        self._finalizer = weakref.finalize(self, self._owner.close)
        self._closed = False
        self._dependents = weakref.WeakSet()
        self._built = threading.Lock()
        self._cursor = self._new_cursor(0, 0)
        self._position = 0
        self.set_state(resume)


def _owned(x: Any) -> Any:
    """Arrays (a dict of them, or None) copied into new ones: writable, contiguous, not a window's."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: np.array(v) for k, v in x.items()}
    return np.array(x)


def _merged(per_batch: list[list[Slice]]) -> list[Slice]:
    """The slices of consecutive batches, touching slices of one window joined."""
    out: list[Slice] = []
    for slices in per_batch:
        for s in slices:
            if out and out[-1].window == s.window and out[-1].stop == s.start:
                out[-1] = Slice(s.window, out[-1].start, s.stop)
            else:
                out.append(s)
    return out
