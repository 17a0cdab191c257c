"""Prefetch: trainer-side window futures in flight, bounded in BYTES, thread-safe.

:class:`Prefetcher` keeps the windows of one epoch plan: the ones being consumed, and the next
ones in plan order as ``distributed`` futures, while their (estimated, then actual) bytes fit the
budget. Windows whose batches have all been served stay until their room is needed, so Keras'
re-reads (the TF backend peeks at batches 0 and 1) never recompute a window. Waiting is bounded
by ``timeout``; ``reset`` cancels everything in flight.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from daskfeed.exceptions import FeedTimeoutError

__all__ = ["ABORT", "Prefetcher", "WindowCancelled", "explain"]

# Set when the process is asked to stop (SIGTERM / SIGINT seen by the CLI's signal watcher):
# waits for windows end at once, so a batch blocked on a hung read does not hold up the
# shutdown until the timeout (the main thread may be inside TensorFlow, where Python signal
# handlers cannot run).
ABORT = threading.Event()
ABORT_SIGNAL: list[int] = []  # the signal that set ABORT (the CLI's watcher records it)
_POLL = 0.25  # seconds between checks of ABORT while waiting


class WindowCancelled(RuntimeError):
    """The window was dropped by ``reset`` while a caller waited for it."""


class Aborted(KeyboardInterrupt):
    """Waiting for a window was abandoned because the process is stopping (:data:`ABORT`)."""


def _result(future: Any, timeout: float) -> Any:
    """``future.result(timeout)``, abandoned as soon as :data:`ABORT` is set.

    Waits for the future to finish without gathering (a done-callback sets an event), then
    gathers once: polling ``result`` with short timeouts would cancel and restart the transfer
    of a large window again and again (and trips a race in ``distributed.utils.sync``).
    """
    if not hasattr(future, "add_done_callback"):
        return future.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    finished = threading.Event()
    future.add_done_callback(lambda _: finished.set())
    if not _wait_event(finished, timeout):
        raise TimeoutError(f"timed out after {timeout} s.")
    return future.result(timeout=max(deadline - time.monotonic(), 1.0))


def _wait_event(event: threading.Event, timeout: float) -> bool:
    """``event.wait(timeout)``, abandoned as soon as :data:`ABORT` is set."""
    deadline = time.monotonic() + timeout
    while not event.wait(max(min(_POLL, deadline - time.monotonic()), 0.0)):
        if ABORT.is_set():
            raise Aborted("stopping: no longer waiting for data")
        if time.monotonic() >= deadline:
            return False
    return True


def explain(err: BaseException, what: str, client: Any = None) -> BaseException:
    """A failure of a task on the cluster as a daskfeed error naming ``what`` it was reading.

    ``what``: e.g. "window 3 (epoch 0, partitions a.csv[0:64MB], ...)". The task was already
    retried (``retries=1``; a lost worker's tasks are recomputed by distributed), so what
    arrives here fails every time: a file removed, replaced or unreadable after the scan,
    workers dying on the task, or the scheduler gone. daskfeed's own errors (which name file
    and byte range), ``KeyboardInterrupt`` and the like pass through. ``client``: the task's
    client, asked whether the scheduler connection is gone when the task was cancelled.
    """
    from daskfeed.exceptions import ClusterError, DaskfeedError, DataError

    if isinstance(err, (DaskfeedError, WindowCancelled)) or not isinstance(err, Exception):
        return err
    kind = type(err).__name__
    text = f"{kind}: {str(err).strip()}"
    new: DaskfeedError
    if kind in ("FutureCancelledError", "CancelledError"):
        lost = ("connection-lost" in str(err) or "closed" in str(err)
                or getattr(client, "status", "running") not in ("running", "newly-created"))
        new = ClusterError(
            (f"Lost the connection to the Dask scheduler while waiting for {what}."
             if lost else f"The task reading {what} was cancelled on the cluster.")
            + f"\nReceived: {text}\nHint: check that the scheduler is still running (or restart "
            "it and its workers), then run again."
        )
    elif kind == "KilledWorker":
        new = ClusterError(
            f"Workers died every time they read {what}.\nReceived: {text}\n"
            "Hint: a worker is killed when it exceeds its memory limit: raise --memory-limit, "
            "use fewer --nworkers, or check the worker logs."
        )
    elif isinstance(err, OSError):
        new = DataError(
            f"Cannot read {what} on the cluster, even after a retry. Expected the files as they "
            f"were listed.\nReceived: {text}\nHint: a file removed, replaced or unreadable after "
            "it was listed fails every time: restore it, or rescan (delete the cached "
            "manifest.json) and restart."
        )
    else:
        new = DataError(
            f"Reading {what} failed on the cluster, even after a retry.\nReceived: {text}\n"
            "Hint: the worker's traceback is in the worker logs (and chained to this error)."
        )
    new.__cause__ = err
    return new


@dataclass
class _Entry:
    future: Any = None
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
        ``submit(w) -> Future`` starts computing window ``w`` on the cluster.
    estimate
        ``estimate(w) -> int``: expected encoded bytes of window ``w``.
    order
        Window indices in the order they will be consumed.
    budget
        Bytes of windows held or in flight; the window being asked for is always fetched.
    timeout
        Seconds to wait for one window before :class:`FeedTimeoutError`.
    describe
        ``describe(w) -> str`` for error messages (which partitions).
    """

    fetch_ahead = True  # gather finished windows in the background (off: on first use)

    def __init__(
        self,
        submit: Callable[[int], Any],
        estimate: Callable[[int], int],
        order: list[int],
        *,
        budget: int,
        timeout: float,
        describe: Callable[[int], str] = str,
    ) -> None:
        self._submit = submit
        self._estimate = estimate
        self._order = list(order)
        self._pos = {w: i for i, w in enumerate(self._order)}
        self.budget = int(budget)
        self.timeout = float(timeout)
        self._describe = describe
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self._fetcher: ThreadPoolExecutor | None = None
        self.submitted = 0
        self.wait_seconds = 0.0

    # -- public -------------------------------------------------------------------------
    def get(self, w: int) -> Any:
        """Return window ``w``'s data, fetching it (and the next ones) if needed."""
        with self._lock:
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

    def start(self) -> None:
        """Put the first windows of the order in flight (call before the first ``get``)."""
        if not self._order:
            return
        with self._lock:
            w = self._order[0]
            if w not in self._entries:
                self._start(w)
            self._fill_ahead(w)

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
            if self._fetcher is not None:
                self._fetcher.shutdown(wait=False, cancel_futures=True)
                self._fetcher = None
            for entry in self._entries.values():
                entry.cancelled = True
                if entry.future is not None and not entry.ready.is_set():
                    try:
                        entry.future.cancel()
                    except Exception:
                        pass
                entry.future = None
            self._entries.clear()

    @property
    def held_bytes(self) -> int:
        """Bytes of windows held or (estimated) in flight."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    # -- internals (call with the lock held) ---------------------------------------------
    def _start(self, w: int) -> _Entry:
        entry = _Entry(nbytes=int(self._estimate(w)))
        self._make_room(entry.nbytes, keep=w)
        self._entries[w] = entry
        future = self._submit(w)
        entry.future = future
        self.submitted += 1
        if self.fetch_ahead and hasattr(future, "add_done_callback"):  # fetch it as soon as done
            future.add_done_callback(lambda _, w=w, entry=entry: self._fetch_soon(w, entry))
        return entry

    def _fetch_soon(self, w: int, entry: _Entry) -> None:
        """Window ``w`` is computed (called on distributed's callback thread: never block here)."""
        with self._lock:
            if entry.claimed or entry.cancelled or self._entries.get(w) is not entry:
                return
            if getattr(entry.future, "status", None) != "finished":
                return  # a failure is explained to the caller who needs the window
            if self._fetcher is None:
                self._fetcher = ThreadPoolExecutor(1, thread_name_prefix="daskfeed-fetch")
            try:
                self._fetcher.submit(self._wait, w, entry, False)
            except RuntimeError:  # shut down by reset(): nobody wants this window any more
                pass

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
        try:
            if not claimed:  # another thread gathers this window: wait for it
                if not _wait_event(entry.ready, self.timeout + 5):
                    raise TimeoutError
                return
            if future is None or entry.cancelled:  # reset() (an epoch change) cancelled it
                raise WindowCancelled(f"window {w} was cancelled by an epoch change")
            data = _result(future, self.timeout)
        except TimeoutError as err:
            if entry.ready.is_set():
                return
            entry.error = FeedTimeoutError(
                f"Window {w} ({self._describe(w)}) did not arrive within {self.timeout:g}s.\n"
                "Hint: a read that blocks (hung storage, a FIFO) never finishes: check the "
                "workers on the dashboard; for very slow storage raise --timeout "
                "(daskfeed.timeout)."
            )
            entry.error.__cause__ = err
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
                if waiting:
                    self.wait_seconds += time.perf_counter() - t0
                if entry.error is not None and self._entries.get(w) is entry:
                    del self._entries[w]  # a later get retries from scratch
            if claimed or entry.error is not None:
                entry.ready.set()

    def _fill_ahead(self, w: int) -> None:
        i = self._pos.get(w)
        if i is None:
            return
        for nxt in self._order[i + 1 :]:
            if nxt in self._entries:
                continue
            est = int(self._estimate(nxt))
            if self._used() + est > self.budget and not self._evictable(est):
                break
            self._start(nxt)

    def _used(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

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
                    e.future.cancel()
                del self._entries[w]
        # still no room (random access): windows ahead that are already here, farthest first;
        # their keys were released when they arrived, so nothing is cancelled on the cluster
        ahead = [w for w, e in self._entries.items()
                 if w != keep and e.ready.is_set() and e.future is None and e.error is None]
        for w in sorted(ahead, key=lambda w: -self._pos.get(w, -1)):
            if self._used() + need <= self.budget:
                return
            del self._entries[w]
