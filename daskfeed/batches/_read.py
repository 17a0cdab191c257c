"""Window reading, ON WORKERS: a window → one compact, shuffled :class:`WindowData`.

A window of blocks (:func:`read_window`): its rows permuted across all its blocks with the
plan's window seed. A window of the global order (:func:`read_units`): runs of every block's
stored order, in the order's units (:mod:`daskfeed.batches._order`). Only what the model needs
(see :mod:`daskfeed.manifest._encoding`) crosses the wire.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from daskfeed.cache import block_tables, stored_table
from daskfeed.core import ManifestMismatchError
from daskfeed.dashboard import report_cache
from daskfeed.manifest import ENCODE_BYTES, Encoding, WindowData, concat, empty_window, encode_table, labelled

if TYPE_CHECKING:
    from daskfeed.batches._order import GlobalOrder, Lanes

__all__ = ["assemble", "encode_window", "permute", "read_units", "read_window"]


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


def assemble(order: GlobalOrder, units: tuple[int, int], span: tuple[int, int], lanes: Lanes,
             locate: Callable[[int], tuple[Any, Any, int, int]],
             usable: Callable[[int, Any], np.ndarray]) -> tuple[list[Any], np.ndarray]:
    """The rows of a window of the global order: tables of runs and their order (no encoding).

    Every row's place is computed at once (numpy over the window's rows), then each table a
    block lives in (a whole cache file, usually) is read with one ``take``.

    Parameters
    ----------
    order, units, span, lanes
        The epoch's order, the window's units and rows in it, and this trainer's batches.
    locate
        ``locate(j)``: ``(key, table, base, rows)``: block ``order.blocks[j]``'s rows in their
        stored order are rows ``[base, base + rows)`` of ``table`` (Arrow), known as ``key``
        (blocks of one cache file share its table).
    usable
        ``usable(j, rows)``: the stored positions of the rows with a label, for a block that has
        more rows than ``order.counts[j]`` (``rows``: its rows in stored order).

    Returns
    -------
    tuple
        ``(tables, index)``: the rows the window takes, one table per source table, and the
        positions in their concatenation of this trainer's rows in the epoch's order.
    """
    lo, hi, index = order.window_order(*units)
    keep = lanes.keep(*span)
    js = np.flatnonzero(hi > lo)
    if not len(js):
        return [], index[keep] if keep is not None else index
    lengths = (hi - lo)[js]
    total = int(lengths.sum())
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    # each row of the window's layout (block by block, rotated order): its block and place
    jrow = np.repeat(js, lengths)
    stored = (np.repeat(lo[js] - first, lengths) + np.arange(total) + order.rotations[jrow]) % order.n[jrow]
    sources: dict[Any, tuple[int, Any]] = {}
    source = np.empty(len(js), dtype=np.int64)
    base = np.empty(len(js), dtype=np.int64)
    for k, j in enumerate(js.tolist()):
        key, table, at, rows = locate(j)
        source[k] = sources.setdefault(key, (len(sources), table))[0]
        base[k] = at
        if rows != order.counts[j]:  # rows without a label are not in the order
            part = slice(int(first[k]), int(first[k] + lengths[k]))
            stored[part] = usable(j, table.slice(at, rows))[stored[part]]
    place = stored + np.repeat(base, lengths)
    srow = np.repeat(source, lengths)
    by_source = np.argsort(srow, kind="stable")
    bounds = np.searchsorted(srow[by_source], np.arange(len(sources) + 1))
    tables = [table.take(place[by_source[bounds[i]:bounds[i + 1]]])
              for i, (_, table) in enumerate(sorted(sources.values(), key=lambda v: v[0]))]
    moved = np.empty(total, dtype=np.int64)  # layout position -> position in the tables
    moved[by_source] = np.arange(total)
    index = moved[index]
    return tables, index[keep] if keep is not None else index


_WARNED: set[str] = set()  # cache directories this worker warned of


def _uncacheable(cache: Any, block: Any) -> None:
    """Say once per worker that the parse cache could not keep a block (each window parses it)."""
    if cache.path in _WARNED:
        return
    _WARNED.add(cache.path)
    warnings.warn(f"daskfeed: the parse cache in {cache.path} could not keep block "
                  f"{block.describe()} (disk full or not writable?): every window of the global "
                  "order parses such a block again. Hint: free disk room there, give the cache "
                  "another place (--cache DIR), or pass --no-cache.", stacklevel=2)


def read_units(order: GlobalOrder, units: tuple[int, int], span: tuple[int, int], lanes: Lanes,
               blocks: list[tuple[int, Any]], options: Any, encoding: Encoding,
               cache: Any = None) -> WindowData:
    """Read, encode and order a window of the global order in one task (on a worker).

    Each block's rows come in their stored order from the parse cache (parsed and cached
    where a block is missing: the same order), a run or two of every block
    (:func:`assemble`); only the columns the encoding needs are read, and only this trainer's
    rows are encoded.
    """
    files: dict[str, Any] = {}  # each cache file read once for the window
    columns = encoding.names
    hits = 0

    def locate(j: int) -> tuple[Any, Any, int, int]:
        nonlocal hits
        index, block = blocks[j]
        found = cache.locate(index, columns, files) if cache is not None else None
        if found is not None:
            hits += 1
            return found
        table = stored_table(index, block, options, cache, columns=columns, files=files)
        if cache is not None and not cache.has(index):
            _uncacheable(cache, block)
        return ("parsed", index), table, 0, table.num_rows

    def usable(j: int, rows: Any) -> np.ndarray:
        mask = labelled(rows, encoding) if encoding.label in rows.column_names else None
        at = np.arange(rows.num_rows) if mask is None else np.flatnonzero(mask)
        if len(at) != order.counts[j]:
            raise ManifestMismatchError(
                f"Block {blocks[j][1].describe()} has {len(at)} rows with a label; the manifest "
                f"says {order.counts[j]}. The data changed after the scan.\nHint: rescan "
                "(remove the cached manifest) and restart.")
        return at

    tables, index = assemble(order, units, span, lanes, locate, usable)
    if cache is not None:
        report_cache(hits, len(blocks) - hits)
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
