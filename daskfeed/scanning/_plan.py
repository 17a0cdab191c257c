"""Scan plan: the stretches of the files grouped into scan tasks, and the keys of one scan's tasks.

A large part of the files is scanned in stretches of about :data:`TASK_BYTES`, decided by the part
alone (its statistics then merge the same way whenever it is scanned); stretches are grouped into
scan tasks of about a blocksize each, at least four per worker thread when there is enough
data (:func:`scan_tasks`). :class:`ScanKeys` gives one scan's tasks groups of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

from daskfeed.manifest import block_sizes
from daskfeed.reading import Part, Source

T = TypeVar("T")

TASK_BYTES = 32 << 20  # input bytes of a stretch of a large part (see part_tasks)


def scan_tasks(src: Source, stretches: list[tuple[int, list[int]]],
               nthreads: int) -> list[list[tuple[int, list[int]]]]:
    """The stretches, in order, grouped into scan tasks of about blocksize bytes each.

    At least four scan tasks per worker thread when there is enough data; thousands of small
    files cost a few tasks, not thousands. A stretch is never split.
    """
    sizes = block_sizes(src)
    total = sum(sizes[i] for _, blocks in stretches for i in blocks)
    target = max(1, min(src.options.blocksize, total // (4 * nthreads)))
    return _cut(stretches, lambda stretch: sum(sizes[i] for i in stretch[1]), target)


def part_tasks(part: Part, src: Source, wanted: set[int]) -> list[list[int]]:
    """The stretches of ``part``: its blocks in ``wanted``, in order, about TASK_BYTES each.

    Decided by the part alone (not by the cluster or the other parts), so a part's statistics
    are merged the same way whenever it is scanned.
    """
    sizes = block_sizes(src)
    target = max(1, min(src.options.blocksize, TASK_BYTES))
    return _cut([i for i in range(*part.blocks) if i in wanted], lambda i: sizes[i], target)


def _cut(items: list[T], size: Callable[[T], int], target: int) -> list[list[T]]:
    """``items`` in order, in runs closed as soon as their sizes reach ``target``."""
    runs: list[list[T]] = []
    current: list[T] = []
    acc = 0
    for item in items:
        current.append(item)
        acc += size(item)
        if acc >= target:
            runs.append(current)
            current, acc = [], 0
    if current:
        runs.append(current)
    return runs


class ScanKeys:
    """The keys of one scan's tasks: tuples, so that one scan's tasks are task groups of its own.

    The scheduler files a task into a span (the dashboard's ``daskfeed/scan train``) by its task
    group, and string keys ``daskfeed-scan-<i>-<token>`` or ``getitem-<uuid>`` all fall in the
    groups ``daskfeed-scan`` and ``getitem``: a scan submitted while another scan's tasks (or any
    ``getitem``) are still on the scheduler (the training scan's, released a moment ago, when the
    validation scan starts) joined that one's span. A tuple key's group is its first element,
    which carries a token of this scan: no other task shares it, nor a result left by a scan of
    the same files with other settings. The prefixes shown stay ``daskfeed-scan``,
    ``daskfeed-scan-record`` ...
    """

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex

    def scan(self, block: int) -> tuple[str, int]:
        """The scan task (or a DataFrame's facts task) starting at ``block``."""
        return (f"daskfeed-scan-{self.run}", block)

    def part(self, what: str, j: int) -> tuple[str, int]:
        """The ``what`` of the ``j``-th scan task or part (``"record"``; a DataFrame: ``"stats"``)."""
        return (f"daskfeed-scan-{what}-{self.run}", j)

    def merge(self, depth: int, i: int) -> tuple[str, int, int]:
        """A merge of statistics at ``depth`` of the tree (1: merging the tasks' own)."""
        return (f"daskfeed-scan-merge-{self.run}", depth, i)
