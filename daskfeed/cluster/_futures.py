"""Futures: waiting on, gathering and releasing ``distributed`` futures; a failed task explained.

Every wait here ends when the process is asked to stop or the caller's ``stop()`` says why
waiting is pointless; :func:`explain` turns a task's failure into a daskfeed error naming what
it was reading.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dask.utils import format_bytes

from daskfeed.core import (
    PROCESS_STOP,
    Aborted,
    BudgetError,
    ClusterError,
    DaskfeedError,
    DataError,
    Stop,
)

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed import Client, Future

POLL_SECONDS = 0.01  # seconds between looks at a future in flight
PAUSED_PATIENCE = 60.0  # seconds every worker may stay paused before result_unless_paused gives up
PAUSED_LOOK = 1.0  # seconds between looks at the workers' states while waiting


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """A result to come: a ``distributed.Future`` or a ``concurrent.futures.Future``.

    ``release``, ``client``, ``key`` and ``status`` (a ``distributed.Future``'s) are used where
    present.
    """

    def result(self, timeout: float | None = None) -> T_co:
        """The result, waiting at most ``timeout`` seconds (None: no limit)."""
        ...

    def done(self) -> bool:
        """Whether it finished (a result or an error)."""
        ...

    def cancel(self) -> bool:
        """Drop it if it can be."""
        ...


class WindowCancelled(RuntimeError):
    """The window was dropped by ``reset`` or ``close`` while a caller waited for it."""


def wait_for(ready: Callable[[], bool], timeout: float, pause: Callable[[float], object],
             interval: float, stop: Callable[[], BaseException | None] | None = None,
             process: Stop = PROCESS_STOP) -> bool:
    """Wait until ``ready()``; False once ``timeout`` seconds passed.

    ``pause(s)`` waits up to ``s`` seconds between looks (an event's ``wait`` returns early).

    Raises
    ------
    Aborted
        ``process`` asked to stop (a request, or SIGINT / SIGTERM since the wait began or just
        before it).
    BaseException
        What ``stop()`` returns (a cancelled window, a closed client), as soon as it returns one.
    """
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while not ready():
        if process.stopped(since):
            raise Aborted("stopping: no longer waiting for data")
        err = stop() if stop is not None else None
        if err is not None:
            raise err
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        pause(min(interval, left))
    return True


def result(future: Pending[T], timeout: float,
           stop: Callable[[], BaseException | None] | None = None,
           process: Stop = PROCESS_STOP) -> T:
    """``future.result(timeout)``, abandoned as soon as the process stops or ``stop()`` says so.

    Waits for the future to finish without gathering (looking at its state), then gathers once:
    polling ``result`` with short timeouts would cancel and restart the transfer of a large
    window again and again (and trips a race in ``distributed.utils.sync``).

    Parameters
    ----------
    future
        A ``distributed.Future`` (or anything with ``result(timeout=)``).
    timeout
        Seconds to wait in all (``math.inf``: no limit).
    stop, process
        As for :func:`wait_for`.

    Returns
    -------
    object
        The future's result.

    Raises
    ------
    TimeoutError
        ``timeout`` passed first.
    """
    endless = math.isinf(timeout)  # (distributed takes None for no timeout, not inf)
    if not hasattr(future, "done"):
        return future.result(timeout=None if endless else timeout)
    deadline = time.monotonic() + timeout
    if not wait_for(future.done, timeout, time.sleep, POLL_SECONDS, stop, process):
        raise TimeoutError(f"timed out after {timeout} s.")
    err = stop() if stop is not None else None  # a closed client cancelled it: nothing to gather
    if err is not None:
        raise err
    return future.result(timeout=None if endless else max(deadline - time.monotonic(), 1.0))


def result_unless_paused(future: Future[T], *, patience: float = PAUSED_PATIENCE,
                         what: str = "a task", process: Stop = PROCESS_STOP,
                         timeout: float = math.inf,
                         abandon: Callable[[], BaseException | None] | None = None) -> T:
    """:func:`result` with no timeout, or a :class:`BudgetError` once every worker stays paused.

    A worker pauses at ``distributed.worker.memory.pause`` (80 %) of its memory limit and runs
    nothing until its memory falls; memory no task holds (a loaded model, the runtime) never
    falls, so the wait would never end. After ``patience`` seconds with every worker paused,
    this says so instead. Like every wait here it ends when the process is asked to stop.

    Parameters
    ----------
    future
        A ``distributed.Future``.
    patience
        Seconds every worker may stay paused.
    what
        What the task does (for the message).
    process
        The stop request that ends the wait.
    timeout
        Seconds to wait in all (default: no limit).
    abandon
        Returns an error to raise instead of waiting on (its caller gave up), or None.

    Returns
    -------
    object
        The future's result.

    Raises
    ------
    BudgetError
        Every worker stayed paused for ``patience`` seconds.
    TimeoutError
        ``timeout`` passed first.
    """
    client = future.client
    looked, since = [0.0], [math.inf]  # the last look at the workers; since when all paused

    def paused() -> BaseException | None:
        given_up = abandon() if abandon is not None else None
        if given_up is not None:
            return given_up
        now = time.monotonic()
        if future.done() or now - looked[0] < PAUSED_LOOK:  # done: gathered whatever happened
            return None
        looked[0] = now
        try:
            workers = client.scheduler_info(n_workers=-1)["workers"]
        except Exception:  # a client closing or gone: the future's own error says why
            return None
        if not workers or any(w.get("status") != "paused" for w in workers.values()):
            since[0] = math.inf
            return None
        since[0] = min(since[0], now)
        if now - since[0] < patience:
            return None
        limit = min(w.get("memory_limit") or 0 for w in workers.values())
        return BudgetError(
            f"Expected the workers to run {what}. Received: every worker has been paused for "
            f"{patience:g}s at distributed.worker.memory.pause of its memory limit "
            f"({format_bytes(limit)}), with nothing it can spill.\n"
            "Hint: raise --memory-limit, or run fewer --nworkers (each holds its own copy) or "
            "smaller --blocksize.")

    return result(future, timeout, paused, process)


def client_status(future: object) -> str:
    """The status of ``future``'s client ("running" when it has none)."""
    return str(getattr(getattr(future, "client", None), "status", "running"))


def drop(future: Pending[Any], *, cancel: bool) -> None:
    """Cancel ``future`` (a round trip to the scheduler), or release it (no wait); never raises.

    Cancelling is only tried while its client runs: a closed or reconnecting client could make
    it wait for a scheduler that is gone.
    """
    with contextlib.suppress(Exception):
        if (cancel and client_status(future) == "running") or not hasattr(future, "release"):
            future.cancel()
        else:
            future.release()


def settle(futures: Iterable[Pending[Any]], timeout: float) -> None:
    """Wait (at most ``timeout`` s) until the scheduler knows the keys of ``futures``.

    A task submitted just before the process exits may still be queued in the scheduler's
    ``update-graph``, which runs on a thread pool that refuses work once the interpreter shuts
    down (an in-process scheduler then logs "cannot schedule new futures after shutdown");
    releasing the future does not cancel that. Usually one round trip. Never raises.
    """
    by_client: dict[int, tuple[Client, list[Key]]] = {}
    for f in futures:
        client = getattr(f, "client", None)
        if client is not None and hasattr(f, "key") and not f.done():
            by_client.setdefault(id(client), (client, []))[1].append(f.key)
    deadline = time.monotonic() + timeout
    for client, keys in by_client.values():
        with contextlib.suppress(Exception):
            while client.status == "running" and time.monotonic() < deadline:
                if client.scheduler is None:  # no connection: nothing to wait for
                    break
                known = client.sync(client.scheduler.get_task_status, keys=keys,
                                    callback_timeout=max(deadline - time.monotonic(), 0.01))
                if all(v is not None for v in known.values()):
                    break
                time.sleep(POLL_SECONDS)  # the scheduler is still materializing the graph


def explain(err: BaseException, what: str, client: Client | None = None) -> BaseException:
    """A failure of a task on the cluster as a daskfeed error naming ``what`` it was reading.

    ``what``: e.g. "window 3 (epoch 0, blocks a.csv[0:64MB], ...)". The task was already
    retried (``retries=1``; a lost worker's tasks are recomputed by distributed), so what
    arrives here fails every time: a file removed, replaced or unreadable after the scan,
    workers dying on the task, or the scheduler gone. daskfeed's own errors (which name file
    and byte range), ``KeyboardInterrupt`` and the like pass through. ``client``: the task's
    client, asked whether the scheduler connection is gone when the task was cancelled.

    Parameters
    ----------
    err
        What gathering the task's result raised.
    what
        What the task was reading, for the message.
    client
        The task's client, or None.

    Returns
    -------
    BaseException
        A :class:`~daskfeed.ClusterError` or :class:`~daskfeed.DataError`
        chained to ``err``; ``err`` itself when it is daskfeed's own or not an ``Exception``.
    """
    if isinstance(err, (DaskfeedError, WindowCancelled)) or not isinstance(err, Exception):
        return err
    kind = type(err).__name__
    text = f"{kind}: {str(err).strip()}"
    new: DaskfeedError
    if kind in ("FutureCancelledError", "CancelledError", "CommClosedError", "StreamClosedError"):
        lost = ("connection-lost" in str(err) or "closed" in str(err) or kind.endswith("ClosedError")
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


def gathered_map(client: Client) -> Callable[..., list[Any]]:
    """``map`` on the cluster: ``fn`` on each item of the iterables at once, the results in order.

    Parameters
    ----------
    client
        The ``distributed.Client``.

    Returns
    -------
    callable
        ``(fn, *iterables) -> list``; its futures are released once gathered.
    """
    def run(fn: Callable[..., Any], *iterables: Any) -> list[Any]:
        futures = client.map(fn, *iterables, pure=False)
        try:
            return list(client.gather(futures))
        finally:
            for f in futures:
                f.release()

    return run
