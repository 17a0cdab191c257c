"""Scan: ONE pass over every block on the cluster → a :class:`~daskfeed.manifest._manifest.Manifest`.

Scan tasks (a few blocks each) parse their blocks once on the workers, report progress to the
trainer's watchdog, write the parse cache, and return small facts per block; statistics are
merged in a tree on the cluster (:mod:`daskfeed.scanning._stats`). The tasks are cut by
:mod:`daskfeed.scanning._plan`; the trainer reconciles the kinds and builds the manifest
(:mod:`daskfeed.scanning._build`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dask import delayed
from distributed import Client

from daskfeed.cache import BlockCache, default_root
from daskfeed.cluster import client_context, explain, gathered_map
from daskfeed.core import ManifestMismatchError, SchemaError, config
from daskfeed.manifest import (
    Manifest,
    block_sizes,
    held_out,
    read_reusable,
    scanned_blocks,
    split_settings,
    unknown_column,
)
from daskfeed.reading import Part, Source, SplitError
from daskfeed.scanning._build import build_manifest
from daskfeed.scanning._known import Known
from daskfeed.scanning._plan import ScanKeys, part_tasks, scan_tasks
from daskfeed.scanning._recount import recount
from daskfeed.scanning._schema import (
    BlockFacts,
    Stats,
)
from daskfeed.scanning._stats import (
    merge_stats,
    table_facts,
    table_stats,
)
from daskfeed.scanning._store import PartRecord, ScanStore
from daskfeed.scanning._task import scan_stretches
from daskfeed.scanning._watchdog import ProgressCallback, await_scan

if TYPE_CHECKING:
    import dask.dataframe as dd

    Data = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Source | dd.DataFrame


def scan(
    data: Data,
    *,
    label: str,
    client: Client | None = None,
    vocabulary_size: int | None = None,
    blocksize: int | str | None = None,
    encoding: str = "utf-8",
    dtype: dict[str, str] | None = None,
    storage_options: dict[str, Any] | None = None,
    manifest_path: str | os.PathLike[str] | None = None,
    bad_lines: str = "error",
    parse_cache: BlockCache | None = None,
    timeout: float | str | None = None,
    sep: str | None = None,
    na_values: list[str] | tuple[str, ...] | None = None,
    decimal: str = ".",
    validation_split: float | None = None,
    subset: str | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Scan ``data`` once on the cluster and return its :class:`~daskfeed.Manifest`.

    Parameters
    ----------
    data
        Path, glob, list of paths, URL, :class:`~daskfeed.Source`, or dask DataFrame.
    label
        Name of the label column: numbers, or text (class names, sorted into codes 0..K-1).
    client
        A ``distributed.Client``; by default the current one, else a local cluster is started
        for the scan.
    vocabulary_size
        Most frequent K values kept per string column (default ``daskfeed.vocabulary-size``).
    blocksize, encoding, dtype, storage_options, sep, na_values, decimal, bad_lines
        How the files are read (:class:`~daskfeed.Source`); skipped lines are counted
        in ``Manifest.bad_lines`` (quarantine: their text in ``Manifest.rejects``, not in JSON).
    manifest_path
        A JSON path: a manifest there made for these files with the same settings is returned
        without scanning (its warnings repeated); otherwise the new one is written there.
    parse_cache
        A :class:`~daskfeed.cache.BlockCache` the scan writes every parsed block to.
    timeout
        Seconds without any scan task making progress before ``FeedTimeoutError`` (default
        ``daskfeed.timeout``).
    validation_split, subset, seed
        Scan only the ``subset`` ("training" or "validation") of a split into whole blocks
        (``docs/command-line.md``, "Weights, a validation split, early stopping"); the other
        blocks count 0 rows.
    progress
        Called about every second and at the end with ``(rows, bytes done, bytes in all,
        seconds, finished)``.
    cache
        The old name of ``manifest_path`` (deprecated: everywhere else *cache* is the parse
        cache).

    Returns
    -------
    Manifest

    Raises
    ------
    SchemaError
        When the label is not a column, the data hold no rows, or a column changes type.
    FeedTimeoutError
        When no scan task made progress within ``timeout``.

    Examples
    --------
    >>> m = daskfeed.scan("data/log_quest/**/*.csv", label="cleared")  # doctest: +SKIP
    >>> m.rows, m.columns["level"].mean  # doctest: +SKIP
    """
    if cache is not None:
        warnings.warn("scan(cache=) is now scan(manifest_path=): cache means the parse cache "
                      "everywhere else in daskfeed.", DeprecationWarning, stacklevel=2)
        manifest_path = manifest_path if manifest_path is not None else cache
    src = data if isinstance(data, Source) else Source(
        data, blocksize=blocksize, encoding=encoding, dtype=dtype, storage_options=storage_options,
        bad_lines=bad_lines, sep=sep, na_values=na_values, decimal=decimal)
    return scan_source(src, label=label, client=client,
                       vocabulary_size=config.vocabulary_size(vocabulary_size),
                       timeout=config.timeout(timeout), manifest_path=manifest_path,
                       parse_cache=parse_cache,
                       split=split_settings(validation_split, subset, seed), progress=progress)


