"""Windows of the global order read by the trainer itself, when its cluster is this machine.

A window of the global order is a few whole bucket files read, put in the epoch's order and
encoded (:func:`~daskfeed.batches._read.read_buckets`): a worker does that and sends the arrays
back over the cluster's socket (pickled, through TLS on a local cluster), and the trainer's
event loop receives them while the model trains. When every worker runs on this machine and
the bucket files are on its disk, the trainer reads them itself, in threads of its own (Arrow's
reads, ``take`` and numpy's kernels release the GIL): the same arrays, with no pickling, no TLS
and no copy out of a worker (``docs/development.md`` has the figures).

``daskfeed.window-reads`` chooses: ``auto`` (the trainer where it can, as above), ``workers``
(always the cluster's tasks). Memory: a window read here is held by the trainer while it is
read (the bucket tables, then its arrays) instead of by a worker, and the prefetch bounds the
windows in flight either way; the process tree's peak, the budget's measure, is the same.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from daskfeed.batches._read import read_buckets

if TYPE_CHECKING:
    from daskfeed.batches._memory_buckets import BucketFiles
    from daskfeed.batches._order import Lanes
    from daskfeed.manifest import Encoding, WindowData


WORKER_SHARE = 4  # rows taken aside: at most a quarter of a worker's memory limit


class HereReads:
    """Threads of the trainer that read windows of the global order (see the module's text).

    Parameters
    ----------
    threads
        Windows read at once (one per local worker: what the workers' share of the budget held).
    client
        The cluster's client: each window's read is counted on the dashboard's cache chart.
    """

    def __init__(self, threads: int, client: Any) -> None:
        self.threads = max(int(threads), 1)
        self._client = client
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, files: BucketFiles, window: list[tuple[int, int, tuple[int, ...]]],
               span: tuple[int, int], lanes: Lanes, encoding: Encoding) -> Future[WindowData]:
        """Start reading a window (:func:`~daskfeed.batches._read.read_buckets`'s arguments).

        Returns
        -------
        concurrent.futures.Future
            Of the window's arrays; ``cancel()`` drops it while it waits for a thread.
        """
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="daskfeed-window")
            return self._pool.submit(read_buckets, files, window, span, lanes, encoding,
                                     client=self._client)

    def close(self) -> None:
        """Stop the threads once the windows being read end (windows waiting are dropped)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def reads_here(client: Any, files: BucketFiles | None, choice: str) -> HereReads | None:
    """Threads reading windows in the trainer, where ``choice`` and the cluster allow; else None.

    They do with ``choice == "auto"``, a global order (``files``), every worker on this machine
    (:func:`workers_here`) and the bucket files on this process's disk (the workers' cache
    directory is this one's).
    """
    if choice != "auto" or files is None or client is None:
        return None
    workers = _workers(client)
    if not workers or not all(_this_machine(h) for h in workers.values()):
        return None
    if not all(os.path.isfile(g.bucket_path(0)) for g in files.parts_of()):
        return None
    return HereReads(len(workers), client)


def can_take_aside(client: Any, estimate: int) -> bool:
    """Whether a worker of ``client`` can take rows of ``estimate`` bytes for this trainer."""
    if client is None or not workers_here(client):
        return False
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {}).values()
    except Exception:  # (a scheduler that does not answer: taken here)
        return False
    limits = [int(w.get("memory_limit") or 0) for w in workers]
    return bool(limits) and all(limit == 0 or estimate * WORKER_SHARE <= limit for limit in limits)


def workers_here(client: Any) -> bool:
    """Whether every worker of ``client``'s cluster runs on this machine.

    Its address is a loopback one or one of this host's; False when there are none or the
    scheduler does not say.
    """
    hosts = set(_workers(client).values()) if client is not None else set()
    return bool(hosts) and all(_this_machine(h) for h in hosts)


def _workers(client: Any) -> dict[str, str]:
    """Each worker's host, by address ({} when the scheduler does not answer)."""
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except Exception:  # (a scheduler that does not answer: the workers read, as before)
        return {}
    return {a: str(w.get("host") or "") for a, w in workers.items()}


def _this_machine(host: str) -> bool:
    """Whether ``host`` (an address a worker gave) is this machine's."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        return host in ("localhost", socket.gethostname())
    return host in _own_addresses()


def _own_addresses() -> set[str]:
    import psutil

    with contextlib.suppress(Exception):
        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return set()
