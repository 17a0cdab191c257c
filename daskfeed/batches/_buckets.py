"""The buckets of a data set built once, on the cluster, from its parse cache.

The global order (:mod:`daskfeed.batches._order`) reads an epoch as whole buckets, each a
random sample of the whole data set; this module makes their files
(:class:`~daskfeed.cache._buckets.BucketSet`) in two steps, an external shuffle of the parse
cache (Arrow, never the CSV again):

1. *deal* (:func:`deal`, one task per group of consecutive blocks of about ``run_rows`` rows):
   each block's rows with a label, in their stored order, go to buckets ``(i + o_j) mod K``;
   the group's rows are written as one *run*, sorted by bucket (stable: canonical order).
2. *merge* (while there are more than ``FAN_IN`` runs): ``FAN_IN`` consecutive runs become one,
   bucket range by bucket range (``run_rows`` rows at a time). Without it each gather would read
   a range of every run: ``(N / run_rows)**2`` reads in all, hours at 100 GB on a small budget;
   with it, each level reads and writes the runs once, with ``FAN_IN`` reads per range.
3. *gather* (:func:`gather`, one task per range of buckets of about ``run_rows`` rows): the
   range of every run, concatenated in run order, written as one file per bucket.

A task holds its own rows (a run's, a range of buckets'), never the data set's: memory and
time per task are bounded by ``run_rows``, whatever the number of blocks or files. The set is
built once per data set (its key covers the parse cache's parts, the label and ``K``) and
reused by every later run, budget, batch size or model; a set cut short is built again.
"""

from __future__ import annotations

import time
import uuid
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from dask.utils import format_bytes

from daskfeed.batches._order import block_offsets, bucket_count, bucket_of, bucket_sizes
from daskfeed.cache import TRACE_COLUMNS, BucketSet, digest, estimate_bytes, stored_table
from daskfeed.cluster import explain, result_unless_paused
from daskfeed.core import ManifestMismatchError
from daskfeed.manifest import labelled

if TYPE_CHECKING:
    from daskfeed.batches._prepare import Prepared
    from daskfeed.cache import BlockCache
    from daskfeed.manifest import Encoding
    from daskfeed.reading import Block, ReadOptions

__all__ = ["RUN_ROWS", "Buckets", "bucket_set", "deal", "gather", "task_rows"]

RUN_ROWS = 1 << 19  # rows a build task holds, at most (a run; a range of buckets)
MIN_RUN_ROWS = 1 << 14
ROOM_MARGIN = 1 << 30  # disk kept free beyond the build's estimate
FAN_IN = 32  # runs merged into one while there are more: a gather reads at most this many
TASK_COPIES = 6  # a task's peak over its rows' CSV bytes (Arrow, its sorted copy, the file)


class Buckets:
    """A data set's buckets as the trainer plans with them: the files and each one's rows.

    Attributes
    ----------
    files
        The :class:`~daskfeed.cache._buckets.BucketSet` (what a window task reads).
    sizes
        Rows of each bucket (numpy int64, ``K`` of them).
    seconds
        How long their build took here (None: built before, reused).
    """

    def __init__(self, files: BucketSet, sizes: np.ndarray, seconds: float | None = None) -> None:
        self.files = files
        self.sizes = sizes
        self.seconds = seconds

    @property
    def count(self) -> int:
        """``K``."""
        return len(self.sizes)


