"""A parse cache's layout: where each block is kept and the id that seeds its stored order.

Pure arithmetic on a few tuples (no Arrow, no file read): what :class:`~daskfeed.cache.BlockCache`
reads and writes with, and what a run's order record keeps to trace its batches later
(``daskfeed rows``, which loads neither pyarrow nor fsspec).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

import numpy as np


def default_root() -> str:
    """The cache root when none is given: ``$XDG_CACHE_HOME/daskfeed`` (``~/.cache/daskfeed``).

    Returns
    -------
    str
        As seen by the process asking (on a worker: the worker's home).
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "daskfeed")


@dataclass(frozen=True)
class CacheLayout:
    """Where one data set's parse cache keeps its blocks, and their ids (no file is read).

    ``root`` None: :func:`default_root` where the cache is used, i.e. on each worker (a remote
    worker's home, not the trainer's). Blocks are numbered as in ``Source.blocks``; they are kept
    in *entries*, directories of the root: one per :class:`~daskfeed.reading.Part` of the
    source, or several for a part that grew at its end (see ``docs/data-that-grows.md``):
    ``entries`` their keys, ``starts`` the first block of each, ``ids`` that block's id. Blocks
    are numbered within their entry, so a part whose files are unchanged is reused by the next
    data set that has it (the data grew). Without entries the root is one directory of blocks
    numbered as given.
    """

    root: str | None
    entries: tuple[str, ...] = ()
    starts: tuple[int, ...] = ()
    ids: tuple[int, ...] = ()  # the id of each entry's first block (see place)
    compression: str | None = None  # of the files this cache writes (None: memory-mapped reads)
    # the parts that grew at their end: (part number, the earlier part's key, files, blocks)
    grown: tuple[tuple[int, str, int, int], ...] = ()

    @property
    def path(self) -> str:
        """The cache root, as seen by the process asking (each part a directory in it)."""
        return default_root() if self.root is None else self.root

    def place(self, index: int) -> tuple[str, int, int]:
        """Where block ``index`` is kept: ``(directory, number in it, block id)``.

        The block id seeds its stored order (a seeded permutation of its rows: see
        ``docs/development.md``, "The cache's layout"): its part's anchor
        (:attr:`daskfeed.reading.Part.anchor`) and its number in the part, so the order is the
        same in every data set the part belongs to, and after files were appended to the part
        (see ``docs/data-that-grows.md``).

        Parameters
        ----------
        index
            The block's index in the source.

        Returns
        -------
        tuple
            The part's directory, the block's number in it and its id.
        """
        if not self.entries:
            return self.path, index, index
        p = bisect.bisect_right(self.starts, index) - 1
        local = index - self.starts[p]
        return os.path.join(self.path, self.entries[p]), local, self.ids[p] + local

    def block_id(self, index: int) -> int:
        """The id that seeds block ``index``'s stored order (see :meth:`place`)."""
        return self.place(index)[2]

    def block_ids(self, blocks: int) -> np.ndarray:
        """:meth:`block_id` of blocks ``0 .. blocks - 1`` at once, modulo 2**64 (``O(blocks)``).

        Returns
        -------
        numpy.ndarray
            uint64.
        """
        index = np.arange(int(blocks), dtype=np.int64)
        if not self.entries:
            return index.astype(np.uint64)
        starts = np.asarray(self.starts, dtype=np.int64)
        p = np.searchsorted(starts, index, side="right") - 1
        first = np.array([i % 2**64 for i in self.ids], dtype=np.uint64)
        with np.errstate(over="ignore"):
            return first[p] + (index - starts[p]).astype(np.uint64)
