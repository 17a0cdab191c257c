"""What this process's threads are reading now, and since when.

A window's task reads its blocks one after another; one that never returns (hung storage, a
FIFO) holds its thread, and every window queued behind it on that worker waits too. The window
the trainer times out on is then often not the one whose read hangs. Window reads say here what
they read (:func:`reading`); a timeout's message asks every process holding reads
(:func:`reads_now`, run on the workers) which have lasted long, and names them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

_NOW: dict[int, tuple[Callable[[], str], float]] = {}  # thread -> (what it reads, since when)


@contextlib.contextmanager
def reading(what: Callable[[], str]) -> Iterator[None]:
    """Record that this thread reads ``what()`` (called only when asked) until the block ends."""
    key = threading.get_ident()
    before = _NOW.get(key)
    _NOW[key] = (what, time.monotonic())
    try:
        yield
    finally:
        if before is None:
            _NOW.pop(key, None)
        else:
            _NOW[key] = before


def reads_now(older_than: float = 0.0) -> list[tuple[str, float]]:
    """The reads of this process's threads that began at least ``older_than`` seconds ago.

    Returns
    -------
    list of (str, float)
        What each reads and for how many seconds, the longest first.
    """
    now = time.monotonic()
    found = [(what(), now - since) for what, since in list(_NOW.values())
             if now - since >= older_than]
    return sorted(found, key=lambda item: -item[1])