def bucket_set(data: Prepared, *, run_rows: int | None = None) -> Buckets | None:
    """The buckets of ``data`` (built on its cluster when missing); None where they cannot be.

    Parameters
    ----------
    data
        Prepared data with a parse cache.
    run_rows
        Rows per build task (see the module docstring); default: what a worker's memory limit
        holds (:func:`task_rows`).

    Returns
    -------
    Buckets or None
        None (with a warning) when the workers cannot see one another's files: the global
        order then falls back to windows of blocks.
    """
    cache = data.cache
    assert cache is not None
    counts = np.asarray(data.manifest.counts, dtype=np.int64)
    k = bucket_count(int(counts.sum()), int(data.manifest.nbytes))
    offsets = block_offsets(cache.block_ids(len(counts)), k)
    sizes = bucket_sizes(counts, offsets, k)
    enc = data.encoding
    key = BucketSet.key_of(parts=list(cache.parts), starts=list(cache.starts),
                           root=cache.root if not cache.parts else None, buckets=k,
                           label=enc.label, classes=list(enc.label_classes),
                           counts=digest(counts), fingerprint=data.manifest.fingerprint)
    files = BucketSet(cache.root, key, k, compression=cache.compression)
    sealed = digest(sizes)
    client = data.client
    built = client.submit(files.complete, sealed,
                          key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
    if built:
        return Buckets(replace(files, build=built), sizes)
    # the runs and the buckets side by side at the build's peak: about twice the parse cache
    need = 2 * estimate_bytes(data.source, cache.compression) + ROOM_MARGIN
    free = client.submit(files.free, key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
    if free < need:
        warnings.warn(
            f"daskfeed: the global order needs its buckets written beside the parse cache: about "
            f"{format_bytes(need)} free under {files.path}. Received: {format_bytes(free)} free. "
            "Rows are shuffled within windows of blocks instead, not in one global order.\nHint: "
            "free disk room there, or give the cache another place (--cache DIR).", stacklevel=2)
        return None
    if run_rows is None:
        run_rows = task_rows(client, data.manifest.nbytes, int(counts.sum()))
    t0 = time.perf_counter()
    try:
        files = _build(data, files, counts, offsets, sizes, sealed, run_rows)
    except FileNotFoundError as err:  # a run written on one machine, looked for on another ...
        built = client.submit(files.complete, sealed,
                              key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
        if built:  # ... or removed by another trainer that completed the same set first
            return Buckets(replace(files, build=built), sizes)
        warnings.warn(
            f"daskfeed: could not deal the rows into buckets ({err}): the workers do not share "
            "the parse cache's directory, so rows are shuffled within windows of blocks, not in "
            "one global order.\nHint: give every worker the same cache directory (--cache DIR "
            "on a shared volume).", stacklevel=2)
        return None
    return Buckets(files, sizes, time.perf_counter() - t0)


def task_rows(client: Any, csv_bytes: int, rows: int) -> int:
    """Rows a build task may hold: what a worker thread has left before its worker pauses.

    A worker pauses at ``distributed.worker.memory.pause`` (80 %) of its memory limit; what its
    process holds already (the runtime, pyarrow's pool) is not the task's. The room left, shared
    by the worker's threads, over ``TASK_COPIES`` times the data's CSV bytes per row, within
    ``[MIN_RUN_ROWS, RUN_ROWS]`` (the smallest worker decides).
    """
    import dask.config

    pause = dask.config.get("distributed.worker.memory.pause") or 0.8
    workers = client.scheduler_info(n_workers=-1).get("workers", {}).values()
    room = [(pause * w["memory_limit"] - w.get("metrics", {}).get("memory", 0))
            / max(int(w.get("nthreads", 1)), 1) for w in workers if w.get("memory_limit")]
    if not room or not rows:
        return RUN_ROWS
    row_bytes = max(csv_bytes / rows, 1.0)
    return int(min(RUN_ROWS, max(MIN_RUN_ROWS, min(room) / TASK_COPIES / row_bytes)))


def _build(data: Prepared, files: BucketSet, counts: np.ndarray, offsets: np.ndarray,
           sizes: np.ndarray, sealed: str, run_rows: int) -> BucketSet:
    client, source, cache = data.client, data.source, data.cache
    # the same tasks (keys) and files for every trainer building this set on one scheduler: the
    # scheduler runs them once; a build cut short writes the same files again
    tag = files.key[:12]
    groups = _groups(counts, run_rows)
    runs = [f"r{n:06d}" for n in range(len(groups))]
    deals = [client.submit(deal, files, tag, name,
                           [(int(i), source.blocks[i], int(offsets[i]), int(counts[i])) for i in g],
                           source.options, cache, data.encoding,
                           key=f"daskfeed-buckets-deal-{files.key}-{n}", retries=1)
             for n, (name, g) in enumerate(zip(runs, groups, strict=True))]
    _gather_all(client, deals, "the rows dealt into buckets")
    level = 0
    while len(runs) > FAN_IN:  # fewer, longer runs: every gather reads a range of each run
        groups_of = [runs[i:i + FAN_IN] for i in range(0, len(runs), FAN_IN)]
        merged = [f"m{level}-{n:06d}" for n in range(len(groups_of))]
        merges = [client.submit(_merge, files, tag, group, name, run_rows,
                                key=f"daskfeed-buckets-merge-{files.key}-{level}-{n}", retries=1)
                  for n, (group, name) in enumerate(zip(groups_of, merged, strict=True))]
        _gather_all(client, merges, "the runs of buckets merged")
        runs, level = merged, level + 1
    k = len(sizes)
    per = max(1, int(run_rows * k // max(int(sizes.sum()), 1)))
    ranges = [(b, min(b + per, k)) for b in range(0, k, per)]
    gathers = [client.submit(gather, files, tag, runs, b0, b1, [int(s) for s in sizes[b0:b1]],
                             key=f"daskfeed-buckets-gather-{files.key}-{b0}", retries=1)
               for b0, b1 in ranges]
    _gather_all(client, gathers, "the buckets gathered from their runs")
    parts = list(cache.parts) if cache is not None else []
    build = uuid.uuid4().hex[:12]  # this build's files (window task keys change with it)
    client.submit(files.seal, sealed, parts, tag, build,
                  key=f"daskfeed-buckets-seal-{build}").result()
    return replace(files, build=build)


def _gather_all(client: Any, futures: list[Any], what: str) -> None:
    """Wait for every future (its error raised, explained); released whatever happened."""
    try:
        for f in futures:  # a worker paused for good is a BudgetError, not a wait without end
            result_unless_paused(f, what=what)
    except FileNotFoundError:
        raise
    except Exception as err:
        new = explain(err, what, client)
        if new is err:
            raise
        raise new from err
    finally:
        for f in futures:
            f.release()


def _merge(files: BucketSet, tag: str, inputs: list[str], output: str, step_rows: int) -> int:
    """Merge runs into one (on a worker), its memory given back after."""
    rows = files.merge_runs(tag, inputs, output, step_rows)
    pa.default_memory_pool().release_unused()
    return rows


def _groups(counts: np.ndarray, run_rows: int) -> list[list[int]]:
    """Consecutive blocks with rows, in groups of about ``run_rows`` rows (a block alone if more)."""
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in np.flatnonzero(counts > 0).tolist():
        n = int(counts[i])
        if current and held + n > run_rows:
            groups.append(current)
            current, held = [], 0
        current.append(i)
        held += n
    if current:
        groups.append(current)
    return groups


def deal(files: BucketSet, tag: str, name: str, blocks: list[tuple[int, Block, int, int]],
         options: ReadOptions, cache: BlockCache, encoding: Encoding) -> int:
    """Deal a group of blocks' rows into buckets: one run, sorted by bucket (on a worker).

    Parameters
    ----------
    files, tag, name
        The set, its build and the run's name.
    blocks
        ``(index, block, offset, rows)``: each block, its :func:`~daskfeed.batches._order.block_offsets`
        offset and its rows with a label (the manifest's count, checked).
    options, cache, encoding
        How blocks are read (the parse cache; parsed where a block is missing) and the label.

    Returns
    -------
    int
        The run's rows.
    """
    k = files.buckets
    tables, where = [], []
    opened: dict[str, pa.Table] = {}  # whole cache files, views of their memory maps
    for index, block, offset, expected in blocks:
        table = stored_table(index, block, options, cache, files=opened)
        if len(opened) > 2:
            opened.clear()  # a group's blocks are consecutive: one or two files at a time
        mask = labelled(table, encoding) if encoding.label in table.column_names else None
        at = np.arange(table.num_rows, dtype=np.int64) if mask is None else np.flatnonzero(mask)
        if len(at) != expected:
            raise ManifestMismatchError(
                f"Block {block.describe()} has {len(at)} rows with a label; the manifest says "
                f"{expected}. The data changed after the scan.\nHint: rescan (remove the cached "
                "manifest) and restart.")
        rows = table if mask is None else table.take(at)
        rows = rows.append_column(TRACE_COLUMNS[0], pa.array(np.full(len(at), index, dtype=np.int64)))
        rows = rows.append_column(TRACE_COLUMNS[1], pa.array(at.astype(np.int64)))
        tables.append(rows)
        where.append(bucket_of(offset, len(at), k))
    if not tables:
        tables, where = [pa.table({})], [np.zeros(0, dtype=np.int64)]
    rows = files.write_run(tag, name, tables, np.concatenate(where))
    del tables, opened
    pa.default_memory_pool().release_unused()  # back to the system: the worker must not pause
    return rows


def gather(files: BucketSet, tag: str, runs: list[str], b0: int, b1: int,
           sizes: list[int]) -> int:
    """Write buckets ``b0 .. b1 - 1`` from their ranges of every run (on a worker).

    Returns
    -------
    int
        The rows written.

    Raises
    ------
    FileNotFoundError
        A run is not seen from this worker (workers that share no file system).
    """
    pieces = [files.read_run(tag, name, b0, b1) for name in runs]
    total = 0
    for b in range(b0, b1):
        tables = [t.slice(int(off[b - b0]), int(off[b - b0 + 1] - off[b - b0]))
                  for t, off in pieces]
        rows = sum(t.num_rows for t in tables)
        if rows != sizes[b - b0]:
            raise ManifestMismatchError(
                f"Bucket {b} of {files.path} got {rows} rows; its blocks say {sizes[b - b0]}. "
                "The data changed while the buckets were made.\nHint: rescan and restart.")
        files.write_bucket(b, [t for t in tables if t.num_rows] or tables[:1])
        total += rows
    del pieces, tables
    pa.default_memory_pool().release_unused()  # back to the system: the worker must not pause
    return total
