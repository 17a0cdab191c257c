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
             table_of: Callable[[int], Any],
             usable: Callable[[int, Any], np.ndarray]) -> tuple[Any, np.ndarray]:
    """The rows of a window of the global order: a table of runs and their order (no encoding).

    Parameters
    ----------
    order, units, span, lanes
        The epoch's order, the window's units and rows in it, and this trainer's batches.
    table_of
        ``table_of(j)``: block ``order.blocks[j]``'s rows in their stored order (Arrow).
    usable
        ``usable(j, table)``: the stored positions of its rows with a label, for a block whose
        table has more rows than ``order.counts[j]``.

    Returns
    -------
    tuple
        ``(table, index)``: the runs of every block the window takes, one after another, and
        the positions in it of this trainer's rows in the epoch's order.
    """
    import pyarrow as pa

    lo, hi, index = order.window_order(*units)
    pieces = []
    for j in np.flatnonzero(hi > lo):
        table = table_of(int(j))
        runs = order.runs(int(j), int(lo[j]), int(hi[j]))
        if table.num_rows == order.counts[j]:
            pieces += [table.slice(a, b - a) for a, b in runs]  # views: nothing copied
        else:  # rows without a label are not in the order: take the labelled ones' positions
            at = usable(int(j), table)
            pieces.append(table.take(np.concatenate([at[a:b] for a, b in runs])))
    keep = lanes.keep(*span)
    if keep is not None:
        index = index[keep]
    if not pieces:
        return None, index
    return pa.concat_tables(pieces, promote_options="permissive"), index


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

    def table_of(j: int) -> Any:
        nonlocal hits
        index, block = blocks[j]
        cached = cache is not None and cache.has(index)
        hits += cached
        table = stored_table(index, block, options, cache, columns=columns, files=files)
        if cache is not None and not cached and not cache.has(index):
            _uncacheable(cache, block)
        if encoding.label not in table.column_names:
            return table.append_column(encoding.label, pa.nulls(table.num_rows))  # refused below
        return table

    def usable(j: int, table: Any) -> np.ndarray:
        mask = labelled(table, encoding)
        at = np.arange(table.num_rows) if mask is None else np.flatnonzero(mask)
        if len(at) != order.counts[j]:
            raise ManifestMismatchError(
                f"Block {blocks[j][1].describe()} has {len(at)} rows with a label; the manifest "
                f"says {order.counts[j]}. The data changed after the scan.\nHint: rescan "
                "(remove the cached manifest) and restart.")
        return at

    import pyarrow as pa

    table, index = assemble(order, units, span, lanes, table_of, usable)
    if cache is not None:
        report_cache(hits, len(blocks) - hits)
    if table is None or not len(index):
        return empty_window(encoding)
    if len(index) < table.num_rows:  # several trainers: encode only this one's rows
        return encode_table(table.take(index), encoding)
    return encode_table(table, encoding).rows(index)
