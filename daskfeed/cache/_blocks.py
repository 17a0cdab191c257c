"""Cache: every block parsed once, kept as Arrow IPC files on the workers' disk.

The scan parses each CSV block once and, while it is in memory, writes it here; every epoch
after that reads Arrow instead of CSV (several times faster to read than to parse). A block
that is missing (the manifest came from an earlier run, a worker on another machine, a damaged
or deleted cache file) is parsed again and written then.

Layout: ``<root>/<fingerprint>/g<first>-<tag>-<n>.arrow`` holds the blocks of one scan task
(thousands of small files make a few Arrow files, not thousands), each block a range of its
rows; the task's ``g<first>-<tag>.json`` marker, written last (:mod:`daskfeed.cache._writer`),
says where each block is, so a reader never sees half a task's blocks. The fingerprint covers
every file's path, size and mtime and the read options (:meth:`daskfeed.reading._source.Source.
fingerprint`): changed data or options get a new directory, and older directories of the same
files are removed when a new one is made, as are temporary files that writers killed mid-write
left behind (:mod:`daskfeed.cache._open`, on the trainer). Directories are created with mode 0700.

Each block's rows are stored in a seeded random order (:mod:`daskfeed.cache._scatter`):
:meth:`BlockCache.stored_view` gives them so (a window of the global order reads ranges of every
block), :func:`block_tables` in the file's order.

What is stored is what the feed needs, not the CSV's exact text: whole numbers exactly (int32
when they fit, else int64), decimals as parsed (float64), string columns dictionary-encoded,
timestamps as they are.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from daskfeed.cache._scatter import scatter, unscatter
from daskfeed.cache._writer import CACHE_VERSION, CacheWriter, RowRange
from daskfeed.reading import Block, ReadOptions, iter_tables

__all__ = ["BlockCache", "block_tables", "default_root", "forget_entry", "stored_table"]

Readers = dict[str, ipc.RecordBatchFileReader]  # open Arrow files, by path
Files = dict[str, pa.Table]  # whole Arrow files read, by path

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
class BlockCache:
    """One data set's cache directory (picklable: it travels to the workers with each task).

    ``root`` None: :func:`default_root` where the cache is used, i.e. on each worker (a remote
    worker's home, not the trainer's); ``key``: the data's directory under the root. Blocks
    are numbered as in ``Source.blocks``.
    """

    root: str | None
    key: str = ""
    compression: str | None = None  # of the files this cache writes (None: memory-mapped reads)

    @property
    def path(self) -> str:
        """The directory, as seen by the process asking."""
        root = default_root() if self.root is None else self.root
        return os.path.join(root, self.key) if self.key else root

    def lookup(self, index: int) -> list[RowRange] | None:
        """Where block ``index`` is: ``[(Arrow file, first row, rows, rows per batch), ...]`` or None.

        Parameters
        ----------
        index
            The block's index in the source.

        Returns
        -------
        list of RowRange or None
            The block's rows; None when it is not (completely) cached.
        """
        found = _index(self.path, refresh=False).get(index)
        if found is None:
            found = _index(self.path, refresh=True).get(index)
        return found

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
        """Block ``index``'s rows in their stored order, sliced from whole files read once.

        For a reader of every block (a window of the global order): each Arrow file is read
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
        pyarrow.Table or None
            None when the block is not cached, or unreadable (with a warning).
        """
        ranges = self.lookup(index)
        if ranges is None:
            return None
        base = self.path
        try:
            parts = [_whole_file(os.path.join(base, name), columns, files).slice(first, count)
                     for name, first, count, _ in ranges]
            return _one(parts)
        except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:
            self._unreadable(index, err)
            return None

    def locate(self, index: int, columns: list[str] | None,
               files: Files) -> tuple[Any, pa.Table, int, int] | None:
        """Where block ``index``'s rows are, in their stored order: ``(key, table, base, rows)``.

        Rows ``[base, base + rows)`` of ``table``: a whole file read once into ``files`` (key:
        its path) when the block is one run of it, else the block alone (key: its index).

        Parameters
        ----------
        index, columns, files
            As :meth:`stored_view` takes them.

        Returns
        -------
        tuple or None
            None when the block is not cached, or unreadable (with a warning).
        """
        ranges = self.lookup(index)
        if ranges is None:
            return None
        if len(ranges) == 1:
            name, first, count, _ = ranges[0]
            path = os.path.join(self.path, name)
            try:
                return path, _whole_file(path, columns, files), first, count
            except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:
                self._unreadable(index, err)
                return None
        view = self.stored_view(index, columns, files)
        return None if view is None else (("block", index), view, 0, view.num_rows)

    def _unreadable(self, index: int, err: BaseException) -> None:
        """Warn that block ``index`` is damaged in the cache, and forget it (it is parsed again)."""
        warnings.warn(f"daskfeed: cached block {index} in {self.path} is unreadable "
                      f"({type(err).__name__}: {err}); parsing it from the CSV again.", stacklevel=3)
        _forget(self.path, index)

    def tables(self, index: int, columns: list[str] | None = None,
               readers: Readers | None = None) -> list[pa.Table] | None:
        """The cached tables of block ``index``, in stored order (None: not cached, or unreadable).

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
            return [_read_rows(os.path.join(self.path, name), first, count, per, columns, readers)
                    for name, first, count, per in ranges]
        except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:  # damaged: reparse
            self._unreadable(index, err)
            return None

    def writer(self, first: int) -> CacheWriter:
        """A writer for the blocks of a scan task starting at ``first``: ``add``, then ``commit``.

        Parameters
        ----------
        first
            The scan task's first block.

        Returns
        -------
        CacheWriter
            A writer into this cache entry.
        """
        return CacheWriter(self.path, self.compression, first)

    def cached_blocks(self) -> int:
        """Number of complete blocks in the cache.

        Returns
        -------
        int
            The blocks complete in the cache.
        """
        return len(_index(self.path, refresh=True))