def scan_source(src: Source, *, label: str, client: Client | None, vocabulary_size: int,
                timeout: float, split: dict[str, Any] | None = None,
                parse_cache: BlockCache | None = None,
                manifest_path: str | os.PathLike[str] | None = None,
                progress: ProgressCallback | None = None) -> Manifest:
    """:func:`scan` with its settings resolved (no config looked up): what a sequence's data use.

    Parameters
    ----------
    src
        The data.
    label, client, vocabulary_size, timeout, parse_cache, manifest_path, progress
        As :func:`scan` takes them, resolved.
    split
        The split's settings (:func:`~daskfeed.manifest.split_settings`), or None.

    Returns
    -------
    Manifest
    """
    timeout_s = float(timeout)
    reused = _reusable(manifest_path, src, label, vocabulary_size, split)
    if reused is not None:
        return reused
    _check_label(src, label)
    if split is not None:
        split["validation_partitions"] = list(held_out(src, split))
    fingerprint = src.fingerprint()
    store = None
    if parse_cache is not None and src.frame is None:
        store = ScanStore(parse_cache.root or default_root())
        store = store if store.check() else None
    known = Known(store, src, label, split,
                  parse_cache.entries if parse_cache is not None else ())
    manifest = known.unchanged(fingerprint, vocabulary_size)
    if manifest is None:
        t0 = time.perf_counter()
        with client_context(client, dict(src.options.storage_options)) as c:
            facts, stats = _run_scan(src, label, c, fingerprint, parse_cache, timeout_s,
                                     scanned_blocks(src.npartitions, split), progress, known,
                                     vocabulary_size)
        manifest = build_manifest(src, label, facts, stats, vocabulary_size, fingerprint, split)
        manifest.scan_seconds = time.perf_counter() - t0
        manifest.scan_line = known.line(manifest, facts)
        manifest.scanned_parts = None if src.frame is not None else len(known.scanned)
        known.remember(manifest)
    else:  # the last scan's, every file unchanged
        manifest.scanned_parts = 0
    src.use_splits(manifest.splits)  # (kept or reused: its files' blocks where the scan read them)
    if manifest_path is not None:
        manifest.to_json(manifest_path)
    return manifest


def _reusable(path: str | os.PathLike[str] | None, src: Source, label: str, vocabulary_size: int,
              split: dict[str, Any] | None) -> Manifest | None:
    """The manifest at ``path`` when it was made for these files and settings (its notes repeated)."""
    cached = read_reusable(path) if path is not None else None
    if cached is None:
        return None
    try:
        cached.check_settings(src, label=label, vocabulary_size=vocabulary_size, split=split)
    except ManifestMismatchError:
        return None  # stale, or made with other settings: rescan and overwrite
    cached.warn_notes()
    return cached


def _check_label(src: Source, label: str) -> None:
    """Refuse a label that is not a column of the data, naming the columns it might be."""
    header = src.header()
    if label not in header:
        hint = unknown_column(label, header, "label").split("Hint: ")[1]
        sep = _likely_sep(header)
        if sep is not None:
            hint = (f"the header reads as one column, split by {sep!r}: pass --sep {sep!r} "
                    f"(sep={sep!r}); the delimiter now is {src.options.sep!r}.")
        raise SchemaError(
            f"Expected a label column {label!r} in the data. Received: columns "
            f"{header[:20]}{' ...' if len(header) > 20 else ''} in "
            f"{src.files[0].path if src.files else 'the DataFrame'}.\nHint: {hint}"
        )


def _likely_sep(header: list[str]) -> str | None:
    """The delimiter a one-column header seems split by (tab, ';', '|', ','), or None."""
    if len(header) != 1:
        return None
    counts = {sep: header[0].count(sep) for sep in ("\t", ";", "|", ",")}
    best = max(counts, key=lambda sep: counts[sep])
    return best if counts[best] else None


