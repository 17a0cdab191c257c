"""Memory of the process tree: the RSS of this process and all its children (the workers)."""

from __future__ import annotations

import os
import threading
from types import TracebackType

import psutil


def tree_rss(process: psutil.Process | None = None) -> int:
    """RSS of ``process`` (default: this one) and all its children now, in bytes."""
    return sum(_tree_parts(process).values())


def _tree_parts(process: psutil.Process | None = None) -> dict[int, int]:
    """RSS of each process of the tree of ``process`` now: ``{pid: bytes}``."""
    root = process or psutil.Process()
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # the root has exited
        return {}
    parts = {}
    for p in tree:
        try:
            parts[p.pid] = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return parts


def _label(process: psutil.Process, root: int) -> str:
    """What a process of the tree is, for a breakdown: the root, a worker, a helper."""
    if process.pid == root:
        return "root"
    try:
        words = process.cmdline()
    except psutil.Error:
        return "gone"
    text = " ".join(words)
    if "resource_tracker" in text:
        return "resource tracker"
    if "spawn_main" in text or "forkserver" in text:
        return "worker"  # (a LocalCluster's workers: multiprocessing's spawned processes)
    return os.path.basename(words[0]) if words else "?"


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
    overall_parts
        At the overall peak: each process's RSS by what it is (``root``, ``worker``, ...;
        :meth:`breakdown`).

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
        self._peak_parts: dict[int, int] = {}
        self._labels: dict[int, str] = {}  # each pid's label, found once, while it lives
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="daskfeed-rss", daemon=True)

    def sample(self) -> int:
        """Current RSS of the process tree in bytes (also counted in the peaks)."""
        parts = _tree_parts(self.process)
        rss = sum(parts.values())
        self.peak = max(self.peak, rss)
        if rss > self.overall_peak:
            self.overall_peak, self._peak_parts = rss, parts
            root = (self.process or psutil.Process()).pid
            for pid in parts.keys() - self._labels.keys():
                try:
                    self._labels[pid] = _label(psutil.Process(pid), root)
                except psutil.Error:
                    self._labels[pid] = "gone"
        return rss

    @property
    def overall_parts(self) -> dict[str, int]:
        """The overall peak by kind of process: ``{"root": bytes, "worker": bytes, ...}``.

        Several workers are summed; :meth:`breakdown` lists each.
        """
        out: dict[str, int] = {}
        for label, rss in self.breakdown():
            out[label] = out.get(label, 0) + rss
        return out

    def breakdown(self) -> list[tuple[str, int]]:
        """Each process's RSS at the overall peak, largest first: ``[(label, bytes), ...]``."""
        rows = [(self._labels.get(pid, "?"), rss) for pid, rss in self._peak_parts.items()]
        return sorted(rows, key=lambda row: -row[1])

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