def _one(tables: list[pa.Table]) -> pa.Table:
    """A block's tables as one (files may type a column differently: int32 and int64...)."""
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers in one piece, text in another
        return _as_text(tables)


def _as_text(tables: list[pa.Table]) -> pa.Table:
    """Tables whose column types cannot be promoted, with those columns as text."""
    names = tables[0].column_names
    clash = {n for n in names if len({t.schema.field(n).type for t in tables if n in t.column_names}) > 1}
    out = []
    for t in tables:
        cols = [pc.cast(t.column(n).cast(t.column(n).type.value_type)
                                if pa.types.is_dictionary(t.column(n).type) else t.column(n),
                                pa.string()) if n in clash else t.column(n) for n in t.column_names]
        out.append(pa.Table.from_arrays(cols, names=t.column_names))
    return pa.concat_tables(out, promote_options="permissive").unify_dictionaries()


# Per worker process: cache path -> (markers already read, block -> row ranges). Markers are
# written once and never change, so only new ones are read when a block is not found.
_INDEXES: dict[str, tuple[set[str], dict[int, list[RowRange]]]] = {}
_INDEX_LOCK = threading.Lock()


def _index(path: str, refresh: bool) -> dict[int, list[RowRange]]:
    with _INDEX_LOCK:
        seen, blocks = _INDEXES.setdefault(path, (set(), {}))
        if not refresh and blocks:
            return blocks
        try:
            names = sorted(n for n in os.listdir(path) if n.startswith("g") and n.endswith(".json"))
        except OSError:
            return blocks
        fresh = []
        for name in names:
            if name in seen:
                continue
            try:
                with open(os.path.join(path, name), encoding="utf-8") as f:
                    meta = json.load(f)
                stamp = os.stat(os.path.join(path, name)).st_mtime_ns
            except (OSError, ValueError):
                continue
            seen.add(name)
            if meta.get("version") == CACHE_VERSION:
                fresh.append((stamp, meta))
        for _, meta in sorted(fresh, key=lambda m: m[0]):  # a rewritten block: newest wins
            for key, ranges in meta["parts"].items():
                blocks[int(key)] = [(str(n), int(b), int(c), int(p)) for n, b, c, p in ranges]
        return blocks


