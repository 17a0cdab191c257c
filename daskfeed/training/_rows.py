"""Which rows trained at a step: recomputed from the run's order, with no per-step log.

The order's batch of a step comes from the run's order record
(:mod:`daskfeed.training._order_record`); :func:`batch_rows` recomputes its rows from the record
and the run's manifest (:mod:`daskfeed.batches._trace`: no bucket file is read), each row's block
and place in the block's stored order turned into its file and line
(:func:`daskfeed.manifest.row_line`, from what the scan kept); the parse cache is read only for
a block some of whose rows have no label, a compressed file's block (parsed in pieces), and the
rows' values (``show``).
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from daskfeed.batches import (
    BucketRows,
    GlobalOrder,
    batch_positions,
    dealt_sizes,
    file_rows,
    unit_rows,
)
from daskfeed.cache import CacheLayout
from daskfeed.core import CheckpointError, DaskfeedError, DataError, SettingError
from daskfeed.manifest import Manifest
from daskfeed.reading import compression_of, is_parquet
from daskfeed.training._certificate import read_mark
from daskfeed.training._order_record import (
    NAME,
    Segment,
    epoch_segments,
    order_batch,
    rank_batches,
    read_record,
    was_skipped,
)
from daskfeed.training._started import NAME as STARTED

if TYPE_CHECKING:
    import pandas as pd

    from daskfeed.cache import BlockCache

_MANIFESTS = ("manifest.running.json", "manifest.json")  # a running (or stopped) run's, a finished one's


def batch_rows(output: str | os.PathLike[str], *, epoch: int, step: int | Iterable[int],
               rank: int | None = None, show: bool = False,
               storage_options: dict[str, Any] | None = None) -> pd.DataFrame:
    """The rows of training steps of a run: file and line of each, in the batch's order.

    Recomputed from the run's order (``OUTPUT/order.json``, kept by ``daskfeed train``) and
    its manifest; nothing was logged per step. Right across resumes with another budget,
    worker count or number of trainers.

    Parameters
    ----------
    output
        The run's output directory (rank 0's, ``--output``).
    epoch
        The epoch, from 1 (as the progress bar counts).
    step
        The step of the epoch, from 1: the epoch order's batch ``step`` (all trainers'); with
        ``rank``, that trainer's own ``step``-th batch of the epoch (its batches before a resume
        counted). Several steps (``range(48200, 48261)``): their rows one after another, with a
        ``step`` column first.
    rank
        A trainer (None: the epoch's order as one).
    show
        Add the rows' values as the scan read them (from the parse cache).
    storage_options
        fsspec options to list the run's files on object storage (to check them unchanged),
        as ``train`` took them.

    Returns
    -------
    pandas.DataFrame
        One row per row of the batch: ``file``, ``line`` (as an editor counts; ``<NA>`` where the
        scan kept no line), ``block`` and ``block_row`` (the row's block of the manifest and its
        row there, in file order), and with ``show`` the row's columns (one named like those
        four as ``"<name> (value)"``). ``attrs`` holds the epoch, step, rank, the order's batch,
        the trainers that trained it and whether it was ``skipped`` (``--skip-batches``: its
        rows listed, never trained), of the last step asked; with several steps
        ``skipped_steps`` lists those skipped.

    Raises
    ------
    SettingError
        An epoch or step the run does not have.
    DaskfeedError
        A run with no order record, not in the global order, or whose files changed since.
    """
    run = RunOrder(os.fspath(output), storage_options)
    one = isinstance(step, numbers.Integral)
    steps = [int(step)] if one else [int(s) for s in step]  # type: ignore[arg-type, union-attr]
    frame = run.frame(run.found(epoch, steps, rank), show, several=not one)
    if one:
        del frame.attrs["skipped_steps"]
    return frame


def trace_steps(output: str | os.PathLike[str], *, epoch: int, steps: Iterable[int],
                rank: int | None = None,
                storage_options: dict[str, Any] | None = None) -> StepRows:
    """:func:`batch_rows` as plain columns, without pandas (what ``daskfeed rows`` prints)."""
    return RunOrder(os.fspath(output), storage_options).found(epoch, [int(s) for s in steps], rank)


class Traced(NamedTuple):
    """One step traced (:meth:`RunOrder.batch`)."""

    batch: int  # of the epoch's order, from 0
    world: int | None  # the trainers that trained it (None: not on record)
    skipped: bool  # left out by --skip-batches (not trained)
    blocks: np.ndarray  # each row's block ...
    stored: np.ndarray  # ... and its place in the block's stored order


class StepRows(NamedTuple):
    """Steps' rows as columns, in the batches' order (:func:`trace_steps`)."""

    steps: np.ndarray  # each row's step (int64)
    files: list[str]  # its file ...
    lines: np.ndarray  # ... its line there (-1: not known) ...
    blocks: np.ndarray  # ... its block of the manifest ...
    block_rows: np.ndarray  # ... its row there, in file order ...
    stored: np.ndarray  # ... and its place in the block's stored order (for its values)
    attrs: dict[str, Any]  # epoch, step (the last), rank, batch, world, skipped, skipped_steps


class RunOrder:
    """A run's order, loaded once to trace any number of its batches (see :func:`batch_rows`).

    Parameters
    ----------
    out
        The run's output directory.
    storage_options
        fsspec options for its files on object storage.

    Raises
    ------
    DaskfeedError
        No order record there, a run not in the global order, or a manifest not the run's.
    """

    def __init__(self, out: str, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        record = read_record(os.path.join(out, NAME))
        if record is None:
            raise DaskfeedError(
                f"Expected a run's order record ({os.path.join(out, NAME)}). Received: none "
                "there.\nHint: name the --output directory of a `daskfeed train` run (one made "
                "by this daskfeed or later).")
        layout = record["layout"]
        if not layout.get("global_order") or "sizes" not in layout:
            raise DaskfeedError(
                f"The run in {out} read windows of blocks (the parse cache off, or too little "
                "disk for its buckets), whose batches are not recomputed yet. Expected a run in "
                "the global order.\nHint: train with the parse cache on (the default) to trace "
                "batches.")
        self.out, self.record, self.layout = out, record, layout
        self.manifest = _manifest(out, layout["fingerprint"])
        self.where = _cache_of(layout["cache"])  # (its layout: no Arrow loaded to trace)
        self._cache: BlockCache | None = None
        ids = self.where.block_ids(len(self.manifest.blocks))
        k = len(layout["sizes"])
        if dealt_sizes(self.manifest.counts, ids, k) != layout["sizes"]:
            raise CheckpointError(
                f"Expected the manifest in {out} to deal the run's rows into its {k} buckets. "
                "Received: other bucket sizes (the manifest or the cache's layout is not the "
                "run's).\nHint: the directory holds outputs of two runs; train again to trace "
                "batches.")
        self.buckets = BucketRows(self.manifest.counts, ids, k)
        self.batch_size = int(layout["batch_size"])
        self._units: dict[tuple[int, int], np.ndarray] = {}
        self._epochs: dict[int, tuple[GlobalOrder, int, list[Segment]]] = {}
        self._lanes: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
        self._labelled: dict[int, np.ndarray] = {}
        self._checked: set[str] = set()  # files found unchanged
        self._started = _started(out)
        self._mark = read_mark(out)  # how far its last run trained

    def batch(self, epoch: int, step: int, rank: int | None) -> Traced:
        """The order's batch of ``step`` (of ``rank``), and its rows' blocks and stored places."""
        if epoch < 1 or step < 1:
            raise SettingError(f"Expected --epoch and --step from 1 (as the progress bar counts). "
                               f"Received: epoch={epoch}, step={step}.\nHint: e.g. --epoch 1 --step 1.")
        bs = self.batch_size
        order, batches, segments = self._epoch(epoch)
        lanes = None
        if rank is not None:  # (a trainer's steps: its lanes, once per epoch)
            if (epoch, rank) not in self._lanes:
                self._lanes[(epoch, rank)] = rank_batches(segments, rank, order.rows // bs, batches)
            lanes = self._lanes[(epoch, rank)]
        g, world = order_batch(segments, step, rank, order.rows // bs, batches, lanes)

        def units(u: int) -> np.ndarray:
            key = (epoch, u)
            if key not in self._units:
                if len(self._units) > 8:
                    self._units.clear()
                self._units[key] = unit_rows(int(order.starts[u + 1] - order.starts[u]),
                                             order.unit_seed(u))
            return self._units[key]

        blocks, labelled_rows = self.buckets.rows(batch_positions(order, bs, g, units))
        stored = np.empty(len(blocks), dtype=np.int64)
        for j, mine in _groups(blocks):
            block = self.manifest.blocks[j]
            stored[mine] = (labelled_rows[mine] if block.get("raw_rows", block["rows"]) == block["rows"]
                            else self._with_label(j)[labelled_rows[mine]])
        return Traced(g, world, was_skipped(segments, g), blocks, stored)

    def _file_rows(self, blocks: np.ndarray, stored: np.ndarray,
                   groups: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """Each row's place in its block in file order, of its place in the stored order.

        Each block's stored order is made once for all the rows asked (a range of steps touches
        the same blocks again); big blocks' orders are made in threads (numpy lets the GIL go
        while it permutes), one per core.
        """
        rows = np.empty(len(blocks), dtype=np.int64)

        def undo(group: tuple[int, np.ndarray]) -> None:
            j, mine = group
            block = self.manifest.blocks[j]
            raw = int(block.get("raw_rows", block["rows"]))
            rows[mine] = file_rows(self.where.block_id(j), stored[mine], self._pieces(j, raw), index=j)

        work = sum(int(self.manifest.blocks[j].get("raw_rows", self.manifest.blocks[j]["rows"]))
                   for j, _ in groups)
        threads = min(os.cpu_count() or 1, len(groups))
        if threads > 1 and work > 2**20:  # (small blocks: a thread's hand-off costs more)
            with ThreadPoolExecutor(threads, thread_name_prefix="daskfeed-rows") as pool:
                list(pool.map(undo, groups))
        else:
            for group in groups:
                undo(group)
        return rows

    @property
    def cache(self) -> BlockCache:
        """The run's parse cache, to read what its layout does not say (opened when first asked)."""
        if self._cache is None:
            from daskfeed.cache import BlockCache

            self._cache = BlockCache(**asdict(self.where))
        return self._cache

    def _pieces(self, index: int, rows: int) -> list[int]:
        """The rows of each piece block ``index`` was parsed as (see :func:`file_rows`)."""
        path = str(self.manifest.blocks[index]["path"])
        if compression_of(path) is None and not is_parquet(path):
            return [rows]  # a plain CSV file's block is parsed as one table
        ranges = self.cache.lookup(index)
        if ranges is None:
            raise DataError(
                f"Expected block {index} of the run (a compressed file, parsed in pieces) in its "
                f"parse cache ({self.where.place(index)[0]}). Received: not there (the cache was "
                "cleared or evicted).\nHint: scan the same files with the same cache (daskfeed "
                "scan ... --cache DIR), then ask again: the order is the same.")
        return [count for _, _, count, _ in ranges]

    def _epoch(self, epoch: int) -> tuple[GlobalOrder, int, list[Segment]]:
        """The epoch's order, its batches and the stretches that trained it (kept)."""
        if epoch not in self._epochs:
            layout, bs = self.layout, self.batch_size
            order = GlobalOrder.of(layout["sizes"], layout["seed"], epoch - 1)
            batches = (order.rows // bs if layout["drop_remainder"] else -(-order.rows // bs))
            stretches = self.record["stretches"]
            segments = epoch_segments(stretches, epoch - 1, batches, self._mark)
            if not segments:
                first, last = stretches[0]["epoch"] + 1, stretches[-1].get("epochs", "?")
                raise SettingError(f"Expected an epoch the run trained. Received: epoch={epoch}.\n"
                                   f"Hint: the run trains epochs {first} to {last}.")
            self._epochs[epoch] = (order, batches, segments)
        return self._epochs[epoch]

    def _lines(self, rows: np.ndarray, groups: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """Each row's line in its file (-1: not known), of its place in its block in file order."""
        from daskfeed.manifest import row_lines

        lines = np.full(len(rows), -1, dtype=np.int64)
        for j, mine in groups:
            found = row_lines(self.manifest.blocks[j], rows[mine])
            if found is not None:
                lines[mine] = found
        return lines

    def found(self, epoch: int, steps: list[int], rank: int | None) -> StepRows:
        """Steps' rows as columns (see :func:`batch_rows`)."""
        traced = [self.batch(epoch, s, rank) for s in steps]
        counts = [len(t.blocks) for t in traced]
        blocks = np.concatenate([t.blocks for t in traced]) if traced else np.zeros(0, np.int64)
        stored = np.concatenate([t.stored for t in traced]) if traced else blocks
        paths = [self.manifest.blocks[j]["path"] for j in blocks.tolist()]
        self._refuse_changed(sorted(set(paths)))  # (before a line of a file that moved is read)
        groups = _groups(blocks)  # (all the steps' rows of a block at once)
        rows = self._file_rows(blocks, stored, groups)
        last = traced[-1] if traced else None
        attrs = dict(epoch=epoch, step=steps[-1] if steps else None, rank=rank,
                     batch=last.batch + 1 if last else None, world=last.world if last else None,
                     skipped=bool(last and last.skipped),
                     skipped_steps=[s for s, t in zip(steps, traced, strict=True) if t.skipped])
        return StepRows(np.repeat(np.asarray(steps, dtype=np.int64), counts), paths,
                        self._lines(rows, groups), blocks, rows, stored, attrs)

    def frame(self, found: StepRows, show: bool, several: bool = True) -> pd.DataFrame:
        """:meth:`found`'s columns as the DataFrame :func:`batch_rows` returns.

        ``several``: a ``step`` column first (else one step was asked).
        """
        import pandas as pd

        lines = found.lines
        frame = pd.DataFrame({
            "file": found.files, "line": pd.arrays.IntegerArray(np.maximum(lines, 0), lines < 0),
            "block": found.blocks, "block_row": found.block_rows})
        if show:  # (a column named like one of the row's place is shown as "<name> (value)")
            values = _values(self.cache, found.blocks, found.stored)
            values.columns = [f"{c} (value)" if c in frame.columns else c for c in values.columns]
            frame = pd.concat([frame, values], axis=1)
        frame.attrs.update(found.attrs)
        if several:
            frame = frame.rename(columns={"step": "step (value)"})
            frame.insert(0, "step", found.steps)
        return frame

    def _with_label(self, index: int) -> np.ndarray:
        if index not in self._labelled:
            self._labelled[index] = _with_label(self.cache, index, self.manifest)
        return self._labelled[index]

    def _refuse_changed(self, paths: list[str]) -> None:
        todo = [p for p in paths if p not in self._checked]
        if todo and self._started is not None:
            _refuse_changed(todo, self._started, self.storage_options)
        self._checked.update(todo)


def _groups(blocks: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each block of ``blocks`` with the positions it holds (one sort, not a pass per block)."""
    order = np.argsort(blocks, kind="stable")
    cuts = np.flatnonzero(np.diff(blocks[order])) + 1
    return [(int(blocks[at[0]]), at) for at in np.split(order, cuts) if len(at)]


def _cache_of(d: dict[str, Any]) -> CacheLayout:
    """The run's parse cache's layout, as the record keeps it (no lease: it only reads)."""
    return CacheLayout(root=d["root"], entries=tuple(d["entries"]), starts=tuple(d["starts"]),
                       ids=tuple(d["ids"]), compression=d["compression"],
                       grown=tuple((int(a), str(b), int(c), int(e)) for a, b, c, e in d["grown"]))


def _with_label(cache: BlockCache, index: int, manifest: Manifest) -> np.ndarray:
    """The stored places of block ``index``'s rows that have a label (from the parse cache)."""
    from daskfeed.manifest import Encoding, labelled  # (pyarrow: a block with unlabelled rows)

    table = cache.stored_view(index, [manifest.label], {})
    if table is None:
        raise DaskfeedError(
            f"Expected block {index} of the run in its parse cache: some of its rows have no "
            "label, and which ones is kept there. Received: not there (cleared or evicted)."
            "\nHint: scan the same files with the same cache (daskfeed scan ... --cache DIR), "
            "then ask again: the order is the same.")
    mask = labelled(table, Encoding.from_manifest(manifest, []))
    at = np.arange(table.num_rows, dtype=np.int64) if mask is None else np.flatnonzero(mask)
    if len(at) != manifest.blocks[index]["rows"]:
        raise DaskfeedError(
            f"Expected {manifest.blocks[index]['rows']} rows with a label in block {index} of the "
            f"run's parse cache. Received: {len(at)}.\nHint: the cache was rebuilt on other files; "
            "train again to trace this run's batches.")
    return at


def _manifest(out: str, fingerprint: str) -> Manifest:
    for name in _MANIFESTS:
        path = os.path.join(out, name)
        if os.path.exists(path):
            manifest = Manifest.from_json(path)
            if manifest.fingerprint != fingerprint:
                raise CheckpointError(
                    f"Expected the manifest of the run's order ({path}) to be of data with "
                    f"fingerprint {fingerprint}. Received: {manifest.fingerprint}.\nHint: the "
                    "directory holds outputs of two runs; trace the batches of the run that "
                    "wrote both, or train again.")
            return manifest
    raise DaskfeedError(f"Expected the run's manifest in {out}. Received: no "
                        f"{' or '.join(_MANIFESTS)}.\nHint: name a `daskfeed train` --output.")


def _started(out: str) -> dict[str, list[Any]] | None:
    """The files the run started with (``files.json``): path -> [size, mtime, etag]; None: none."""
    try:
        with open(os.path.join(out, STARTED), encoding="utf-8") as f:
            return {row[0]: list(row[1:]) for row in json.load(f)["files"]}
    except (OSError, ValueError, KeyError):
        return None  # a run on a dask DataFrame, or of an older daskfeed: the fingerprint was checked


def _refuse_changed(paths: list[str], started: dict[str, list[Any]],
                    storage_options: dict[str, Any]) -> None:
    """Refuse when a file of the batch changed since the run started (size, time or etag)."""
    now: dict[str, list[Any]] = {}
    remote = [p for p in paths if "://" in p]
    for p in paths:  # a local file: one stat (as the listing read it), no fsspec
        if "://" not in p:
            with contextlib.suppress(OSError):
                st = os.stat(p)
                now[p] = [st.st_size, float(st.st_mtime), ""]  # (no ETag on a local disk)
    if remote:
        from daskfeed.reading import expand_paths  # (fsspec: files on object storage only)

        try:
            now.update({f.path: [f.size, f.mtime, f.etag] for f in expand_paths(remote, storage_options)})
        except DaskfeedError as err:
            raise DaskfeedError(
                f"Expected to check that the batch's files on object storage are the ones the run "
                f"read. Received: they could not be listed ({err}).\nHint: pass the storage "
                "options the run was trained with (--storage-options, storage_options=).") from err
    changed = [p for p in paths if p in started and now.get(p) != started[p]]
    if changed:
        raise CheckpointError(
            f"Expected the files the run trained on, unchanged. Received: changed or gone since: "
            f"{', '.join(changed[:5])}{f' and {len(changed) - 5} more' if len(changed) > 5 else ''}."
            "\nHint: a row's line is that of the file as the run read it; restore the files to "
            "trace its batches.")


def _values(cache: BlockCache, blocks: np.ndarray, stored: np.ndarray) -> pd.DataFrame:
    """The rows' values as the scan read them (from the parse cache, in the batch's order)."""
    import pandas as pd

    parts = []
    at = np.empty(len(blocks), dtype=np.int64)
    base = 0
    for j, mine in _groups(blocks):
        found = cache.file_view(j, None, {})
        if found is None:
            raise DaskfeedError(f"Expected block {j} of the run in its parse cache. Received: not "
                                "there.\nHint: run `daskfeed scan` on the same files, then ask again.")
        table, order = found  # (rows as kept: one take of the rows asked, by their stored places)
        parts.append(table.take(order[stored[mine]]).to_pandas())
        at[mine] = base + np.arange(len(mine))
        base += len(mine)
    whole = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return whole.iloc[at].reset_index(drop=True)  # row i of the batch is part row at[i]
