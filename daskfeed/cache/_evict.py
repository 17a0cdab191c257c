"""A size bound on the parse cache: least recently used parts go first, never one in use.

Each opening of a data set's cache (:func:`~daskfeed.cache._open.open_cache`, on every worker)
marks its parts used (the ``meta.json``'s mtime) and leased by the trainer that opened them: a
``lease-<host>-<pid>-<token>`` file in each part, renewed by the trainer every
:data:`RENEW_SECONDS` while it lives (:func:`~daskfeed.cache._blocks.start_heartbeat`) and given
back when the data are closed. A lease not renewed for :data:`LEASE_SECONDS` is a dead
trainer's, on any host (no process ids: a pid says nothing across hosts, containers or pid
reuse). With ``daskfeed.cache-max-size`` set, the entries under the root are then evicted,
least recently used first, until the root holds no more than the bound; a leased part is never
evicted, nor one of the data set being opened.

Opening, evicting and clearing hold the root's lock (:func:`root_lock`: ``flock`` on
``<root>/daskfeed-cache.lock``), so a lease is never taken between another process's check of
it and its removal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator

from daskfeed.cache._root import entry_meta
from daskfeed.core import CacheError

LEASE_SECONDS = 300  # a lease not renewed this long is a dead trainer's (any host)
RENEW_SECONDS = 60  # a live trainer renews its leases this often
LOCK = "daskfeed-cache.lock"  # the root's lock file (flock)
REMOVING = ".removing-"  # an entry being removed is renamed to ``<key>.removing-<tag>`` first
_PREFIX = "lease-"


def trainer_tag() -> str:
    """A new lease of this process: ``<host>-<pid>-<token>`` (the trainer opening a cache)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def lease_name(tag: str) -> str:
    """The file name of the lease ``tag`` in a part's directory."""
    return f"{_PREFIX}{tag}"


def lease(entry: str, tag: str, now: float) -> None:
    """Mark the part ``entry`` used now and leased by the trainer ``tag``."""
    with contextlib.suppress(OSError):
        os.utime(os.path.join(entry, "meta.json"), (now, now))
    path = os.path.join(entry, lease_name(tag))
    with contextlib.suppress(OSError):
        with open(path, "a", encoding="utf-8"):
            pass
        os.utime(path, (now, now))


def renew(entry: str, tag: str, now: float) -> None:
    """Renew the lease ``tag`` on ``entry`` (taken again if it was found stale and removed)."""
    if entry_meta(entry) is not None:  # (an entry evicted meanwhile is not made again here)
        lease(entry, tag, now)


def leased(entry: str, now: float) -> bool:
    """Whether a live trainer holds a lease on ``entry``: one renewed within ``LEASE_SECONDS``.

    Leases older than that are a dead trainer's, on any host: removed.
    """
    try:
        names = [n for n in os.listdir(entry) if n.startswith(_PREFIX)]
    except OSError:
        return False
    live = False
    for name in names:
        path = os.path.join(entry, name)
        try:
            if now - os.lstat(path).st_mtime < LEASE_SECONDS:
                live = True
            else:
                os.remove(path)
        except OSError:
            continue
    return live


@contextlib.contextmanager
def root_lock(base: str, timeout: float) -> Iterator[None]:
    """Hold the root's lock (exclusive ``flock`` on ``<base>/daskfeed-cache.lock``).

    Parameters
    ----------
    base
        The cache root (checked as ours before).
    timeout
        Seconds to wait for another process holding it.

    Raises
    ------
    CacheError
        Not had within ``timeout`` (another daskfeed process holds it: opening, evicting or
        clearing the cache, or hung there).
    """
    path = os.path.join(base, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CacheError(
                        f"Expected to lock the cache root {base} (to open, evict or clear "
                        f"entries) within {timeout:g} s. Received: another process holds "
                        f"{path}.\nHint: wait for the other daskfeed run's cache step to end, "
                        "or end a hung one; raise daskfeed.cache-lock-timeout to wait longer."
                    ) from None
                time.sleep(0.05)  # (polling a lock another process holds: no event to wait on)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _size(path: str) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(d, name))
    return total


def evict(base: str, ours: set[str], max_bytes: int,
          remove: Callable[[str], bool]) -> tuple[int, int, int]:
    """Remove entries under ``base``, least recently used first, until it holds ``max_bytes``.

    Parameters
    ----------
    base
        The cache root.
    ours
        The entries (names) of the data set being opened: kept.
    max_bytes
        The bound.
    remove
        Removes one entry (renamed away first); False when another process did first.

    Returns
    -------
    tuple of int
        Entries evicted, their bytes, and the bytes left under the root.
    """
    now = time.time()
    entries = []
    for name in os.listdir(base):
        path = os.path.join(base, name)
        meta = os.path.join(path, "meta.json")
        if entry_meta(path) is None:
            continue  # not an entry daskfeed made (one being removed is renamed: not counted)
        with contextlib.suppress(OSError):
            entries.append((os.stat(meta).st_mtime, name, path, _size(path)))
    total = sum(e[3] for e in entries)
    evicted = freed = 0
    for _, name, path, size in sorted(entries):
        if total <= max_bytes:
            break
        if name in ours or leased(path, now):
            continue
        total -= size
        if remove(path):  # (False: another worker sharing the root removed it first)
            freed += size
            evicted += 1
    return evicted, freed, total
