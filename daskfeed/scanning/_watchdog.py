"""Scan watchdog: the trainer waits for the scan tasks, judging progress, not completion.

Scan tasks report each table they parse and each cache file they write on a topic; a scan is
stuck only when no task reported or finished for ``timeout`` seconds, and a task that failed
for good ends the scan with the files named (:func:`await_scan`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from distributed import Client, Future, as_completed

from daskfeed.cluster import explain
from daskfeed.core import FeedTimeoutError
from daskfeed.manifest import block_sizes
from daskfeed.reading import Source

LOOK = 1.0  # seconds between looks at the scan (its progress callback, the stuck check)

# (rows, bytes done, bytes in all, seconds, finished)
ProgressCallback = Callable[[int, int, int, float, bool], None]


class ScanProgress:
    """What the scan tasks report while they run (events on a topic, :func:`daskfeed.scanning._task.report`).

    Each event says a scan task parsed a table of block ``block`` (rows and bytes so far) or
    wrote a cache file: progress, whether or not a task has finished yet.
    """

    def __init__(self, tasks: list[list[int]]) -> None:
        self.last = time.monotonic()
        self.t0 = self.last
        self.rows = 0
        self.nbytes = 0
        self.total = 0  # bytes the tasks read in all
        self.at: dict[int, int] = {}  # scan task (its first block) -> block being read
        self.results: dict[Any, Any] = {}  # each finished task's result, by its future's key
        self._first = {t[0] for t in tasks}

    def __call__(self, event: tuple[float, dict[str, int]]) -> None:
        """Take one event of a scan task (distributed's topic handler)."""
        msg: dict[str, int] = event[1]
        if not isinstance(msg, dict) or msg.get("task") not in self._first:
            return
        self.last = time.monotonic()
        self.rows += int(msg.get("rows", 0))
        self.nbytes += int(msg.get("bytes", 0))
        self.at[int(msg["task"])] = int(msg.get("block", msg["task"]))

    def finished(self, rows: int, on_progress: ProgressCallback | None) -> None:
        """The last progress call: every task finished, ``rows`` (their results') read in all."""
        if on_progress is not None:
            on_progress(int(rows), self.total, self.total, time.monotonic() - self.t0, True)


def _describe(src: Source, blocks: list[int], at: int | None = None) -> str:
    """What a scan task reads (``at``: the block it is reading now), for messages."""
    if at is not None and at != blocks[0]:
        return f"the scan of {src.blocks[at].describe()} (block {at})"
    first, last = src.blocks[blocks[0]], src.blocks[blocks[-1]]
    more = f" … {last.describe()} ({len(blocks)} blocks)" if len(blocks) > 1 else ""
    return f"the scan of {first.describe()}{more}"


class _Finishing:
    """The scan's futures as they finish, with their results: one waiter per future for the scan.

    Each result is fetched from its worker as its task finishes, while the others run (a
    gather of them all at the end took 0.5–0.7 s of 20,000 small files' facts after the last).

    ``distributed.wait(pending, timeout, return_when="FIRST_COMPLETED")`` in a loop starts a
    waiter on *every* pending future at each call and leaves them behind when it returns: a
    scan of N tasks looked at every second for S seconds piled up about N·S/2 of them in the
    trainer until their futures finished (0.5 GB of its memory at 13 GB of CSV, growing with the
    square of the data). ``as_completed`` starts one per future, once.
    """

    def __init__(self, client: Client, futures: list[Future]) -> None:
        self._done = as_completed(futures, loop=client.loop, with_results=True, raise_errors=False)

    def some(self, timeout: float) -> list[tuple[Future, Any]]:
        """The futures finished since the last call and their results, waiting up to ``timeout`` s for one.

        A failed future's result is not used (its status says it failed).
        """
        ready = self._done.thread_condition  # notified (under it) as each future finishes
        with ready:
            if not self._done.has_ready():
                ready.wait(timeout)
        return list(self._done.next_batch(block=False))


def await_scan(client: Client, futures: list[Future], tasks: list[list[int]], src: Source,
                timeout: float, topic: str, on_progress: ProgressCallback | None = None) -> ScanProgress:
    """Wait for the scan tasks, judging progress, not completion; fail fast with the files named.

    A scan task reports each table it parses and each cache file it writes
    (:func:`daskfeed.scanning._task.report`);
    the scan is stuck only when no task reported progress or finished for ``timeout`` seconds
    (a read that blocks: hung storage, a FIFO), however slow the disk. A task that fails for
    good (after its retry) ends the scan with a clear error. ``on_progress`` is called once as
    the tasks are submitted (nothing done yet), then about every second while they run; the
    caller makes the last call once it has the tasks' results (:meth:`ScanProgress.finished`:
    their events may reach this process after the tasks are seen finished). The results are
    the returned progress's ``results``, by future key, each fetched as its task finished.
    """
    progress = ScanProgress(tasks)
    sizes = block_sizes(src)
    total = progress.total = sum(sizes[i] for t in tasks for i in t)
    t0 = progress.t0 = time.monotonic()
    blocks_of = {f.key: t for f, t in zip(futures, tasks, strict=True)}
    client.subscribe_topic(topic, progress)
    if on_progress is not None:  # the tasks run: nothing done yet
        on_progress(0, 0, total, 0.0, False)
    try:
        finishing, pending = _Finishing(client, futures), set(futures)
        while pending:
            done = finishing.some(min(LOOK, timeout))
            pending.difference_update(f for f, _ in done)
            if on_progress is not None and pending:
                on_progress(progress.rows, progress.nbytes, total, time.monotonic() - t0, False)
            for f, result in done:
                progress.last = time.monotonic()
                if f.status != "finished":
                    _raise_failed(f, _describe(src, blocks_of[f.key]))
                progress.results[f.key] = result
            for f in [f for f in pending if f.status in ("error", "cancelled")]:
                _raise_failed(f, _describe(src, blocks_of[f.key]))  # (its result never came)
            if pending and time.monotonic() - progress.last > timeout:
                raise _stuck(src, [blocks_of[f.key] for f in pending], progress, timeout)
    finally:
        client.unsubscribe_topic(topic)
    return progress


def _stuck(src: Source, pending: list[list[int]], progress: ScanProgress,
           timeout: float) -> FeedTimeoutError:
    """The error for scan tasks ``pending`` that made no progress for ``timeout`` seconds."""
    stuck = sorted(pending)[:3]
    return FeedTimeoutError(
        f"No scan task made progress within {timeout:.0f}s; still reading "
        f"{'; '.join(_describe(src, t, progress.at.get(t[0])) for t in stuck)}"
        f"{f' and {len(pending) - 3} more' if len(pending) > 3 else ''}.\n"
        "Hint: a read that blocks (hung storage, a FIFO) never finishes: check the "
        "workers on the dashboard; for storage that stalls longer between reads raise "
        "--timeout (daskfeed.timeout)."
    )


def _raise_failed(future: Future, what: str) -> None:
    """Raise the error of a scan task that failed for good, as a daskfeed error naming ``what``."""
    try:
        future.result()
    except Exception as err:
        new = explain(err, what)
        if new is err:
            raise
        raise new from err
