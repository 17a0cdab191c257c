"""The buckets of a data set built on the cluster from its parse cache, and kept through growth.

The global order (:mod:`daskfeed.batches._order`) reads an epoch as whole buckets, each a
random sample of the whole data set; this module makes their files
(:class:`~daskfeed.cache._buckets.BucketSet`) as *generations*, each the rows of some parts of
the parse cache dealt into the data set's ``K`` buckets. A first build deals every part; data
that grew (``K`` kept: a power of two, it changes only when the rows double) deals only its
new parts, into a new generation. Dealing is an external shuffle of the parse cache (Arrow,
never the CSV again):

1. *deal* (:func:`deal`, one task per group of consecutive blocks of about ``run_rows`` rows):
   each block's rows with a label, in their stored order, go to buckets ``(i + o_j) mod K``;
   the group's rows are written as one *run*, sorted by bucket (stable).
2. *merge* (while there are more than ``FAN_IN`` runs): ``FAN_IN`` consecutive runs become one,
   bucket range by bucket range (``run_rows`` rows at a time). Without it each gather would read
   a range of every run: ``(N / run_rows)**2`` reads in all, hours at 100 GB on a small budget;
   with it, each level reads and writes the runs once, with ``FAN_IN`` reads per range.
3. *gather* (:func:`gather`, one task per range of buckets of about ``run_rows`` rows): the
   range of every run, in canonical order (block id, then row), one file per bucket.

Generations are bounded (:func:`merge_plan`): after a growth, the youngest generations are
merged into one (:func:`merge_buckets`, bucket range by bucket range) while the one before
them is no more than twice their rows, and always down to ``MAX_GENERATIONS``; so a window
reads at most ``MAX_GENERATIONS`` files per bucket, and a row is rewritten about
``log2(growths)`` times over the data set's life, not once per growth. A generation holding a
part whose files changed or went is not used; its other parts are dealt again with the new
ones. Every bucket holds the same rows in the same order whatever generations made it, so a
grown data set's order is the order a fresh build of it has.

A task holds its own rows (a run's, a range of buckets'), never the data set's: memory and
time per task are bounded by ``run_rows``, whatever the number of blocks, files or parts.
"""

from __future__ import annotations

import contextlib
import errno
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from dask.utils import format_bytes

from daskfeed.batches._bucket_files import Buckets, Missed, disk_shared
from daskfeed.batches._here import can_take_aside
from daskfeed.batches._memory_buckets import memory_buckets
from daskfeed.batches._order import (
    block_offsets,
    bucket_count,
    bucket_of,
    bucket_sizes,
)
from daskfeed.cache import (
    TRACE_COLUMNS,
    BucketSet,
    digest,
    estimate_bytes,
    generation_name,
    stored_rows,
)
from daskfeed.cluster import explain, result_unless_paused
from daskfeed.core import ManifestMismatchError
from daskfeed.manifest import labelled

if TYPE_CHECKING:
    from distributed import Client, Future

    from daskfeed.batches._bucket_files import Abandon
    from daskfeed.batches._prepare import Prepared
    from daskfeed.cache import BlockCache
    from daskfeed.manifest import Encoding
    from daskfeed.reading import Block, ReadOptions

RUN_ROWS = 1 << 19  # rows a build task holds, at most (a run; a range of buckets)
MIN_RUN_ROWS = 1 << 14
ROOM_MARGIN = 1 << 30  # disk kept free beyond the build's estimate
FAN_IN = 32  # runs merged into one while there are more: a gather reads at most this many
TASK_COPIES = 6  # a task's peak over its rows' CSV bytes (Arrow, its sorted copy, the file)
MAX_GENERATIONS = 8  # generations a data set's buckets are read from, at most
# a build goes on in the background only with this many times the room it needs free: on a
# tighter disk it is built first, so that one filled meanwhile falls back to windows of blocks
BACKGROUND_ROOM = 2