# ----------------------------------------------------------------------------- on the cluster
def _run_scan(src: Source, label: str, client: Client, token: str,
              parse_cache: BlockCache | None, timeout: float, only: list[int],
              progress: ProgressCallback | None, known: Known,
              vocabulary_size: int) -> tuple[list[BlockFacts], Stats]:
    """Facts of every block (those outside ``only``: no rows) and the merged statistics."""
    if src.frame is not None:
        scanned, stats = _scan_frame(src, label, client, only)
        facts = [_unscanned() for _ in range(src.npartitions)]
        for i, f in zip(only, scanned, strict=True):
            facts[i] = f
        return facts, stats
    return _scan_parts(src, label, client, token, parse_cache, timeout, only, progress, known,
                       vocabulary_size)


def _unscanned() -> BlockFacts:
    """The facts of a block outside the scanned part of a split: no rows."""
    return {"rows": 0, "columns": [], "kinds": {}, "missing": {}, "label_rows": 0, "samples": {},
            "unscanned": True}


def _scan_frame(src: Source, label: str, client: Client,
                only: list[int]) -> tuple[list[BlockFacts], Stats]:
    """Facts and merged statistics of the blocks ``only`` of a dask DataFrame."""
    tables = src.partitions()  # Arrow tables, null markers and types as parsed from CSV
    keys = ScanKeys()
    facts = [delayed(table_facts, pure=True)(tables[i], label, dask_key_name=keys.scan(i))
             for i in only]
    level = [delayed(table_stats, pure=True)(tables[i], label, dask_key_name=keys.part("stats", i))
             for i in only]
    depth = 0
    while len(level) > 1:  # tree reduction on the cluster, fan-in 8
        depth += 1
        level = [delayed(merge_stats)(*level[i : i + 8], dask_key_name=keys.merge(depth, i))
                 for i in range(0, len(level), 8)]
    futures = client.compute([*facts, level[0]])
    try:
        results = client.gather(futures)
    finally:
        for f in futures:
            f.release()
    return list(results[:-1]), results[-1]


def _scan_parts(src: Source, label: str, client: Client, token: str,
                parse_cache: BlockCache | None, timeout: float, only: list[int],
                progress: ProgressCallback | None, known: Known,
                vocabulary_size: int) -> tuple[list[BlockFacts], Stats]:
    """Facts of every block and the merged statistics: each part's record, kept or scanned now.

    The parts whose record is not kept are scanned (:func:`_scan_files`) and their records
    kept: a part that grew at its end (files appended to its folder,
    :mod:`daskfeed.cache._lineage`) whose earlier part's record is kept has its new files
    scanned alone, their facts and statistics joined to that record's. Then every part's
    statistics are merged in part order, as a scan of every file merges them (the merge is
    exact: :mod:`daskfeed.scanning._moments`): a data set that grew gets the manifest a full
    scan gives. A text column's top ``vocabulary_size`` that the kept counts do not decide is
    counted again (:func:`~daskfeed.scanning._recount.recount`).
    """
    wanted = set(only)
    parts = src.parts()
    records: list[PartRecord | None] = []
    todo: list[int] = []
    for n, part in enumerate(parts):
        record = known.record(part, _subset(part, wanted))
        records.append(record)
        if record is None:
            todo.append(n)
        else:  # its blocks are read where they were scanned
            src.use_splits(record.get("splits", {}))
    reads, earlier = _what_to_read(src, todo, parse_cache, known, wanted)
    fresh = _scan_files(src, label, client, token, parse_cache, timeout, reads, wanted, progress)
    kept = []
    for n, record in zip(todo, fresh, strict=True):
        records[n] = record = record if n not in earlier else _joined(earlier[n], record)
        kept.append(record)
    known.keep(todo, kept, reads)
    facts = [f for record in records if record is not None for f in record["facts"]]
    stats = merge_stats(*(r["stats"] for r in records if r is not None))
    known.recounted = recount(src, client, [r for r in records if r is not None], stats,
                              vocabulary_size, parse_cache)
    return facts, stats


def _subset(part: Part, wanted: set[int]) -> list[int]:
    """The blocks of ``part`` (numbered within it) that the scan wants (a split's subset)."""
    return [i - part.blocks[0] for i in range(*part.blocks) if i in wanted]


def _what_to_read(src: Source, todo: list[int], cache: BlockCache | None, known: Known,
                  wanted: set[int]) -> tuple[list[Part], dict[int, PartRecord]]:
    """What to read of each part in ``todo``, and the kept records of the parts some grew from.

    A part that grew from an earlier part whose record is kept (for this label and split) is
    read from its first new file on; any other part, whole.
    """
    grown = {n: (key, files, blocks)
             for n, key, files, blocks in (cache.grown if cache is not None else ())}
    reads, earlier = [], {}
    for n in todo:
        part = src.parts()[n]
        if n in grown:
            key, files, blocks = grown[n]
            first = Part(key, (part.files[0], part.files[0] + files),
                         (part.blocks[0], part.blocks[0] + blocks), 0, part.anchor)
            record = known.earlier(first, _subset(first, wanted))
            if record is not None:
                earlier[n] = record
                src.use_splits(record.get("splits", {}))
                reads.append(Part(part.key, (first.files[1], part.files[1]),
                                  (first.blocks[1], part.blocks[1]),
                                  part.nbytes - sum(f.size for f in src.files[slice(*first.files)]),
                                  part.anchor))
                continue
        reads.append(part)
    return reads, earlier


