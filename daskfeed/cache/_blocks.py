"""Cache: every block parsed once, kept as Arrow IPC files on the workers' disk.

The scan parses each CSV block once and, while it is in memory, writes it here; every epoch
after that reads Arrow instead of CSV. A block
that is missing (the manifest came from an earlier run, a worker on another machine, a damaged
or deleted cache file) is parsed again and written then.

Layout: one directory, an *entry*, per *part* of the source's files
(:mod:`daskfeed.reading._parts`), ``<root>/<part key>/``, shared by every data set that has the
part (a part that grew at its end: the earlier part's entries and one for its new files,
:mod:`daskfeed.cache._lineage`); blocks are numbered within their entry.
``g<first>-<tag>-<n>.arrow`` holds the blocks of one scan task (thousands of small files make a
few Arrow files, not thousands), each block a range of its rows; the task's
``g<first>-<tag>.json`` marker, written last (:mod:`daskfeed.cache._writer`), says where each
block is, so a reader never sees half a task's blocks. The part key covers its files' paths,
sizes, mtimes (and ETags) and the read options: changed data or options make another part. An
entry made for other contents of the same files, an entry of another cache format and the
temporary files of writers killed mid-write are removed when the cache is opened
(:mod:`daskfeed.cache._open`, on the workers). Directories are created with mode 0700.

Each block's rows are kept in their file's order: :func:`block_tables` reads them so,
:meth:`BlockCache.stored_view` in their *stored order*, a seeded random order applied as they are
read (:mod:`daskfeed.cache._scatter`; the buckets of the global order are dealt from it).

What is stored is what the feed needs, not the CSV's exact text: whole numbers exactly (int32
when they fit, else int64), decimals as parsed (float64), string columns dictionary-encoded,
timestamps as they are.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from daskfeed.cache import _evict
from daskfeed.cache._arrow import (
    Files,
    Readers,
    forget_block,
    forget_entry,
    marker_index,
    one_table,
    read_rows,
    whole_file,
)
from daskfeed.cache._evict import lease_name, renew
from daskfeed.cache._layout import CacheLayout, default_root
from daskfeed.cache._scatter import scatter_order
from daskfeed.cache._writer import PartWriters, compact
from daskfeed.reading import Block, ReadOptions, iter_tables

if TYPE_CHECKING:
    from distributed import Client


@dataclass(frozen=True)
class BlockCache(CacheLayout):
    """One data set's parse cache (picklable: it travels to the workers with each task).

    Its fields and block numbering are its :class:`~daskfeed.cache.CacheLayout`'s; this
    class reads, writes and leases the blocks kept there.
    """

    lease: str = ""  # the lease its opening took on its entries (:mod:`daskfeed.cache._evict`)

    def lookup(self, index: int) -> list[tuple[str, int, int, int]] | None:
        """Where block ``index`` is: ``[(Arrow file path, first row, rows, rows per batch), ...]``.

        Parameters
        ----------
        index
            The block's index in the source.

        Returns
        -------
        list or None
            The block's rows (row ranges of files, by full path); None when it is not
            (completely) cached.
        """
        directory, local, _ = self.place(index)
        found = marker_index(directory, refresh=False).get(local)
        if found is None:
            found = marker_index(directory, refresh=True).get(local)
        if found is None:
            return None
        return [(os.path.join(directory, name), first, count, per) for name, first, count, per in found]

    def has(self, index: int) -> bool:
        """Whether block ``index`` is complete in the cache.

        Parameters
        ----------
        index
            The block's index in the source.

        Returns
        -------
        bool
            True when the block is complete in the cache.
        """
        return self.lookup(index) is not None

    def stored_view(self, index: int, columns: list[str] | None, files: Files) -> pa.Table | None:
        """Block ``index``'s rows in their stored order (see :meth:`file_view`).

        Returns
        -------
        pyarrow.Table or None
            None when the block is not cached, or unreadable (with a warning).
        """
        found = self.file_view(index, columns, files)
        return None if found is None else found[0].take(found[1])

    def file_view(self, index: int, columns: list[str] | None,
                  files: Files) -> tuple[pa.Table, np.ndarray] | None:
        """Block ``index``'s rows as kept (its file's order) and their stored order.

        Sliced from whole files read once: for a reader of many blocks, each Arrow file is read
        once into ``files`` (views of the memory map when uncompressed), and a block is a slice
        of it, not a read of its own.

        Parameters
        ----------
        index, columns
            As :meth:`tables` takes them.
        files
            Whole files read so far, by path (filled here).

        Returns
        -------
        tuple or None
            ``(table, order)``: ``table.take(order)`` is the block in its stored order (each
            piece permuted on its own by :func:`~daskfeed.cache.block_order`). None when the
            block is not cached, or unreadable (with a warning).
        """
        ranges = self.lookup(index)
        if ranges is None:
            return None
        if not ranges:  # cached with no rows (a file with a header alone)
            return pa.table({}), np.zeros(0, dtype=np.int64)
        try:
            parts = [whole_file(path, columns, files).slice(first, count)
                     for path, first, count, _ in ranges]
            table = one_table(parts)
        except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:
            self._unreadable(index, err)
            return None
        block_id = self.block_id(index)
        return table, scatter_order([(block_id, count, piece)
                                     for piece, (_, _, count, _) in enumerate(ranges)])

    def locate(self, index: int, columns: list[str] | None,
               files: Files) -> tuple[object, pa.Table, int, np.ndarray] | None:
        """Where block ``index``'s rows are kept, and their stored order.

        For a reader of many consecutive blocks (the buckets' deal), which then takes from a
        few whole files once instead of from each block.

        Parameters
        ----------
        index, columns, files
            As :meth:`file_view` takes them.

        Returns
        -------
        tuple or None
            ``(key, table, first, order)``: rows ``first + order`` of ``table`` are the block
            in its stored order. ``table`` is a whole file read once into ``files`` (key: its
            path) when the block is one range of it, else the block's rows alone (key:
            ``("block", index)``). None when the block is not cached, or unreadable (with a
            warning).
        """
        ranges = self.lookup(index)
        if ranges is None:
            return None
        if len(ranges) == 1:
            path, first, count, _ = ranges[0]
            try:
                table = whole_file(path, columns, files)
            except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:
                self._unreadable(index, err)
                return None
            return path, table, first, scatter_order([(self.block_id(index), count, 0)])
        found = self.file_view(index, columns, files)
        return None if found is None else (("block", index), found[0], 0, found[1])

    def _unreadable(self, index: int, err: BaseException) -> None:
        """Warn that block ``index`` is damaged in the cache, and forget it (it is parsed again)."""
        directory, local, _ = self.place(index)
        warnings.warn(f"daskfeed: cached block {index} in {directory} is unreadable "
                      f"({type(err).__name__}: {err}); parsing it from the CSV again.", stacklevel=3)
        forget_block(directory, local)

    def tables(self, index: int, columns: list[str] | None = None,
               readers: Readers | None = None) -> list[pa.Table] | None:
        """The cached tables of block ``index``, in file order (None: not cached, or unreadable).

        Parameters
        ----------
        index
            The block.
        columns
            Only these (the others are not even decompressed); None: all.
        readers
            Open Arrow files to reuse across calls (a window reads many blocks of one file).

        Returns
        -------
        list of pyarrow.Table or None
            None also when a file is damaged (with a warning; the block is parsed again).
        """
        ranges = self.lookup(index)
        if ranges is None:
            return None
        readers = {} if readers is None else readers
        try:
            return [read_rows(path, first, count, per, columns, readers)
                    for path, first, count, per in ranges]
        except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:  # damaged: reparse
            self._unreadable(index, err)
            return None

    def writer(self, first: int) -> PartWriters:
        """A writer for the blocks of a scan task starting at ``first``: ``add``, then ``commit``.

        Parameters
        ----------
        first
            The scan task's first block.

        Returns
        -------
        PartWriters
            A writer into this cache (one file set and marker per part it writes to).
        """
        return PartWriters(self)

    def directories(self) -> list[str]:
        """The directories the blocks are kept in (its entries; the root without entries)."""
        return [os.path.join(self.path, key) for key in self.entries] if self.entries else [self.path]

    def release(self, client: Client | None = None) -> None:
        """Give back the lease its opening took on its entries (on every worker; None: here).

        Parameters
        ----------
        client
            The ``distributed.Client`` whose workers hold the cache.
        """
        if not self.lease:
            return
        beating = _HEARTBEATS.pop(self.lease, None)
        if beating is not None:
            beating[0].set()  # the heartbeat stops before the leases go
        args = (self.root, self.entries, self.lease)
        if client is None:
            _release(*args)
        else:
            client.run(_release, *args, on_error="ignore")

    def forget_part(self, index: int, client: Client | None = None) -> None:
        """Remove what is kept of the part of block ``index`` (on every worker; None: here).

        For a part whose blocks were read at record starts found wrong (see
        :meth:`daskfeed.Source.split_exactly`): what was written of it is removed
        and forgotten by every process, so it is parsed and written again.

        Parameters
        ----------
        index
            A block of the part.
        client
            The ``distributed.Client`` whose workers hold the cache.
        """
        if client is None:
            _forget_part(self, index)
        else:
            client.run(_forget_part, self, index, on_error="ignore")
            _forget_part(self, index)

    def cached_blocks(self) -> int:
        """Number of complete blocks in the cache.

        Returns
        -------
        int
            The blocks complete in the cache.
        """
        return sum(len(marker_index(d, refresh=True)) for d in self.directories())


def _forget_part(cache: BlockCache, index: int) -> None:
    """Remove the markers, then the files, that the writers left in block ``index``'s part."""
    directory = cache.place(index)[0]
    with contextlib.suppress(OSError):
        names = sorted(os.listdir(directory), key=lambda n: not n.endswith(".json"))
        for name in names:  # markers first: a block is then no longer found while files go
            if name.startswith("g"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, name))
    forget_entry(directory)


