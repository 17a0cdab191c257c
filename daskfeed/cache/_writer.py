"""Cache writer: the blocks of one scan task written as a few Arrow IPC files, then one marker.

The files are written under temporary names and fsync'ed (in a thread each, while the task
parses on); :meth:`CacheWriter.commit` waits for those, renames the files into place, flushes
the directory and writes the marker last (:mod:`daskfeed.core._atomic`), so a reader of the cache
(:mod:`daskfeed.cache._blocks`) never sees half a scan task's blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from daskfeed.core import create_new, fsync, temporary_name, write_file

# 3: whole numbers kept exact (int32/int64), decimals float64; 4: each block's rows in their
# stored order (:mod:`daskfeed.cache._scatter`), a block a range of record batches; 5: a block a
# range of rows of a file of record batches of BATCH_ROWS rows (the last one shorter): a reader
# of every block decodes a file's few batches, not one batch per block; 6: one directory per part
# of the source's files, blocks numbered (and their stored order seeded) within it; 7: a text
# column of dates that pyarrow left as text (zoned and naive times mixed, markers) stored as dates;
# 8: a block's stored order seeded by its part's anchor (its first file), not by the part's key:
# a part that grew keeps its blocks' orders, in its earlier entries (:mod:`daskfeed.cache._lineage`);
# 9: each block's rows in their file's order, the stored order applied as they are read (the scan
# no longer permutes what it writes: :mod:`daskfeed.cache._scatter`)
CACHE_VERSION = 9
FLUSH_BYTES = 16 << 20  # an Arrow file holds about this much data (memory: one per task)
BATCH_ROWS = 8192  # rows per record batch (a compressed file decodes about this much per read)

# where a block is in the cache: (Arrow file name, first row, rows, rows per record batch)
RowRange = tuple[str, int, int, int]


class CacheWriter:
    """Writes the blocks of one scan task as a few Arrow IPC files, then one marker.

    Each table's rows are kept in their file's order (the stored order is applied as they are
    read, :mod:`daskfeed.cache._scatter`); a block of several tables has several pieces.
    Tables are kept until about ``FLUSH_BYTES`` have accumulated (or the next table's columns
    cannot share a file with them), then written as one file (see :func:`compact` for the
    column types, decided per file; one dictionary per string column per file); uncompressed
    (read as a memory map, nothing to decode) or zstd/lz4. Every block is a range of rows of
    a file.

    Parameters
    ----------
    directory
        The cache entry's directory.
    compression
        Of the Arrow files (None: uncompressed).
    first
        The scan task's first block in this directory (names the files).
    offset
        Block ``index`` is number ``index - offset`` in this directory (its part's, see
        :meth:`~daskfeed.cache._blocks.BlockCache.place`); 0: blocks kept as numbered.
    """

    def __init__(self, directory: str, compression: str | None, first: int, *,
                 offset: int = 0) -> None:
        self.directory = directory
        self.compression = compression
        self.offset = offset
        self.stem = f"g{first:06d}-{uuid.uuid4().hex[:8]}"
        # (blocks: (index, rows, piece) each, their rows in file order)
        self.pending: list[tuple[list[tuple[int, int, int]], pa.Table]] = []
        self.pending_bytes = 0
        self.schema: pa.Schema | None = None  # the pending tables' columns, unified
        self.blocks: dict[int, list[RowRange]] = {}
        self.files: list[str] = []
        self.tmps: dict[str, str] = {}  # each file's temporary name, until it is renamed
        self.syncs: list[threading.Thread] = []  # fsyncs of the files written
        self.failed = False
        self.added: dict[int, int] = {}  # pieces of each block added so far (numbers the next)

    def begin(self, index: int) -> None:
        """Block ``index`` starts (it is cached even if it has no rows).

        Parameters
        ----------
        index
            The block's index in the source.
        """
        self.blocks.setdefault(index, [])

    def add(self, index: int, table: pa.Table) -> None:
        """One table of block ``index`` (its next piece), in its file's order.

        Parameters
        ----------
        index
            The block's index in the source.
        table
            One table parsed from it.
        """
        piece = self.added[index] = self.added.get(index, -1) + 1
        self._pend([(index, table.num_rows, piece)], table)

    def add_parts(self, parts: list[tuple[int, int]], table: pa.Table) -> None:
        """Whole blocks parsed as one table: ``(block index, its rows)`` in the table's order.

        Parameters
        ----------
        parts
            Each block's index in the source and how many of the table's rows are its (the
            first block's come first).
        table
            Their rows (a :class:`daskfeed.reading._small_files.Run`'s table).
        """
        if self.failed:
            return
        self._pend([(index, rows, 0) for index, rows in parts], table)

    def _pend(self, parts: list[tuple[int, int, int]], table: pa.Table) -> None:
        """Rows of whole blocks (or a piece of one) for the next file: ``(block, rows, piece)``."""
        schema = table.schema
        if self.pending and not schema.equals(self.schema):
            try:
                schema = pa.unify_schemas([self.schema, table.schema], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. text here, numbers before
                self._flush()
        self.schema = schema
        for index, _, _ in parts:
            self.begin(index)
        self.pending.append((parts, table))
        self.pending_bytes += table.nbytes
        if self.pending_bytes >= FLUSH_BYTES:
            self._flush()

    def _next_name(self) -> str:
        return f"{self.stem}-{len(self.files):03d}.arrow"

    def _flush(self) -> None:
        if self.failed or not self.pending:
            return
        name = self._next_name()
        path = self.tmps[name] = temporary_name(os.path.join(self.directory, name))
        try:
            self._write(path, name)
        except (OSError, pa.ArrowException):  # disk full or gone: the feed still works, from CSV
            self.abort()
            return
        finally:
            self.pending = []
            self.pending_bytes = 0
            self.schema = None
        self.files.append(name)
        # flushed to disk while the next blocks are parsed; commit waits before the marker
        sync = threading.Thread(target=fsync, args=(path,), daemon=True, name="daskfeed-fsync")
        sync.start()
        self.syncs.append(sync)

    def _write(self, path: str, name: str) -> None:
        """The pending tables as one Arrow file at ``path``; each block's rows in it noted."""
        whole = compact(pa.concat_tables([t for _, t in self.pending], promote_options="permissive"))
        # each column one chunk, with one dictionary per string column (rows as they came)
        whole = whole.unify_dictionaries().combine_chunks()
        options = ipc.IpcWriteOptions(compression=self.compression)
        create_new(path, perms=0o600).close()  # (made here, in our own directory: no link followed)
        with pa.OSFile(path, "wb") as f, ipc.new_file(f, whole.schema, options=options) as w:
            for batch in whole.to_batches(max_chunksize=BATCH_ROWS):
                w.write_batch(batch)
        offset = 0
        for index, rows, _ in (part for parts, _ in self.pending for part in parts):
            self.blocks[index].append((name, offset, rows, BATCH_ROWS))
            offset += rows

    def commit(self) -> None:
        """Write what is pending, rename the files into place, then write the marker."""
        self._flush()
        for sync in self.syncs:  # the data is on disk before a marker can point at it
            sync.join()
        if self.failed:
            return
        try:
            for name in self.files:
                final = os.path.join(self.directory, name)
                os.replace(self.tmps[name], final)
            fsync(self.directory)  # the renames, before the marker's
            # the marker's key "parts" is the persisted format's: block -> row ranges
            # a block's ranges are its pieces, in order (a piece is written whole, in one file)
            marker = {"version": CACHE_VERSION,
                      "parts": {str(k - self.offset): v for k, v in self.blocks.items()}}
            write_file(os.path.join(self.directory, f"{self.stem}.json"), json.dumps(marker))
        except OSError:
            self.abort()

    def abort(self) -> None:
        """Remove whatever this writer left behind."""
        self.failed = True
        for name in [*self.files, self._next_name()]:
            final = os.path.join(self.directory, name)
            for path in (self.tmps.get(name, ""), final):
                with contextlib.suppress(OSError):
                    os.remove(path)


class Places(Protocol):
    """Where a block's files go: a :class:`~daskfeed.cache.BlockCache`."""

    @property
    def compression(self) -> str | None:
        """The files' compression (None: plain)."""
        ...

    def place(self, index: int) -> tuple[str, int, int]:
        """Where block ``index`` is kept: ``(directory, number in it, block id)``."""
        ...


class PartWriters:
    """The cache writers of one scan task: a cache writer per part it writes blocks of.

    Blocks are named by their index in the source, as the scan knows them; each goes to its
    part's directory under its number there (``cache``: a :class:`~daskfeed.cache.BlockCache`,
    its :meth:`~daskfeed.cache.BlockCache.place`).
    """

    def __init__(self, cache: Places) -> None:
        self.cache = cache
        self.writers: dict[str, CacheWriter] = {}

    def _writer(self, index: int) -> CacheWriter:
        directory, local, _ = self.cache.place(index)
        writer = self.writers.get(directory)
        if writer is None:
            writer = self.writers[directory] = CacheWriter(
                directory, self.cache.compression, local, offset=index - local)
        return writer

    def begin(self, index: int) -> None:
        """Block ``index`` starts (it is cached even if it has no rows)."""
        self._writer(index).begin(index)

    def add(self, index: int, table: pa.Table) -> None:
        """One table of block ``index`` (its next piece)."""
        self._writer(index).add(index, table)

    def add_parts(self, parts: list[tuple[int, int]], table: pa.Table) -> None:
        """Whole blocks parsed as one table, ``(block index, its rows)`` in its order, split by part."""
        start = 0
        while parts:
            writer = self._writer(parts[0][0])
            n = next((k for k, (i, _) in enumerate(parts) if self._writer(i) is not writer),
                     len(parts))
            rows = sum(r for _, r in parts[:n])
            writer.add_parts(parts[:n], table.slice(start, rows))
            start += rows
            parts = parts[n:]

    @property
    def failed(self) -> bool:
        """Whether a part's writer failed (its blocks are then not cached)."""
        return any(w.failed for w in self.writers.values())

    def commit(self) -> None:
        """Commit every part's writer: what is pending written, files renamed into place, marker last."""
        for writer in self.writers.values():
            writer.commit()

    def abort(self) -> None:
        """Abort every part's writer."""
        for writer in self.writers.values():
            writer.abort()


def compact(table: pa.Table) -> pa.Table:
    """Columns as the cache keeps them.

    Whole numbers exact (int32 when they fit, else int64), decimals as parsed (float64),
    strings dictionary-encoded.

    Parameters
    ----------
    table
        A parsed table.

    Returns
    -------
    pyarrow.Table
        The same rows and column names.
    """
    cols = []
    for col in table.columns:
        t = col.type
        if pa.types.is_integer(t) and t != pa.int32():
            bounds = pc.min_max(col)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo is None or (-(2**31) <= lo and hi < 2**31):
                col = col.cast(pa.int32())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            col = pc.dictionary_encode(col)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)
