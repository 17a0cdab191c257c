"""Prefetch: trainer-side window futures in flight, bounded in BYTES, thread-safe.

:class:`Prefetcher` keeps the windows of one epoch plan: the ones being consumed, and the next
ones in plan order as ``distributed`` futures, while their (estimated, then actual) bytes fit the
budget. Windows whose batches have all been served stay until their room is needed, so Keras'
re-reads (the TF backend peeks at batches 0 and 1) never recompute a window. Once every window
of its epoch is in flight, room it does not use can be lent (:meth:`lend`) to the next epoch's
prefetcher, which starts that epoch's first windows within it (:meth:`start` with
``within_budget``): the two together never exceed the budget. Waiting is bounded
by ``timeout``; ``reset`` cancels everything in flight; ``close`` stops for good.

Nothing here can keep a process alive. Finished windows are gathered ahead by a daemon thread
that lives only while windows are in flight and looks at their futures every few milliseconds
(no done-callbacks: distributed runs those on a thread pool that the interpreter joins at exit
and that refuses work once shutdown began). Every wait ends when its window is cancelled, the
prefetcher is closed, the futures' client closes, the process is asked to stop (SIGINT or
SIGTERM, even while the main thread is blocked inside TensorFlow) or the timeout passes.
Prefetchers still open at interpreter exit are closed then.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskfeed.cluster import (
    POLL_SECONDS,
    WindowCancelled,
    client_status,
    drop,
    explain,
    result,
    settle,
    wait_for,
)
from daskfeed.core import PROCESS_STOP, SETTLE, ClusterError, FeedTimeoutError, Stop, close_at_exit
from daskfeed.reading import ASK_SECONDS

if TYPE_CHECKING:
    from daskfeed.cluster import Pending

_POLL = 0.25  # seconds between checks of the stop request while waiting for another thread's gather
_CLOSE_LOCK_WAIT = 2.0  # close(): longest wait for a busy lock (the client's close frees the rest)



@dataclass
class _Entry:
    future: Pending[Any] | None = None
    data: Any = None
    nbytes: int = 0
    done_serving: bool = False
    claimed: bool = False
    cancelled: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class Prefetcher:
    """Windows of one epoch, fetched ahead within ``budget`` bytes.

    Parameters
    ----------
    submit
        ``submit(w) -> Future`` starts computing window ``w`` (on the cluster, or in the
        trainer's own threads: a ``concurrent.futures.Future``).
    estimate
        ``estimate(w) -> int``: expected encoded bytes of window ``w``.
    order
        Window indices in the order they will be consumed.
    budget
        Bytes of windows held or in flight; the window being asked for is always fetched.
    timeout
        Seconds to wait for one window before :class:`FeedTimeoutError`.
    describe
        ``describe(w) -> str`` for error messages (which blocks).
    long_reads
        ``long_reads(seconds) -> str``: the reads running that long or longer, for a timeout's
        message (the window waited for may only queue behind a read that hangs;
        :func:`~daskfeed.reading.long_reads`).
    stop
        The :class:`~daskfeed.core._lifecycle.Stop` whose request ends every wait with
        :class:`~daskfeed.core._lifecycle.Aborted`; default: the process-wide one.
    ready
        ``ready(wait) -> bool``: whether what the windows read exists (the global order's
        buckets, built in the background). :meth:`get` calls it with ``wait`` before it starts a
        window: it blocks until they do, raising why they cannot (a wait that is not a window's:
        no ``timeout``, no data wait counted); nothing else starts a window until they do.

    Notes
    -----
    ``close`` (also run at interpreter exit) releases every future without waiting for the
    scheduler; the fetch thread is a daemon that holds the prefetcher only weakly and ends
    when nothing is in flight, so an unused prefetcher is collected with its futures.
    """

    fetch_ahead = True  # gather finished windows in the background (off: on first use)

    def __init__(
        self,
        submit: Callable[[int], Pending[Any]],
        estimate: Callable[[int], int],
        order: list[int],
        *,
        budget: int,
        timeout: float,
        describe: Callable[[int], str] = str,
        long_reads: Callable[[float], str] | None = None,
        stop: Stop | None = None,
        ready: Callable[[bool], bool] | None = None,
    ) -> None:
        self._submit = submit
        self._ready = ready
        self._estimate = estimate
        self._order = list(order)
        self._pos = {w: i for i, w in enumerate(self._order)}
        self.budget = int(budget)
        self.timeout = float(timeout)
        self._describe = describe
        self._long_reads = long_reads
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self._fetching: dict[int, _Entry] = {}  # in flight, to gather as soon as finished
        self._fetcher: threading.Thread | None = None
        self._stop = threading.Event()  # set by close(): the fetch thread ends
        self._closed = False
        self._pid = os.getpid()
        self.submitted = 0
        self.wait_seconds = 0.0
        self.lent = 0  # bytes of the budget lent to the next epoch's prefetcher (see lend)
        self._furthest = -1  # the furthest position in the order ever started
        self._process_stop = stop if stop is not None else PROCESS_STOP
        close_at_exit(self)
        Stop.listen()

    # -- public -------------------------------------------------------------------------
    def get(self, w: int) -> Any:
        """Return window ``w``'s data, fetching it (and the next ones) if needed."""
        if self._ready is not None:
            self._ready(True)
        with self._lock:
            if self._closed:
                raise WindowCancelled(f"window {w} was not fetched: the prefetcher is closed")
            entry = self._entries.get(w)
            if entry is None:
                entry = self._start(w)
            self._entries.move_to_end(w)
            self._fill_ahead(w)
        if not entry.ready.is_set():
            self._wait(w, entry)
        if entry.error is not None:
            raise entry.error
        return entry.data

    def start(self, first: int | None = None, within_budget: bool = False) -> None:
        """Put the first windows of the order in flight (call before the first ``get``).

        Parameters
        ----------
        first
            The window to start from (default: the order's first).
        within_budget
            Start the first window too only if it fits the budget (the next epoch's windows,
            fetched ahead in lent room); by default the first window is always started.
        """
        if not self._order or self._closed or (self._ready is not None and not self._ready(False)):
            return
        with self._lock:
            w = self._order[0] if first is None else first
            if w not in self._entries:
                if within_budget and self._used() + int(self._estimate(w)) > self.budget:
                    return
                self._start(w)
            self._fill_ahead(w)

    def lend(self, let_go: bool = False) -> int:
        """Lend the room not used now to another prefetcher, if every window was started.

        From then on this prefetcher counts the lent bytes as used: the windows it holds and
        the other's stay within one budget. Called again as windows are served, each call
        lends what was freed since. :meth:`reset` ends the loan.

        Parameters
        ----------
        let_go
            Drop the windows whose batches were all served first, and lend their room too: for
            a reader in order, which reads none of them again. Kept, their room would be lent
            only at the epoch's end, and the cluster would sit idle while this epoch's last
            windows are trained. A reader out of order keeps them (a batch read again would
            compute its window again).

        Returns
        -------
        int
            The bytes lent by this call: 0 while a window of the order was never started.
        """
        with self._lock:
            if self._closed or not self.started_all:
                return 0
            if let_go:
                for w in [w for w, e in self._entries.items() if e.done_serving and e.ready.is_set()]:
                    del self._entries[w]
            room = max(self.budget - self._used(), 0)
            self.lent += room
            return room

    def grow(self, room: int) -> None:
        """``room`` more bytes lent (:meth:`lend`): start the next windows of the order within them.

        Parameters
        ----------
        room
            Bytes added to the budget.
        """
        with self._lock:
            self.budget += int(room)
        self.start(within_budget=True)

    def end_loan(self) -> None:
        """The room lent (:meth:`lend`) is this prefetcher's again."""
        with self._lock:
            self.lent = 0

    def done_serving(self, w: int) -> None:
        """Mark window ``w`` fully served: it may be evicted when room is needed."""
        with self._lock:
            entry = self._entries.get(w)
            if entry is not None:
                entry.done_serving = True
            self._fill_ahead(w)

    def reset(self) -> None:
        """Cancel everything in flight and drop every held window."""
        with self._lock:
            for entry in self._entries.values():
                entry.cancelled = True
                if entry.future is not None and not entry.ready.is_set():
                    drop(entry.future, cancel=True)
                entry.future = None
            self._entries.clear()
            self._fetching.clear()  # the fetch thread ends
            self.end_loan()

    def close(self) -> None:
        """Stop for good: release every window in flight, drop held ones, end the fetch thread.

        Callers waiting for a window get :class:`WindowCancelled` within milliseconds.
        Futures are released, not cancelled: no wait for the cluster beyond making sure the
        scheduler knows them (one round trip, at most ``SETTLE`` s; see :func:`~daskfeed.cluster.settle`).
        Idempotent; a no-op in a forked child (the parent's futures are not its to release).
        """
        if self._pid != os.getpid() or self._closed:
            return
        self._closed = True
        self._stop.set()
        if not self._lock.acquire(timeout=_CLOSE_LOCK_WAIT):
            return  # a submit holds the lock: the client's close releases the rest
        try:
            entries = list(self._entries.values())
            self._entries.clear()
            self._fetching.clear()
            for entry in entries:
                entry.cancelled = True
            fetcher = self._fetcher
        finally:
            self._lock.release()
        in_flight = [e.future for e in entries if e.future is not None]
        for entry in entries:
            entry.future = None
        settle(in_flight, SETTLE)
        for future in in_flight:
            drop(future, cancel=False)
        if fetcher is not None and fetcher is not threading.current_thread():
            fetcher.join(_CLOSE_LOCK_WAIT)  # it sees the stop at its next look (a gather ends first)

    def settle(self, deadline: float) -> None:
        """Wait until ``deadline`` for gathers in progress (a transfer cut by the exit may log).

        Parameters
        ----------
        deadline
            ``time.monotonic()`` after which nothing is waited for.
        """
        if self._pid != os.getpid():
            return
        with self._lock:
            busy = [e for e in self._entries.values() if e.claimed and not e.ready.is_set()]
        with contextlib.suppress(BaseException):
            for e in busy:
                wait_for(e.ready.is_set, max(deadline - time.monotonic(), 0.0), e.ready.wait, _POLL,
                          process=self._process_stop)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def started_all(self) -> bool:
        """Whether every window of the order was started (in flight, here, or served)."""
        return self._furthest >= len(self._order) - 1

    @property
    def held_bytes(self) -> int:
        """Bytes of windows held or (estimated) in flight."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    # -- internals (call with the lock held) ---------------------------------------------
    def _start(self, w: int) -> _Entry:
        self._furthest = max(self._furthest, self._pos.get(w, -1))
        entry = _Entry(nbytes=int(self._estimate(w)))
        self._make_room(entry.nbytes, keep=w)
        self._entries[w] = entry
        future = self._submit(w)
        entry.future = future
        self.submitted += 1
        if self.fetch_ahead and hasattr(future, "done"):  # gathered as soon as it is done
            self._fetching[w] = entry
            if self._fetcher is None or not self._fetcher.is_alive():
                self._fetcher = threading.Thread(
                    target=_fetch_loop, args=(weakref.ref(self), self._stop), daemon=True,
                    name="daskfeed-fetch")
                self._fetcher.start()
        return entry

    def _fetch_once(self) -> bool:
        """Gather the fetched windows that finished; False (thread ends) when none is left."""
        with self._lock:
            finished = self._finished()
            if not (finished or self._fetching):
                self._fetcher = None
                return False
        for w, entry in finished:
            self._wait(w, entry, False)
        return True

    def _finished(self) -> list[tuple[int, _Entry]]:
        """Watched windows whose futures finished (failures are explained to their caller)."""
        finished = []
        for w, e in list(self._fetching.items()):
            if e.claimed or e.cancelled or e.future is None or self._entries.get(w) is not e:
                del self._fetching[w]
            elif e.future.done():
                del self._fetching[w]
                if getattr(e.future, "status", "finished") == "finished":
                    finished.append((w, e))
        return finished

    def _stopped(self, w: int, entry: _Entry, future: Pending[Any] | None) -> BaseException | None:
        """Why waiting for window ``w`` is pointless now, or None."""
        if entry.cancelled or self._closed:
            why = "the prefetcher was closed" if self._closed else "an epoch change"
            return WindowCancelled(f"window {w} was cancelled by {why}")
        if future is not None and client_status(future) in ("closing", "closed"):
            return ClusterError(  # (a client that lost its scheduler closes itself too)
                f"Lost the connection to the Dask scheduler, or its client was closed, while "
                f"waiting for window {w} ({self._describe(w)}).\nHint: check that the scheduler "
                "is still running (or restart it and its workers), then run again; in a script, "
                "close the DaskSequence (or leave its `with` block) before closing its client."
            )
        return None

    def _wait(self, w: int, entry: _Entry, waiting: bool = True) -> None:
        """Gather window ``w`` into ``entry`` (or wait for whoever gathers it).

        ``waiting``: a caller needs the window now (its time counts as data wait); False for the
        background fetch of a finished window, which lets the next ``get`` find it here.
        """
        t0 = time.perf_counter()
        with self._lock:
            if not waiting and (entry.claimed or entry.cancelled):
                return
            claimed = not entry.claimed
            entry.claimed = True
            future = entry.future
        stop = functools.partial(self._stopped, w, entry, future)
        try:
            if claimed:
                self._gather(w, entry, future, stop)
            else:
                self._await_other(w, entry, stop)
        finally:
            if waiting:
                with self._lock:
                    self.wait_seconds += time.perf_counter() - t0

    def _await_other(self, w: int, entry: _Entry, stop: Callable[[], BaseException | None]) -> None:
        """Wait for another thread's gather of window ``w``; its errors reach ``get``."""
        # (the gathering thread's timeout, then its ask of the workers for the message)
        if not wait_for(entry.ready.is_set, self.timeout + ASK_SECONDS + 5, entry.ready.wait,
                        _POLL, stop, self._process_stop):
            raise self._timeout_error(w, TimeoutError())

    def _gather(self, w: int, entry: _Entry, future: Pending[Any] | None,
                stop: Callable[[], BaseException | None]) -> None:
        """Gather window ``w``'s future into ``entry``: its data, or the error to raise."""
        try:
            if future is None or entry.cancelled:  # reset() (an epoch change) cancelled it
                raise WindowCancelled(f"window {w} was cancelled by an epoch change")
            data = result(future, self.timeout, stop, self._process_stop)
        except TimeoutError as err:
            if not entry.ready.is_set():
                entry.error = self._timeout_error(w, err)
        except BaseException as err:  # surfaced to the caller by get(), KeyboardInterrupt too
            if entry.cancelled and not isinstance(err, WindowCancelled):
                entry.error = WindowCancelled(f"window {w} was cancelled by an epoch change")
                entry.error.__cause__ = err
            else:
                entry.error = explain(err, f"window {w} ({self._describe(w)})",
                                      getattr(future, "client", None))
        else:
            with self._lock:
                entry.data = data
                entry.nbytes = int(getattr(data, "nbytes", entry.nbytes))
                entry.future = None  # drop our reference: the cluster frees its copy
        finally:
            with self._lock:
                if entry.error is not None and self._entries.get(w) is entry:
                    del self._entries[w]  # a later get retries from scratch
                closed = self._closed
            if closed and future is not None:  # close() may have missed it: release it here
                entry.future = None
                drop(future, cancel=False)
            entry.ready.set()

    def _timeout_error(self, w: int, cause: BaseException) -> FeedTimeoutError:
        since = self.timeout / 2  # a read the window waits behind began before its wait, or in it
        reads = self._long_reads(since) if self._long_reads is not None else ""
        running = f"{reads[:1].upper()}{reads[1:]}.\n" if reads else ""
        err = FeedTimeoutError(
            f"Window {w} ({self._describe(w)}) did not arrive within {self.timeout:g}s.\n"
            f"{running}Hint: a read that blocks (hung storage, a FIFO) never finishes: check the "
            f"{'files named' if reads else 'workers on the dashboard'}; for very slow storage "
            "raise --timeout (daskfeed.timeout)."
        )
        err.__cause__ = cause
        return err

    def _fill_ahead(self, w: int) -> None:
        i = self._pos.get(w)
        if i is None or self._closed or (self._ready is not None and not self._ready(False)):
            return  # (nothing started before what the windows read exists: done_serving, reset)
        for nxt in self._order[i + 1 :]:
            if nxt in self._entries:
                continue
            est = int(self._estimate(nxt))
            if self._used() + est > self.budget and not self._evictable(est):
                break
            self._start(nxt)

    def _used(self) -> int:
        return self.lent + sum(e.nbytes for e in self._entries.values())

    def _evictable(self, need: int) -> bool:
        free = self.budget - self._used()
        for e in self._entries.values():
            if e.done_serving:
                free += e.nbytes
        return free >= need

    def _make_room(self, need: int, keep: int) -> None:
        """Evict served windows, then arrived ones behind ``keep``, then ahead, until ``need`` fits.

        Arrived windows ahead of ``keep`` go farthest first. Windows still in flight are never
        cancelled for room (the budget is exceeded by the window asked for instead): releasing
        a key and submitting it again at once can leave the new future waiting forever in
        distributed.
        """
        here = self._pos.get(keep, len(self._order))
        for only_served in (True, False):
            for w in list(self._entries):
                if self._used() + need <= self.budget:
                    return
                e = self._entries[w]
                if w == keep or (only_served and not e.done_serving):
                    continue
                if not only_served and (not e.ready.is_set() or self._pos.get(w, -1) > here):
                    continue  # never cancel what someone may be waiting for, nor the future
                if e.future is not None and not e.ready.is_set():
                    drop(e.future, cancel=True)
                del self._entries[w]
        # still no room (random access): windows ahead that are already here, farthest first;
        # their keys were released when they arrived, so nothing is cancelled on the cluster
        ahead = [w for w, e in self._entries.items()
                 if w != keep and e.ready.is_set() and e.future is None and e.error is None]
        for w in sorted(ahead, key=lambda w: -self._pos.get(w, -1)):
            if self._used() + need <= self.budget:
                return
            del self._entries[w]


def _fetch_loop(ref: weakref.ref[Prefetcher], stop: threading.Event) -> None:
    """Body of a prefetcher's fetch thread (a daemon): gather its windows as they finish.

    Holds the prefetcher only weakly between looks, so an unused one is collected (and its
    futures released); ends when it is closed, collected, or has nothing in flight.
    """
    while not stop.wait(POLL_SECONDS):
        pf = ref()
        if pf is None or not pf._fetch_once():
            return
        del pf