_HEARTBEATS: dict[str, tuple[threading.Event, threading.Event]] = {}  # lease -> (stop, beat)


def start_heartbeat(cache: BlockCache, client: Client | None = None) -> None:
    """Renew ``cache``'s leases every ``RENEW_SECONDS`` until it is released (a daemon thread).

    On every worker (None: here). It ends with :meth:`BlockCache.release`, with the process
    (its leases then expire ``LEASE_SECONDS`` later, on any host) or with the client.
    """
    if not cache.lease or cache.lease in _HEARTBEATS:
        return
    stop, beat = threading.Event(), threading.Event()
    _HEARTBEATS[cache.lease] = (stop, beat)
    args = (cache.root, cache.entries, cache.lease)

    def run() -> None:
        while not stop.wait(_evict.RENEW_SECONDS):
            try:
                if client is None:
                    _renew(*args)
                else:
                    client.run(_renew, *args, on_error="ignore")
            except Exception:  # the client closed: its trainer is ending
                _HEARTBEATS.pop(cache.lease, None)
                return
            beat.set()

    threading.Thread(target=run, name=f"daskfeed-lease-{cache.lease}", daemon=True).start()


def heartbeat(cache: BlockCache) -> threading.Event | None:
    """Set after each renewal of ``cache``'s leases (None: no heartbeat running)."""
    beating = _HEARTBEATS.get(cache.lease)
    return None if beating is None else beating[1]


