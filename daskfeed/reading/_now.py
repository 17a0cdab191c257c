"""What this process's threads are reading now, and since when.

A task reads its blocks one after another; one that never returns (hung storage, a FIFO)
holds its thread, and every task queued behind it on that worker waits too. The window (or the
block to score) a timeout is about is then often not the one whose read hangs. Reads say here
what they read (:func:`reading`, :func:`named`); a timeout's message asks every worker
(:func:`long_reads`) which reads have lasted long, and names them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from distributed import Client

T = TypeVar("T")
ASK_SECONDS = 5.0  # how long a timeout's message waits for the workers to say what they read
_NOW: dict[int, tuple[Callable[[], str], float]] = {}  # thread -> (what it reads, since when)
_END: Any = object()  # (no more items)


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


def named(items: Iterator[T], what: Callable[[], str]) -> Iterator[T]:
    """``items`` (tables a reader yields), each one's read recorded as reading ``what()``.

    The caller's work on an item, between reads, is not.
    """
    while True:
        with reading(what):
            item = next(items, _END)
        if item is _END:
            return
        yield item


def long_reads(client: Client | None, older_than: float, here: bool = False) -> list[str]:
    """The reads running for ``older_than`` seconds or more, for a timeout's message.

    Parameters
    ----------
    client
        Its workers are asked (:func:`reads_now` run there; those that do not answer within
        ``ASK_SECONDS``, or fail to, are left out: this serves an error's message, never makes
        a second error). None: none asked.
    older_than
        Seconds.
    here
        Ask this process's threads too (the trainer's own reading threads).

    Returns
    -------
    list of str
        E.g. ``"a.csv (whole file), for 125s (worker tcp://10.0.0.5:40331)"``, the longest
        first; a read seen twice (a worker in this process) once.
    """
    asked = {"this process": reads_now(older_than)} if here else {}
    if client is not None:
        asked.update({f"worker {w}": r for w, r in _ask_workers(client, older_than).items()})
    found: dict[str, tuple[float, str]] = {}  # what -> (seconds, where)
    for where, reads in asked.items():
        for what, seconds in reads:
            if seconds > found.get(what, (-1.0, ""))[0]:
                found[what] = (seconds, where)
    return [f"{what}, for {seconds:.0f}s ({where})"
            for what, (seconds, where) in sorted(found.items(), key=lambda f: -f[1][0])]


def _ask_workers(client: Client, older_than: float) -> dict[str, list[tuple[str, float]]]:
    """Each worker's reads of ``older_than`` seconds or more, by worker address."""
    answers: dict[str, Any] = {}

    def ask() -> None:
        try:
            answers.update(client.run(reads_now, older_than, on_error="return"))
        except Exception:  # a message's extra: nothing to say about it
            pass

    asking = threading.Thread(target=ask, daemon=True, name="daskfeed-ask-reads")
    asking.start()
    asking.join(ASK_SECONDS)
    return {w: r for w, r in dict(answers).items() if isinstance(r, list)}
