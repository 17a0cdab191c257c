"""Window reading, ON WORKERS: a window's blocks → one compact, shuffled :class:`WindowData`.

Rows are permuted across all blocks of the window with the plan's window seed; only what the
model needs (see :mod:`daskfeed.manifest._encoding`) crosses the wire.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskfeed.cache import block_tables
from daskfeed.dashboard import report_cache
from daskfeed.manifest import ENCODE_BYTES, Encoding, WindowData, concat, empty_window, encode_table

__all__ = ["encode_window", "permute", "read_window"]


def permute(data: WindowData, seed: Any) -> WindowData:
    """The rows of ``data`` in the order the window seed gives (as they are without one)."""
    if seed is None or len(data) < 2:
        return data
    return data.rows(np.random.default_rng(list(seed)).permutation(len(data)))


def encode_window(*tables: Any, encoding: Encoding, seed: Any = None) -> WindowData:
    """Encode a window's tables and shuffle rows across all of them (on a worker).

    ``tables``: a dask DataFrame's blocks (its partitions) as Arrow
    (:meth:`daskfeed.reading._source.Source.partitions`).
    """
    parts = [encode_table(t, encoding) for t in tables if t.num_rows]
    return permute(concat(parts), seed) if parts else empty_window(encoding)


def read_window(blocks: list[tuple[int, Any]], options: Any, encoding: Encoding, seed: Any = None,
                cache: Any = None) -> WindowData:
    """Read, encode and shuffle a window of ``(index, block)`` blocks in one task (on a worker).

    Tables come from the parse cache when ``cache`` holds the block (only the columns the
    encoding needs), else are parsed from CSV (and written to the cache). Consecutive tables are
    encoded together once they hold about ``ENCODE_BYTES`` (thousands of small files are not
    encoded one by one), so the task's peak memory is those tables plus the window's compact
    arrays, and no parsed frame crosses the network.
    """
    parts: list[WindowData] = []
    pending: list[Any] = []  # tables read, not encoded yet
    size = 0
    columns = encoding.names
    readers: dict[str, Any] = {}  # each cache file opened once per window
    hits = 0
    for index, block in blocks:
        hits += cache is not None and cache.has(index)
        for table in block_tables(index, block, options, cache, columns=columns, readers=readers):
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


def _encode_tables(tables: list[Any], encoding: Encoding) -> list[WindowData]:
    """Encode tables in order: as one when their columns line up, else one by one."""
    import pyarrow as pa

    if len(tables) > 1:
        try:
            tables = [pa.concat_tables(tables, promote_options="permissive")]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers in one file, text in another
            pass
    return [encode_table(t, encoding) for t in tables]
