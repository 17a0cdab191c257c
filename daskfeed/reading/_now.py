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
SHOWN = 5  # reads a timeout's message names at most
_NOW: dict[int, tuple[Callable[[], str], float]] = {}  # thread -> (what it reads, since when)
_END: Any = object()  # (no more items)


@contextlib.contextmanager
def reading(what: Callable[[], str]) -> Iterator[None]:
    """Record that this thread reads ``what()`` until the block ends.

    Parameters
    ----------
    what
        Says what is read (a block's ``describe``); called only when someone asks.
    """
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

    Parameters
    ----------
    older_than
        Seconds.

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

    The caller's work on an item, between reads, is not. ``items`` is closed when this is
    (a reader's file with it), also when the caller stops on an error.

    Parameters
    ----------
    items
        The reader's tables.
    what
        As for :func:`reading`.

    Yields
    ------
    object
        Each item of ``items``.
    """
    try:
        while True:
            with reading(what):
                item = next(items, _END)
            if item is _END:
                return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def long_reads(client: Client | None, older_than: float, here: bool = False) -> str:
    """The reads running for ``older_than`` seconds or more, as a timeout's message says them.

    E.g. ``"reads running for 60s or more: a.csv (whole file), for 125s (worker
    tcp://10.0.0.5:40331); b.csv bytes 0-99, for 70s (worker ...)"``, the longest first,
    ``SHOWN`` at most (``"; and N more"``); "" when there are none.

    Parameters
    ----------
    client
        Its workers are asked (:func:`reads_now` run there). They answer together: if they have
        not all answered within ``ASK_SECONDS`` (a worker that does not answer), or the ask
        failed, none is named; this serves an error's message, never makes a second error.
        None: none asked.
    older_than
        Seconds.
    here
        Ask this process's threads too (the trainer's own reading threads).

    Returns
    -------
    str
        The text (a read seen twice, by a worker in this process, named once).
    """
    asked = {"this process": reads_now(older_than)} if here else {}
    if client is not None:
        asked.update({f"worker {w}": r for w, r in _ask_workers(client, older_than).items()})
    found: dict[str, tuple[float, str]] = {}  # what -> (seconds, where)
    for where, reads in asked.items():
        for what, seconds in reads:
            if seconds > found.get(what, (-1.0, ""))[0]:
                found[what] = (seconds, where)
    said = [f"{what}, for {seconds:.0f}s ({where})"
            for what, (seconds, where) in sorted(found.items(), key=lambda f: -f[1][0])]
    if not said:
        return ""
    more = f"; and {len(said) - SHOWN} more" if len(said) > SHOWN else ""
    return f"reads running for {older_than:g}s or more: {'; '.join(said[:SHOWN])}{more}"


def _ask_workers(client: Client, older_than: float) -> dict[str, list[tuple[str, float]]]:
    """Each worker's reads of ``older_than`` seconds or more, by worker address."""
    answers: list[dict[str, Any]] = []

    def ask() -> None:
        try:
            answers.append(client.run(reads_now, older_than, on_error="return"))
        except BaseException:  # (a closing client's cancelled call too) a message's extra
            pass

    asking = threading.Thread(target=ask, daemon=True, name="daskfeed-ask-reads")
    asking.start()
    asking.join(ASK_SECONDS)
    if asking.is_alive() or not answers:
        return {}
    return {w: r for w, r in answers[0].items() if isinstance(r, list)}