@dataclass
class _Generation:
    """A generation as the trainer sees it: its parts, their blocks, its buckets' rows."""

    name: str
    parts: frozenset[str]
    mask: np.ndarray  # bool over the data set's blocks
    sizes: np.ndarray
    blocks: dict[str, int]  # each part's blocks (ids salt(part) + 0 .. n - 1)
    build: str = ""  # "": not built (yet)

    @property
    def rows(self) -> int:
        return int(self.sizes.sum())


def bucket_set(data: Prepared, *, run_rows: int | None = None,
               background: bool = False, in_memory: bool = False) -> Buckets | None:
    """The buckets of ``data`` (dealt on its cluster where missing); None where they cannot be.

    Parameters
    ----------
    data
        Prepared data with a parse cache.
    run_rows
        Rows per build task (see the module docstring); default: what a worker's memory limit
        holds (:func:`task_rows`).
    background
        Deal and merge in a thread of this process, the files given to
        :meth:`Buckets.wait` once written, so that what needs only the buckets' sizes (an
        epoch's plan, a model, ``fit`` tracing its step) goes on meanwhile. For workers that
        share this machine's disk (the fallback for workers that do not see one another's files
        is never needed), and only with ``BACKGROUND_ROOM`` times the room the build needs free.
    in_memory
        The trainer may hold the buckets (it reads the parse cache's files): where they fit
        (:func:`~daskfeed.batches._memory_buckets.memory_buckets`), none is written.

    Returns
    -------
    Buckets or None
        None (with a warning) when the disk has no room, or, built here and now, when the
        workers cannot see one another's files or the disk filled up as they were written: the
        global order then falls back to windows of blocks. Built in the background, those two
        are an error raised by :meth:`Buckets.wait` (the epoch was planned on the buckets).
    """
    cache = data.cache
    assert cache is not None
    counts = np.asarray(data.manifest.counts, dtype=np.int64)
    n = len(counts)
    k = bucket_count(int(counts.sum()), int(data.manifest.nbytes))
    ids = cache.block_ids(n)
    offsets = block_offsets(ids, k)
    sizes = bucket_sizes(counts, offsets, k)
    if in_memory:  # taken in a thread while the model is built; the first batch waits for them
        memory = memory_buckets(data, counts, ids, offsets, k)  # as for files dealt meanwhile
        if memory is not None and can_take_aside(data.client, memory.estimate):
            memory.aside = data.client  # (by an idle worker: see _held_aside)
        if memory is not None:
            return Buckets(None, sizes, build=memory.taken, held=memory.estimate)
    enc = data.encoding
    parts = _part_ranges(cache, n, data.manifest.fingerprint)
    key = BucketSet.key_of(root=cache.root if not cache.entries else None, buckets=k,
                           label=enc.label, classes=list(enc.label_classes))
    files = BucketSet(cache.root, key, k, compression=cache.compression)
    client = data.client

    planner = Planner(counts, offsets, k, parts)
    found = client.submit(files.found, key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
    kept, new, plan = planner.plan(found)
    if new is None and not plan:
        view = files.view([g.name for g in kept], [g.build for g in kept])
        client.submit(view.use, key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
        return Buckets(view, sizes)
    share = max(new.rows if new is not None else 0,
                sum(g.rows for g in [*kept, *([new] if new else [])][-plan:]) if plan else 0)
    # (the text's bytes, decompressed: what merged runs keep plain at most)
    need = build_room(estimate_bytes(data.source, cache.compression),
                      estimate_bytes(data.source, None), int(counts.sum()), share)
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
    step_rows = run_rows

    def build(abandon: Abandon) -> tuple[BucketSet, str] | Missed:
        """Deal and merge what the plan says (until ``abandon()`` says to stop).

        The view of the generations and the work, in words; or why they could not be written.
        """
        nonlocal kept
        work = []
        building: list[_Generation] = []  # (removed if the disk fills up)
        try:
            if new is not None:
                building.append(new)
                new.build = _deal_generation(data, files.generation(new.name), new, ids, offsets,
                                             step_rows, abandon)
                work.append(f"{new.rows:,} rows of {len(new.parts)} part(s) dealt"
                            + (f" into the {len(kept)} generation(s) kept" if kept else ""))
                kept.append(new)
            if plan:
                young = kept[-plan:]
                merged = planner.generation(frozenset().union(*(g.parts for g in young)))
                building.append(merged)
                merged.build = _merge_generations(client, files, young, merged, step_rows,
                                                  abandon)
                work.append(f"the {plan} youngest generations merged ({merged.rows:,} rows)")
                kept = [*kept[:-plan], merged]
        except FileNotFoundError as err:  # a run written on one machine, looked for on another ...
            found = client.submit(files.found,
                                  key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
            done = planner.cover(found)
            if frozenset().union(*(g.parts for g in done)) == frozenset(parts):
                # ... or removed by another trainer that completed the same generation first
                return files.view([g.name for g in done], [g.build for g in done]), "; ".join(work)
            return Missed(f"could not deal the rows into buckets ({err}): the workers do not "
                           "share the parse cache's directory",
                           "give every worker the same cache directory (--cache DIR on a shared "
                           "volume)")
        except OSError as err:  # the disk filled up while the buckets were written
            if err.errno != errno.ENOSPC:
                raise
            for gen in building:  # on every worker: a run is written where its task ran
                with contextlib.suppress(Exception):
                    client.run(files.generation(gen.name).drop_unsealed)
            return Missed(f"the disk filled up while the global order's buckets were written beside "
                           f"the parse cache ({err}; about {format_bytes(need)} needed, "
                           f"{format_bytes(free)} free when it began). Their files are removed",
                           "free disk room there, or give the cache another place (--cache DIR)")
        view = files.view([g.name for g in kept], [g.build for g in kept])
        client.submit(_use_and_sweep, view, sorted(parts),
                      key=f"daskfeed-buckets-check-{uuid.uuid4().hex}").result()
        return view, "; ".join(work)

    if background and free >= BACKGROUND_ROOM * need and disk_shared(client, cache.root):
        return Buckets(None, sizes, build=build)
    t0 = time.perf_counter()
    made = build(lambda: None)
    if isinstance(made, Missed):  # the epoch is not planned yet: windows of blocks instead
        warnings.warn(f"daskfeed: {made.reason}; rows are shuffled within windows of blocks instead, "
                      f"not in one global order.\nHint: {made.hint}.", stacklevel=2)
        return None
    return Buckets(made[0], sizes, time.perf_counter() - t0, made[1])


def merge_plan(rows: list[int]) -> int:
    """How many of the youngest generations to merge into one (0: none), oldest first in ``rows``.

    The youngest are merged while the generation before them holds no more than twice their
    rows (generations so shrink at least twofold from the oldest: about ``log2`` of the
    growths), and always down to ``MAX_GENERATIONS``.
    """
    take, held = 1, rows[-1] if rows else 0
    least = len(rows) - MAX_GENERATIONS + 1
    while take < len(rows) and (take < least or rows[-take - 1] <= 2 * held):
        take += 1
        held += rows[-take]
    return take if take > 1 else 0


def _part_ranges(cache: BlockCache, blocks: int, fingerprint: str) -> dict[str, tuple[int, int]]:
    """Each cache entry's blocks, ``[lo, hi)``; without entries, all of them.

    An entry's blocks are consecutive; a part that grew has several entries, its new files'
    dealt alone (:mod:`daskfeed.cache._lineage`).
    """
    if not cache.entries:
        return {f"whole:{fingerprint}": (0, blocks)}
    ends = [*cache.starts[1:], blocks]
    return {p: (int(lo), int(hi)) for p, lo, hi in zip(cache.entries, cache.starts, ends, strict=True)}


class Planner:
    """Which generations make a data set's buckets, and what to deal or merge (on the trainer).

    Pure: from the blocks' rows and offsets, ``K``, the parts' block ranges and the complete
    generations found on disk. Each generation considered costs a mask of the blocks (a byte
    each) and its buckets' sizes from its own blocks (``O(its blocks + K)``); the generations
    found hold each block once at most, so a plan costs about two passes over the blocks
    (those found, then the new one and the merged one).

    Parameters
    ----------
    counts, offsets
        Each block's rows with a label and :func:`~daskfeed.batches._order.block_offsets`.
    buckets
        ``K``.
    parts
        Each part's blocks, ``[lo, hi)`` (:func:`_part_ranges`).
    """

    def __init__(self, counts: np.ndarray, offsets: np.ndarray, buckets: int,
                 parts: dict[str, tuple[int, int]]) -> None:
        self.counts, self.offsets, self.buckets, self.parts = counts, offsets, buckets, parts

    def generation(self, names: frozenset[str]) -> _Generation:
        """The generation holding parts ``names`` (not built)."""
        mask = np.zeros(len(self.counts), dtype=bool)
        for p in names:
            lo, hi = self.parts[p]
            mask[lo:hi] = True
        sizes = bucket_sizes(self.counts[mask], self.offsets[mask], self.buckets)  # its blocks only
        blocks = {p: self.parts[p][1] - self.parts[p][0] for p in names}
        return _Generation(generation_name(sorted(names)), names, mask, sizes, blocks)

    def cover(self, found: list[dict[str, Any]]) -> list[_Generation]:
        """The complete generations to keep, largest first (oldest first in a merge plan).

        Only generations of the data set's parts whose buckets hold the rows their blocks say,
        no part twice.
        """
        usable = []
        for meta in found:
            names = frozenset(meta["parts"])
            if not names or not names <= self.parts.keys():
                continue
            g = self.generation(names)
            if digest(g.sizes) == meta["sizes"]:
                g.build = meta["build"]
                usable.append(g)
        usable.sort(key=lambda g: (-g.rows, g.name))
        kept: list[_Generation] = []
        covered: set[str] = set()
        for g in usable:
            if not g.parts & covered:
                kept.append(g)
                covered |= g.parts
        return kept

    def plan(self, found: list[dict[str, Any]]) -> tuple[list[_Generation], _Generation | None, int]:
        """The generations kept, the new one to deal (None: none) and how many to merge after."""
        kept = self.cover(found)
        missing = frozenset(self.parts) - frozenset().union(*(g.parts for g in kept))
        new = self.generation(missing) if missing else None
        rows = [g.rows for g in kept] + ([new.rows] if new is not None else [])
        return kept, new, merge_plan(rows)


def _use_and_sweep(view: BucketSet, parts: list[str]) -> None:
    view.use()
    view.sweep(parts)


def build_room(cache_bytes: int, csv_bytes: int, rows: int, share: int) -> int:
    """Disk a build of ``share`` of the data's ``rows`` rows needs at its peak (generous).

    Two copies of its rows side by side: the runs beside the runs merged from them (or beside
    the buckets gathered from those), each a copy of the parse cache's columns with the trace
    columns (16 bytes a row). Merged runs keep text plain, not dictionary-encoded: at most
    the CSV's bytes more. Plus ``ROOM_MARGIN``.

    Parameters
    ----------
    cache_bytes, csv_bytes
        The whole data's parse cache (its estimate) and CSV text (decompressed).
    rows
        The whole data's rows with a label.
    share
        Rows the build deals or merges.
    """
    copy = cache_bytes + 16 * rows
    return int((2 * copy + csv_bytes) * share / max(rows, 1)) + ROOM_MARGIN


def task_rows(client: Client, csv_bytes: int, rows: int) -> int:
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


def _deal_generation(data: Prepared, files: BucketSet, gen: _Generation, ids: np.ndarray,
                     offsets: np.ndarray, run_rows: int, abandon: Abandon | None = None) -> str:
    """Deal ``gen``'s blocks into its files (deal, merge the runs, gather); its build's tag."""
    client, source, cache = data.client, data.source, data.cache
    counts = np.where(gen.mask, np.asarray(data.manifest.counts, dtype=np.int64), 0)
    # the same tasks (keys) and files for every trainer building this generation on one
    # scheduler: the scheduler runs them once; a build cut short writes the same files again
    tag = gen.name[:12]
    groups = _groups(counts, run_rows)
    runs = [f"r{n:06d}" for n in range(len(groups))]
    deals = [client.submit(deal, files, tag, name,
                           [(int(i), source.blocks[i], int(offsets[i]), int(counts[i]),
                             int(ids[i])) for i in g],
                           source.options, cache, data.encoding,
                           key=f"daskfeed-buckets-deal-{files.key}-{n}", retries=1)
             for n, (name, g) in enumerate(zip(runs, groups, strict=True))]
    _gather_all(client, deals, "the rows dealt into buckets", abandon)
    level = 0
    while len(runs) > FAN_IN:  # fewer, longer runs: every gather reads a range of each run
        groups_of = [runs[i:i + FAN_IN] for i in range(0, len(runs), FAN_IN)]
        merged = [f"m{level}-{n:06d}" for n in range(len(groups_of))]
        merges = [client.submit(_merge, files, tag, group, name, run_rows,
                                key=f"daskfeed-buckets-merge-{files.key}-{level}-{n}", retries=1)
                  for n, (group, name) in enumerate(zip(groups_of, merged, strict=True))]
        _gather_all(client, merges, "the runs of buckets merged", abandon)
        runs, level = merged, level + 1
    gathers = [client.submit(gather, files, tag, runs, b0, b1, [int(x) for x in gen.sizes[b0:b1]],
                             key=f"daskfeed-buckets-gather-{files.key}-{b0}", retries=1)
               for b0, b1 in _ranges(gen.sizes, run_rows)]
    _gather_all(client, gathers, "the buckets gathered from their runs", abandon)
    build = uuid.uuid4().hex[:12]  # this build's files (window task keys change with it)
    client.submit(files.seal, digest(gen.sizes), gen.blocks, gen.rows, tag, build,
                  key=f"daskfeed-buckets-seal-{build}").result()
    return build


def _merge_generations(client: Client, files: BucketSet, young: list[_Generation],
                       merged: _Generation, run_rows: int, abandon: Abandon | None = None) -> str:
    """Write ``merged`` from the generations ``young``, bucket range by bucket range."""
    source = files.view([g.name for g in young], [g.build for g in young])
    target = files.generation(merged.name)
    tasks = [client.submit(merge_buckets, source, target, b0, b1,
                           [int(x) for x in merged.sizes[b0:b1]],
                           key=f"daskfeed-buckets-join-{target.key}-{b0}", retries=1)
             for b0, b1 in _ranges(merged.sizes, run_rows)]
    _gather_all(client, tasks, "the youngest generations of buckets merged", abandon)
    build = uuid.uuid4().hex[:12]
    client.submit(target.seal, digest(merged.sizes), merged.blocks, merged.rows, "", build,
                  key=f"daskfeed-buckets-seal-{build}").result()
    return build


def _ranges(sizes: np.ndarray, run_rows: int) -> list[tuple[int, int]]:
    """Ranges of buckets of about ``run_rows`` rows (one task each)."""
    k = len(sizes)
    per = max(1, int(run_rows * k // max(int(sizes.sum()), 1)))
    return [(b, min(b + per, k)) for b in range(0, k, per)]


def _gather_all(client: Client, futures: list[Future[Any]], what: str,
                abandon: Abandon | None = None) -> None:
    """Wait for every future (its error raised, explained); released whatever happened.

    ``abandon()`` returns an error to stop with (the reader was closed), or None.
    """
    try:
        for f in futures:  # a worker paused for good is a BudgetError, not a wait without end
            result_unless_paused(f, what=what, abandon=abandon)
    except Exception as err:
        # a run looked for on another machine, or a full disk: the caller falls back to windows
        if isinstance(err, FileNotFoundError) or getattr(err, "errno", None) == errno.ENOSPC:
            raise
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


def deal(files: BucketSet, tag: str, name: str, blocks: list[tuple[int, Block, int, int, int]],
         options: ReadOptions, cache: BlockCache, encoding: Encoding) -> int:
    """Deal a group of blocks' rows into buckets: one run, sorted by bucket (on a worker).

    Parameters
    ----------
    files, tag, name
        The generation, its build and the run's name.
    blocks
        ``(index, block, offset, rows, id)``: each block, its
        :func:`~daskfeed.batches._order.block_offsets` offset, its rows with a label (the
        manifest's count, checked) and its id (uint64, kept as int64 in ``__block``).
    options, cache, encoding
        How blocks are read (the parse cache; parsed where a block is missing) and the label.

    Returns
    -------
    int
        The run's rows.
    """
    k = files.buckets
    # the whole cache files the blocks are in (a group's blocks are consecutive: a few files;
    # views of their memory maps when uncompressed), or a block's own rows (in pieces, or
    # parsed here); each table's first row among them, by its key
    tables: list[pa.Table] = []
    starts: dict[object, int] = {}
    picks, ids, places = [], [], []  # per row dealt: its row in the tables, its block, its place
    dealt_at, dealt = [], []  # per block: its offset, its rows dealt
    base = 0
    opened: dict[str, pa.Table] = {}  # whole cache files, views of their memory maps
    for index, block, offset, expected, block_id in blocks:
        key: object
        found = cache.locate(index, None, opened)
        if found is None:  # not cached (or damaged): parsed here, and cached
            table, order = stored_rows(index, block, options, cache, files=opened)
            key, first = ("block", index), 0
        else:
            key, table, first, order = found
        if key not in starts:
            starts[key] = base
            tables.append(table)
            base += table.num_rows
        mine = table.slice(first, len(order))
        if mine.num_rows != len(order):  # a cache file shorter than its marker says
            raise ManifestMismatchError(
                f"Block {block.describe()} has {mine.num_rows} rows in its parse cache file; its "
                f"marker says {len(order)}.\nHint: remove the parse cache (daskfeed cache clear) "
                "and restart.")
        mask = labelled(mine, encoding) if encoding.label in mine.column_names else None
        # the stored places of the rows with a label (the rows dealt, in that order)
        at = np.arange(len(order), dtype=np.int64) if mask is None else np.flatnonzero(mask[order])
        if len(at) != expected:
            raise ManifestMismatchError(
                f"Block {block.describe()} has {len(at)} rows with a label; the manifest says "
                f"{expected}. The data changed after the scan.\nHint: rescan (remove the cached "
                "manifest) and restart.")
        picks.append(starts[key] + first + order[at])
        ids.append(np.full(len(at), block_id, dtype=np.uint64).view(np.int64))
        places.append(at)
        dealt_at.append(offset)
        dealt.append(len(at))
    if not tables:
        tables = [pa.table({})]
    # one take: every block's rows in their stored order, sorted by bucket (the rows of a bucket
    # in canonical order within the run), traced to their block and row
    where = bucket_of(np.asarray(dealt_at, dtype=np.int64), np.asarray(dealt, dtype=np.int64), k)
    rows = files.write_run(tag, name, tables, _joined(picks), where,
                           {TRACE_COLUMNS[0]: _joined(ids), TRACE_COLUMNS[1]: _joined(places)})
    del tables, opened
    pa.default_memory_pool().release_unused()  # back to the system: the worker must not pause
    return rows


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """Arrays one after another (int64; none: empty)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


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
        tables = [t for t in tables if t.num_rows] or tables[:1]
        files.write_bucket(b, tables)  # in canonical order: block id, then row
        total += rows
    del pieces, tables
    pa.default_memory_pool().release_unused()  # back to the system: the worker must not pause
    return total


def merge_buckets(source: BucketSet, target: BucketSet, b0: int, b1: int, sizes: list[int]) -> int:
    """Write buckets ``b0 .. b1 - 1`` of generation ``target`` from a view of several (on a worker).

    Each bucket's rows of every generation, in canonical order.

    Returns
    -------
    int
        The rows written.
    """
    target.make_dirs()
    total = 0
    for b in range(b0, b1):
        table = source.read_bucket(b)
        if table.num_rows != sizes[b - b0]:
            raise ManifestMismatchError(
                f"Bucket {b} of {source.path} holds {table.num_rows} rows in its generations "
                f"{', '.join(source.generations)}; their blocks say {sizes[b - b0]}.\nHint: run "
                "again (the buckets are built again).")
        target.write_bucket(b, [table])
        total += table.num_rows
    pa.default_memory_pool().release_unused()
    return total

