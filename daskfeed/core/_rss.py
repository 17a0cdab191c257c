"""Memory of the process tree: the RSS of this process and all its children (the workers)."""

from __future__ import annotations

import threading
from types import TracebackType

import psutil

__all__ = ["RSSSampler", "tree_rss"]


def tree_rss(process: psutil.Process | None = None) -> int:
    """RSS of ``process`` (default: this one) and all its children now, in bytes."""
    root = process or psutil.Process()
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # the root has exited
        return 0
    total = 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


class RSSSampler:
    """Samples the RSS of the process tree in a thread: the peak since the start or the last reset.

    Parameters
    ----------
    interval
        Seconds between samples.
    process
        The root of the tree (default: this process), e.g. a ``daskfeed`` command a test started.

    Attributes
    ----------
    start
        RSS when sampling started.
    peak
        Peak since :meth:`reset_peak` (or the start).
    overall_peak
        Peak since the start.

    Examples
    --------
    >>> with RSSSampler() as rss:  # doctest: +SKIP
    ...     work()
    >>> rss.overall_peak  # doctest: +SKIP
    """

    def __init__(self, interval: float = 0.2, process: psutil.Process | None = None) -> None:
        self.interval = interval
        self.process = process
        self.start = self.peak = self.overall_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="daskfeed-rss", daemon=True)

    def sample(self) -> int:
        """Current RSS of the process tree in bytes (also counted in the peaks)."""
        rss = tree_rss(self.process)
        self.peak = max(self.peak, rss)
        self.overall_peak = max(self.overall_peak, rss)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def reset_peak(self) -> None:
        """Start a new peak (e.g. at each epoch)."""
        self.peak = 0
        self.sample()

    def __enter__(self) -> RSSSampler:
        self.start = self.sample()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sample()
