"""A size bound on the parse cache: least recently used parts go first, never one in use.

Each opening of a data set's cache (:func:`~daskfeed.cache._open.open_cache`, on every worker)
marks its parts used (the ``meta.json``'s mtime) and leased by the trainer that opened them: a
``lease-<host>-<pid>-<token>`` file in each part, given back when the data are closed. With
``daskfeed.cache-max-size`` set, the entries under the root are then evicted, least recently
used first, until the root holds no more than the bound; a part leased by a live trainer is
never evicted (on the same host: while its process lives; a lease from another host: for
:data:`LEASE_SECONDS` after it was last taken), nor one of the data set being opened.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable

from daskfeed.cache._root import entry_meta

__all__ = ["LEASE_SECONDS", "REMOVING", "evict", "lease", "lease_name", "leased", "trainer_tag"]

LEASE_SECONDS = 24 * 3600  # a lease taken on another host is kept this long
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


def leased(entry: str, now: float) -> bool:
    """Whether a live trainer holds a lease on ``entry`` (stale leases of this host are removed)."""
    host = socket.gethostname()
    try:
        names = [n for n in os.listdir(entry) if n.startswith(_PREFIX)]
    except OSError:
        return False
    live = False
    for name in names:
        who, pid = [*name[len(_PREFIX):].rsplit("-", 2), "", ""][:2]
        path = os.path.join(entry, name)
        if who == host and pid.isdigit():
            try:
                os.kill(int(pid), 0)
                live = True
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.remove(path)
            except PermissionError:  # another user's live process
                live = True
            continue
        with contextlib.suppress(OSError):
            live = live or now - os.stat(path).st_mtime < LEASE_SECONDS
    return live


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
