"""One scan task on a worker: parse its blocks once, their facts and statistics, the parse cache.

Each table parsed is reported to the trainer's watchdog (:func:`report`, events on the scan's
topic) and written to the parse cache; the statistics of the task's tables are merged here,
the facts of each block travel back (see :mod:`daskfeed.scanning._scan`), with where its rows
are in its file (:func:`line_facts`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed import get_worker

from daskfeed.cache import BlockCache, compact
from daskfeed.cluster import trim_heap
from daskfeed.core import DataError
from daskfeed.manifest import pack_row_lines
from daskfeed.reading import (
    Block,
    ReadOptions,
    RowLines,
    SharedParse,
    SmallFiles,
    Source,
    iter_tables,
)
from daskfeed.scanning._refusals import where
from daskfeed.scanning._schema import BlockFacts, Stats
from daskfeed.scanning._stats import StatsAccumulator, merge_facts, parts_facts, table_facts

if TYPE_CHECKING:
    from daskfeed.cache import PartWriters

MAX_REJECTS_KEPT = 1000  # quarantined lines kept per block (all are counted)
MAX_REJECT_CHARS = 4096  # characters kept of one quarantined line
REPORT_EVERY = 0.5  # seconds between progress events of one scan task
_pending: dict[tuple[str, int], list[float]] = {}  # (topic, task) -> [rows, bytes, last time]


def report(topic: str | None, task: int, block: int, rows: int = 0, nbytes: int = 0,
           *, flush: bool = False) -> None:
    """Tell the trainer's scan watchdog that scan task ``task`` is at block ``block`` (on a worker).

    Rows and bytes parsed accumulate; at most one event per ``REPORT_EVERY`` seconds per task,
    and one with the rest when ``flush`` (the task's end), so the totals add up.
    """
    if topic is None:
        return
    acc = _pending.setdefault((topic, task), [0, 0, 0.0])
    acc[0] += rows
    acc[1] += nbytes
    now = time.monotonic()
    if now - acc[2] < REPORT_EVERY and not (flush and (acc[0] or acc[1])):
        return
    try:
        worker = get_worker()
    except ValueError:  # not running on a dask worker (called directly)
        return
    worker.log_event(topic, {"task": task, "block": block, "rows": int(acc[0]),
                             "bytes": int(acc[1])})
    acc[:] = [0, 0, now]


def scan_blocks(items: list[tuple[int, Block]], options: ReadOptions, label: str,
                cache: BlockCache | None = None, topic: str | None = None,
                sizes: list[int] | None = None) -> dict[str, Any]:
    """Scan several blocks in one scan task (runs on a worker): their facts and merged statistics.

    Parameters
    ----------
    items
        ``(block index, block)`` of each block, in order.
    options
        How the files are read.
    label
        The label column.
    cache
        The parse cache: the blocks' tables go there, unless every one of them is cached
        already.
    topic
        Where progress is reported (:func:`report`); None: nowhere.
    sizes
        Input bytes of each block (reported once it is read).

    Returns
    -------
    dict
        ``{"facts": [facts of each block], "stats": merged statistics of all of them}``.
    """
    out = scan_stretches([items], options, label, cache, topic, [sizes or [0] * len(items)])
    return {"facts": out["facts"][0], "stats": out["stats"][0]}


def scan_stretches(stretches: list[list[tuple[int, Block]]], options: ReadOptions, label: str,
                   cache: BlockCache | None = None, topic: str | None = None,
                   sizes: list[list[int]] | None = None) -> dict[str, Any]:
    """Scan stretches of blocks in one scan task (runs on a worker): facts and statistics per stretch.

    A stretch (a part of the files, or a stretch of a large one) is scanned as a task of its own
    would scan it — small files parsed together within it, never across two stretches — so its
    statistics do not depend on the stretches scanned beside it.

    Parameters
    ----------
    stretches
        Each stretch's ``(block index, block)``, in order.
    options, label, cache, topic
        As :func:`scan_blocks` takes them.
    sizes
        Input bytes of each block of each stretch.

    Returns
    -------
    dict
        ``{"facts": [[facts of each block] per stretch], "stats": [statistics per stretch]}``.
    """
    items = [item for stretch in stretches for item in stretch]
    writer: PartWriters | None = None
    if cache is not None and not all(cache.has(i) for i, _ in items):
        writer = cache.writer(items[0][0])
    task = items[0][0]
    sizes = sizes or [[0] * len(stretch) for stretch in stretches]
    facts, stats = [], []
    try:
        for stretch, stretch_sizes in zip(stretches, sizes, strict=True):
            found, merged = _scan_stretch(stretch, options, label, writer, topic, task, stretch_sizes)
            facts.append(shared_facts(found))
            stats.append(merged)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        writer.commit()
    report(topic, task, items[-1][0], flush=True)
    _pending.pop((topic or "", task), None)
    trim_heap()  # what the task freed in the heap's middle, back to the system (a local worker)
    return {"facts": facts, "stats": stats}


def _scan_stretch(items: list[tuple[int, Block]], options: ReadOptions, label: str,
                  writer: PartWriters | None, topic: str | None, task: int,
                  sizes: list[int]) -> tuple[list[BlockFacts], Stats]:
    """One stretch of a scan task: the facts of its blocks and their merged statistics."""
    acc = StatsAccumulator(label)
    files = SmallFiles(items, options)  # small files parsed up to SHARED_FILES per pyarrow call
    sampled: set[str] = set()  # text columns with samples in an earlier run of this stretch
    summaries: list[BlockFacts] = []
    while len(summaries) < len(items):
        at = len(summaries)
        runs = files.runs(at)
        if not runs:
            summaries.append(_scan_block(*items[at], options, label, writer, acc, topic, task,
                                         sizes[at]))
        for run in runs:
            at = len(summaries)
            summaries += _scan_shared(run, label, writer, acc, topic, task,
                                   sum(sizes[at : at + len(run.indices)]), sampled)
    return summaries, acc.flush()


def shared_facts(facts: list[BlockFacts]) -> list[BlockFacts]:
    """Blocks with the same columns (and kinds) share one list (and dict): pickled once.

    Thousands of small files of one header send their column names once per scan task, not
    once per file (and a record read back from JSON holds them once). Nothing changes the facts
    in place after this.
    """
    seen: dict[tuple[object, ...], Any] = {}
    for f in facts:
        f["columns"] = seen.setdefault(("columns", *f["columns"]), f["columns"])
        f["kinds"] = seen.setdefault(("kinds", *f["kinds"].items()), f["kinds"])
    return facts


def _scan_shared(run: SharedParse, label: str, writer: PartWriters | None, acc: StatsAccumulator,
                 topic: str | None, task: int, nbytes: int, sampled: set[str]) -> list[BlockFacts]:
    """The facts of the blocks of a run of small files parsed together (see :func:`_scan_block`).

    Their rows go to ``acc`` and ``writer`` as one table; text columns are sampled in the
    first block that shows text in them (``sampled``: those sampled before).
    """
    report(topic, task, run.indices[0])
    coded = None
    if writer is not None:  # the cache's form, made once: the statistics count text by its codes
        coded = compact(run.table)
        writer.add_parts(list(zip(run.indices, np.diff(run.bounds).tolist(), strict=True)), coded)
    acc.add(run.table, coded, run.bounds)  # (each file's moments its own: a segment each)
    facts = parts_facts(run.table, run.bounds, label, run.counts, sampled)
    for f, breaks in zip(facts, run.breaks, strict=True):
        f["bad_lines"] = 0  # (a run is read only where a bad line is an error)
        f["breaks"] = breaks  # (one row a line: a file of another shape is read alone)
    report(topic, task, run.indices[-1], run.table.num_rows, nbytes=nbytes)
    return facts


def _scan_block(index: int, block: Block, options: ReadOptions, label: str,
                writer: PartWriters | None, acc: StatsAccumulator, topic: str | None, task: int,
                nbytes: int) -> BlockFacts:
    """Parse block ``index`` once: its facts and bad lines (see :func:`scan_blocks`).

    Its tables go to ``acc`` (the scan task's statistics) and to ``writer`` (the scan task's
    parse cache writer, or None).
    """
    rejects: list[str] = []
    lines = RowLines()
    summary: BlockFacts | None = None
    report(topic, task, index)  # a read that hangs here is named by the watchdog
    if writer is not None:
        writer.begin(index)  # cached even if it has no rows
    for table in iter_tables(block, options, rejects, lines=lines):
        coded = None
        if writer is not None:  # the cache's form, made once: the statistics count text by its codes
            coded = compact(table)
            writer.add(index, coded)
        summary = merge_facts(summary, table_facts(table, label))
        acc.add(table, coded)
        report(topic, task, index, table.num_rows)
    report(topic, task, index, nbytes=nbytes)  # the block's input bytes, once read
    if summary is None:  # an empty file
        summary = {"rows": 0, "columns": [], "kinds": {}, "missing": {}, "label_rows": 0, "samples": {}}
    summary["bad_lines"] = len(rejects)
    summary.update(line_facts(lines, summary["rows"]))
    if options.bad_lines == "quarantine" and rejects:  # bounded: a pathological file stays cheap
        summary["rejects"] = [line[:MAX_REJECT_CHARS] for line in rejects[:MAX_REJECTS_KEPT]]
    if rejects and len(rejects) > max(100, summary["rows"]):
        raise DataError(
            f"Most lines of {block.describe()} are malformed: {len(rejects):,} lines do not have "
            f"the header's {len(summary['columns']) or 'number of'} fields, {summary['rows']:,} do. "
            f"Received lines such as {rejects[0][:120]!r}.\nHint: check the delimiter (sep=) and "
            "the header of this file."
        )
    return summary


def line_facts(lines: RowLines, rows: int) -> BlockFacts:
    """Where a block's rows are in its file: the facts the manifest's lines are made of.

    Parameters
    ----------
    lines
        As :func:`~daskfeed.reading.iter_tables` counted them.
    rows
        The rows the block parsed (every one, with a label or not).

    Returns
    -------
    dict
        ``{"breaks": line breaks in the block's own text}`` (None: not text lines, e.g.
        Parquet), and ``"row_lines"`` only when its rows are not one per line: the line of each
        row from the block's first line, packed (:func:`~daskfeed.manifest.pack_row_lines`),
        or None when they could not be found.
    """
    if lines.breaks is None:
        return {"breaks": None}
    if not lines.known or lines.rows != rows:
        return {"breaks": lines.breaks, "row_lines": None}
    offsets = lines.offsets()
    return {"breaks": lines.breaks} if offsets is None else {
        "breaks": lines.breaks, "row_lines": pack_row_lines(offsets)}


def quarantined(src: Source, facts: list[BlockFacts], bad_lines: int,
                notes: list[str]) -> list[dict[str, str]]:
    """The quarantined lines with their block (and a line per block for those not kept).

    A note on the malformed lines skipped goes to ``notes``.
    """
    rejects = [{"where": src.blocks[i].describe(), "line": line}
               for i, f in enumerate(facts) for line in f.get("rejects", ())]
    kept = [(i, f["bad_lines"] - len(f.get("rejects", ()))) for i, f in enumerate(facts) if f.get("rejects")]
    rejects += [{"where": src.blocks[i].describe(),
                 "line": f"[{n:,} more malformed lines of this block not kept (first "
                         f"{MAX_REJECTS_KEPT:,} are)]"} for i, n in kept if n > 0]
    if bad_lines:
        first = next(i for i, f in enumerate(facts) if f.get("bad_lines"))
        notes.append(
            f"{bad_lines:,} malformed line(s) skipped (bad_lines={src.options.bad_lines!r}), first in "
            f"{where(src, first)}; counted in manifest.bad_lines"
            f"{' and kept in manifest.rejects' if rejects else ''}."
        )
    return rejects