def _joined(first: PartRecord, rest: PartRecord) -> PartRecord:
    """The record of a part that grew: its earlier part's record, then its new files'."""
    record: PartRecord = {"facts": [*first["facts"], *rest["facts"]],
                          "stats": merge_stats(first["stats"], rest["stats"])}
    splits = {**first.get("splits", {}), **rest.get("splits", {})}
    if splits:
        record["splits"] = splits
    return record


def _scan_files(src: Source, label: str, client: Client, token: str,
                parse_cache: BlockCache | None, timeout: float, parts: list[Part],
                wanted: set[int], progress: ProgressCallback | None) -> list[PartRecord]:
    """Parse each block of ``parts`` in ``wanted`` once in scan tasks: each part's record.

    A part is scanned as one stretch (a large one as several, :func:`part_tasks`), whatever else
    its scan task holds, so its statistics are the same whenever it is scanned; small parts
    share scan tasks (:func:`scan_tasks`). A part's blocks outside ``wanted`` (the other
    subset of a split) get facts of no rows.
    """
    stretches = [(n, t) for n, part in enumerate(parts) for t in part_tasks(part, src, wanted)]
    found: list[list[tuple[list[BlockFacts], Stats]]] = [[] for _ in parts]
    if stretches:
        nthreads = sum(client.nthreads().values()) or 1
        while True:
            try:
                results = _run_tasks(src, label, client, token, parse_cache, timeout,
                                     scan_tasks(src, stretches, nthreads), progress)
                break
            except SplitError as err:  # a block's speculated start failed: decide the file's exactly
                if err.path in src.splits:
                    raise
                split_exactly(src, err.path, client, parse_cache)
        for n, facts, stats in results:
            found[n].append((facts, stats))
    records = []
    for part, scanned in zip(parts, found, strict=True):
        got = iter([f for facts, _ in scanned for f in facts])
        facts = [next(got) if i in wanted else _unscanned() for i in range(*part.blocks)]
        record: PartRecord = {"facts": facts, "stats": merge_stats(*(st for _, st in scanned))}
        splits = {f.path: src.splits[f.path] for f in src.files[part.files[0]:part.files[1]]
                  if f.path in src.splits}
        if splits:
            record["splits"] = splits
        records.append(record)
    return records


def split_exactly(src: Source, path: str, client: Client, cache: BlockCache | None) -> None:
    """Decide where the blocks of file ``path`` start from the whole file, on the cluster.

    What the parse cache kept of its blocks read at the speculated starts is removed. The
    file is read once more (a summary of its quotes per block, in parallel), then scanned again.
    """
    src.split_exactly(path, gathered_map(client))
    if cache is not None:
        cache.forget_part(next(i for i, b in enumerate(src.blocks) if b.path == path), client)


def _run_tasks(src: Source, label: str, client: Client, token: str,
               parse_cache: BlockCache | None, timeout: float,
               tasks: list[list[tuple[int, list[int]]]],
               progress: ProgressCallback | None) -> list[tuple[int, list[BlockFacts], Stats]]:
    """Run the scan tasks (each a list of stretches: ``(part, blocks)``); each stretch's facts, stats."""
    topic = f"daskfeed-scan-{token}"
    sizes = block_sizes(src)
    keys = ScanKeys()
    futures = [client.submit(scan_stretches, [[(i, src.blocks[i]) for i in blocks] for _, blocks in t],
                             src.options, label, parse_cache, topic,
                             [[sizes[i] for i in blocks] for _, blocks in t],
                             key=keys.scan(t[0][1][0]), retries=1)
               for t in tasks]
    try:
        watched = await_scan(client, futures, [[i for _, b in t for i in b] for t in tasks], src,
                             timeout, topic, progress)
        results = [watched.results[f.key] for f in futures]  # (fetched as each finished)
        watched.finished(sum(int(f.get("rows", 0)) for r in results for facts in r["facts"]
                             for f in facts), progress)
    except Exception as err:
        new = explain(err, "the scan's statistics")
        if new is err:
            raise
        raise new from err
    finally:
        for f in futures:
            f.release()
    return [(n, facts, stats) for t, r in zip(tasks, results, strict=True)
            for (n, _), facts, stats in zip(t, r["facts"], r["stats"], strict=True)]
