"""Window reading, ON WORKERS: a window → one compact, shuffled :class:`WindowData`.

A window of blocks (:func:`read_window`): its rows permuted across all its blocks with the
plan's window seed. A window of the global order (:func:`read_buckets`): whole buckets, each
permuted in the order's units (:mod:`daskfeed.batches._order`). Only what the model needs
(see :mod:`daskfeed.manifest._encoding`) crosses the wire.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from daskfeed.batches._memory_buckets import MemoryBuckets
from daskfeed.batches._order import window_index
from daskfeed.cache import block_tables
from daskfeed.cluster import release_after_task
from daskfeed.core import DataError
from daskfeed.dashboard import report_cache
from daskfeed.manifest import ENCODE_BYTES, Encoding, WindowData, concat, empty_window, encode_table
from daskfeed.reading import named, reading

if TYPE_CHECKING:
    from daskfeed.batches._memory_buckets import BucketFiles
    from daskfeed.batches._order import Lanes
    from daskfeed.cache import BlockCache
    from daskfeed.reading import Block, ReadOptions


def permute(data: WindowData, seed: Sequence[int] | None) -> WindowData:
    """The rows of ``data`` in the order the window seed gives (as they are without one)."""
    if seed is None or len(data) < 2:
        return data
    return data.rows(np.random.default_rng(list(seed)).permutation(len(data)))


def encode_window(*tables: pa.Table, encoding: Encoding,
                  seed: Sequence[int] | None = None) -> WindowData:
    """Encode a window's tables and shuffle rows across all of them (on a worker).

    ``tables``: a dask DataFrame's blocks (its partitions) as Arrow
    (:meth:`daskfeed.reading._source.Source.partitions`).
    """
    parts = [encode_table(t, encoding) for t in tables if t.num_rows]
    return permute(concat(parts), seed) if parts else empty_window(encoding)


def read_window(blocks: list[tuple[int, Block]], options: ReadOptions, encoding: Encoding,
                seed: Sequence[int] | None = None, cache: BlockCache | None = None) -> WindowData:
    """Read, encode and shuffle a window of ``(index, block)`` blocks in one task (on a worker).

    Tables come from the parse cache when ``cache`` holds the block (only the columns the
    encoding needs), else are parsed from CSV (and written to the cache). Consecutive tables are
    encoded together once they hold about ``ENCODE_BYTES`` (thousands of small files are not
    encoded one by one), so the task's peak memory is those tables plus the window's compact
    arrays, and no parsed frame crosses the network.
    """
    parts: list[WindowData] = []
    pending: list[pa.Table] = []  # tables read, not encoded yet
    size = 0
    columns = encoding.names
    readers: dict[str, Any] = {}  # each cache file opened once per window
    hits = 0
    for index, block in blocks:
        hits += cache is not None and cache.has(index)
        # (a read that hangs: a timeout names it)
        for table in named(block_tables(index, block, options, cache, columns=columns,
                                        readers=readers), block.describe):
            if table.num_rows:
                pending.append(table)
                size += table.nbytes
            del table
            if size >= ENCODE_BYTES:
                parts.extend(_encode_tables(pending, encoding))
                pending, size = [], 0
                readers.clear()  # unmap what was read: the task holds these tables, not the window
    parts.extend(_encode_tables(pending, encoding))
    if cache is not None:
        report_cache(hits, len(blocks) - hits)  # the dashboard's cache hit rate
    return permute(concat(parts), seed) if parts else empty_window(encoding)


def _encode_tables(tables: list[pa.Table], encoding: Encoding) -> list[WindowData]:
    """Encode tables in order: as one when their columns line up, else one by one."""
    import pyarrow as pa

    if len(tables) > 1:
        try:
            tables = [pa.concat_tables(tables, promote_options="permissive")]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers in one file, text in another
            pass
    return [encode_table(t, encoding) for t in tables]


def read_buckets(files: BucketFiles, window: list[tuple[int, int, tuple[int, ...]]],
                 span: tuple[int, int], lanes: Lanes, encoding: Encoding,
                 client: Any = None) -> WindowData:
    """Read, encode and order a window of the global order in one task (on a worker).

    Or in the trainer's own threads (:mod:`daskfeed.batches._here`), which pass their
    ``client``: the dashboard's cache counts go through it there.

    The window's units are whole buckets (:meth:`~daskfeed.batches._order.GlobalOrder.window`),
    each read whole from its Arrow file (only the columns the encoding needs) and put in the
    epoch's order (:func:`~daskfeed.batches._order.window_index`); only this trainer's rows
    are encoded. Memory: the window's rows, whatever the number of blocks or files.

    Raises
    ------
    DataError
        A bucket file is missing or holds other rows (the set is then marked incomplete, so the
        next run builds it again).
    """
    if isinstance(files, MemoryBuckets):  # held in the trainer, encoded: one gather
        report_cache(len(window), 0, client=client)
        return files.window(window, window_index(window, span, lanes))
    columns = encoding.names
    tables = []
    for b, rows, _ in window:
        try:
            with reading(functools.partial(_bucket_name, files, b)):
                table = files.read_bucket(b, columns)
        except (OSError, pa.ArrowException) as err:
            files.forget()
            raise DataError(
                f"Cannot read bucket {b} of the global order ({files.bucket_path(b)}). Expected "
                f"the file the buckets' build wrote.\nReceived: {type(err).__name__}: {err}\n"
                "Hint: run again (the buckets are built again); on a cluster of several "
                "machines give every worker the same cache directory (--cache DIR on a shared "
                "volume).") from err
        if table.num_rows != rows:
            files.forget()
            raise DataError(
                f"Expected {rows} rows in bucket {b} ({files.bucket_path(b)}). Received: "
                f"{table.num_rows}.\nHint: run again (the buckets are built again).")
        tables.append(table)
    report_cache(len(tables), 0, client=client)  # the cache hit rate: buckets are the cache's
    index = window_index(window, span, lanes)
    try:
        return _encode_buckets(tables, index, encoding)
    finally:
        del tables
        release_after_task()  # the Arrow it read: kept for the next window, or given back


def _bucket_name(files: BucketFiles, b: int) -> str:
    return f"bucket {b} of the global order ({files.bucket_path(b)})"


def _encode_buckets(tables: list[pa.Table], index: np.ndarray, encoding: Encoding) -> WindowData:
    """The rows ``index`` of the buckets' tables (concatenated), encoded, in that order."""
    if not tables or not len(index):
        return empty_window(encoding)
    several = len(index) < sum(t.num_rows for t in tables)  # several trainers: only this one's rows
    try:
        whole = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers in one file, text in another
        return concat([encode_table(t, encoding) for t in tables]).rows(index)
    if several:
        return encode_table(whole.take(index), encoding)
    return encode_table(whole, encoding).rows(index)