def _renew(root: str | None, entries: tuple[str, ...], tag: str) -> None:
    """Renew the lease ``tag`` on ``entries`` under ``root`` (None: this process's default)."""
    base = default_root() if root is None else root
    now = time.time()
    for key in entries:
        renew(os.path.join(base, key), tag, now)


def _release(root: str | None, entries: tuple[str, ...], tag: str) -> None:
    """Remove the lease ``tag`` from ``entries`` under ``root`` (None: this process's default)."""
    base = default_root() if root is None else root
    for key in entries:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(base, key, lease_name(tag)))


def part_salt(key: str) -> int:
    """A part's share of its blocks' ids: its anchor's first 48 bits, above the block numbers."""
    return int(key[:12], 16) << 32


def block_tables(index: int, block: Block, options: ReadOptions, cache: BlockCache | None,
                 rejects: list[str] | None = None, *, use_cache: bool = True,
                 columns: list[str] | None = None, readers: Readers | None = None) -> Iterator[pa.Table]:
    """Arrow tables of block ``index`` in file order: from the cache, else parsed (and then cached).

    Parameters
    ----------
    index, block, options
        The block, its number and how to parse it.
    cache
        Where blocks are cached (None: parse, cache nothing).
    rejects
        See :func:`daskfeed.reading.iter_tables`.
    use_cache
        False: parse even when the block is cached.
    columns, readers
        See :meth:`BlockCache.tables` (tables parsed from CSV have every column).

    Yields
    ------
    pyarrow.Table
        The block's rows in file order.
    """
    if cache is not None and use_cache:
        cached = cache.tables(index, columns, readers)
        if cached is not None:  # one table per piece (a block's ranges are its pieces)
            yield from cached
            return
    if cache is None:
        yield from iter_tables(block, options, rejects)
        return
    writer = cache.writer(index)  # a block parsed here is cached on its own
    try:
        writer.begin(index)
        for table in iter_tables(block, options, rejects):
            writer.add(index, table)
            yield table
    except BaseException:
        writer.abort()
        raise
    writer.commit()


def stored_rows(index: int, block: Block, options: ReadOptions, cache: BlockCache | None,
                columns: list[str] | None = None,
                files: Files | None = None) -> tuple[pa.Table, np.ndarray]:
    """Block ``index``'s rows in file order and their stored order: from the cache, else parsed.

    A block parsed here is cached on the way.

    Parameters
    ----------
    index, block, options, cache, columns
        As :func:`block_tables` takes them.
    files
        Whole cache files read so far (see :meth:`BlockCache.file_view`).

    Returns
    -------
    tuple
        ``(table, order)``: every row of the block, with the types the cache keeps, and the
        positions that put them in their stored order (``table.take(order)``; a reader that
        takes some of them anyway takes once).
    """
    if cache is not None:
        found = cache.file_view(index, columns, {} if files is None else files)
        if found is not None:
            return found
    block_id = index if cache is None else cache.block_id(index)
    # as the cache keeps them (text dictionary-encoded, whole numbers int32 where they fit): a
    # reader of cached and parsed blocks together sees one set of types
    pieces = [compact(t) for t in block_tables(index, block, options, cache, use_cache=False)]
    table = one_table(pieces) if pieces else pa.table({})
    if columns is not None and table.num_columns:
        table = table.select([c for c in columns if c in table.column_names])
    return table, scatter_order([(block_id, t.num_rows, k) for k, t in enumerate(pieces)])