def forget_entry(path: str) -> None:
    """Drop what this process knows of the cache entry ``path`` (it is replaced or removed).

    Parameters
    ----------
    path
        The cache entry's directory.
    """
    with _INDEX_LOCK:
        _INDEXES.pop(path, None)


def _forget(path: str, index: int) -> None:
    with _INDEX_LOCK:
        if path in _INDEXES:
            _INDEXES[path][1].pop(index, None)


def _whole_file(path: str, columns: list[str] | None, files: Files) -> pa.Table:
    """The Arrow file ``path`` as one table (read once into ``files``)."""
    found = files.get(path)
    if found is None:
        found = files[path] = _open(path, columns).read_all()
    return found


def _open(path: str, columns: list[str] | None) -> ipc.RecordBatchFileReader:
    """An Arrow file, memory-mapped, reading only ``columns`` (None: all)."""
    source = pa.memory_map(path)  # batches of an uncompressed file are views of the mapping
    reader = ipc.open_file(source)
    if columns is not None:
        keep = [i for i, f in enumerate(reader.schema) if f.name in set(columns)]
        reader = ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=keep))
    return reader


def _read_rows(path: str, first: int, count: int, per: int, columns: list[str] | None,
               readers: Readers) -> pa.Table:
    """Rows ``[first, first + count)`` of the Arrow file ``path`` (record batches of ``per`` rows)."""
    reader = readers.get(path)
    if reader is None:
        reader = readers[path] = _open(path, columns)
    if count <= 0:
        return reader.schema.empty_table()
    lo, hi = first // per, (first + count - 1) // per
    table = pa.Table.from_batches([reader.get_batch(b) for b in range(lo, hi + 1)], schema=reader.schema)
    return table.slice(first - lo * per, count)


def block_tables(index: int, block: Block, options: ReadOptions, cache: BlockCache | None,
                 rejects: list[str] | None = None, *, use_cache: bool = True,
                 writer: CacheWriter | None = None, columns: list[str] | None = None,
                 readers: Readers | None = None) -> Iterator[pa.Table]:
    """Arrow tables of block ``index`` in file order: from the cache, else parsed (and then cached).

    Parameters
    ----------
    index, block, options
        The block, its number and how to parse it.
    cache
        Where blocks are cached (None: parse, cache nothing).
    rejects
        See :func:`daskfeed.reading._tables.iter_tables`.
    use_cache
        False: parse even when the block is cached.
    writer
        The scan task's writer (committed by the caller); without one, a block parsed here is
        cached on its own.
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
            for piece, table in enumerate(cached):
                yield unscatter(index, table, piece)
            return
    own = writer is None and cache is not None
    if own:
        assert cache is not None
        writer = cache.writer(index)
    try:
        if writer is not None:
            writer.begin(index)
        for table in iter_tables(block, options, rejects):
            if writer is not None:
                writer.add(index, table)
            yield table
    except BaseException:
        if own and writer is not None:
            writer.abort()
        raise
    if own and writer is not None:
        writer.commit()


def stored_table(index: int, block: Block, options: ReadOptions, cache: BlockCache | None,
                 columns: list[str] | None = None, files: Files | None = None) -> pa.Table:
    """Block ``index``'s rows in their stored order: from the cache, else parsed (and cached).

    Parameters
    ----------
    index, block, options, cache, columns
        As :func:`block_tables` takes them.
    files
        Whole cache files read so far (see :meth:`BlockCache.stored_view`).

    Returns
    -------
    pyarrow.Table
        Every row of the block, in the order the cache keeps them (the same whether it was
        cached or parsed here).
    """
    if cache is not None:
        found = cache.stored_view(index, columns, {} if files is None else files)
        if found is not None:
            return found
    pieces = [scatter(index, t, k) for k, t in enumerate(
        block_tables(index, block, options, cache, use_cache=False))]
    table = _one(pieces) if pieces else pa.table({})
    if columns is not None and table.num_columns:
        table = table.select([c for c in columns if c in table.column_names])
    return table
