"""Buckets: a data set's rows dealt into ``K`` buckets, each a random sample of all of them.

The global order (:mod:`daskfeed.batches._order`) reads an epoch bucket by bucket; this module
keeps the files. The buckets of every data set with the same label and ``K`` live in one *set
directory*, ``<cache root>/buckets/<key>/``, as *generations*: a generation holds the rows of
some parts of the parse cache (a first build: all of them; data that grew: the new parts),
dealt into the same ``K`` buckets by the same rule, so bucket ``k`` of a data set is bucket
``k`` of each of its generations together. A generation ``<key>/<name>/`` (its name a digest
of its parts: the same parts, the same name, however they were dealt) holds:

- ``b<k>.arrow``: bucket ``k``'s rows of its parts in canonical order (by block id, then by the
  row's place in the block's stored order), every column as the parse cache keeps it plus
  ``__block`` (the block's id, :meth:`~daskfeed.cache._blocks.BlockCache.block_id`, as int64)
  and ``__row`` (the row's place in the block's stored order, rows without a label counted):
  each row can be traced back to its block, so to its file and line. Written under a
  temporary name, then renamed.
- ``runs-<tag>/``: while the generation is dealt, the *runs* of its first step (a group of
  blocks' rows sorted by bucket; ``r<n>.arrow`` and its bucket offsets ``r<n>.npy``), removed
  after.
- ``set.json``, written last: the format, ``K``, the buckets' rows, the parts and when it was
  last used: a generation without it is not complete (one cut short is dealt again).

A :class:`BucketSet` is either one generation (``generations`` empty; what a build writes) or
a data set's view of its set directory (``generations``: the names of those making it). A
view reads bucket ``k`` from each generation and puts the rows in canonical order, so its
buckets hold the same rows in the same order whatever generations they were dealt in.

Buckets are read whole into memory (``pread``, not a memory map: the pages a read touches are
the bytes it keeps, and nothing else of the set counts in a worker's RSS).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from daskfeed.cache._arrow import one_table
from daskfeed.cache._root import own_dir, own_root
from daskfeed.cache._writer import BATCH_ROWS, compact
from daskfeed.core import create_new, fsync, temporary_name, write_file

BUCKETS_VERSION = 2  # 1: one set per data set, rows by block index; 2: generations, by block id
TRACE_COLUMNS = ("__block", "__row")  # each row's block id and place in its stored order
STALE_SECONDS = 24 * 3600  # a generation no data set used this long is removed on the next build
MARKER = "set.json"


def _root(root: str | None) -> str:
    from daskfeed.cache._layout import default_root

    return default_root() if root is None else root


def generation_name(parts: list[str]) -> str:
    """The name of the generation holding ``parts`` (sorted: the same parts, the same name)."""
    text = json.dumps(sorted(parts))
    return "g" + hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class BucketSet:
    """Bucket files: one generation, or a data set's view of several.

    Picklable: it travels to the workers with each task.

    Parameters
    ----------
    root
        The parse cache's root (None: each worker's default, as for the parse cache).
    key
        The set directory's name under ``<root>/buckets`` (a generation: ``<set>/<name>``).
    buckets
        ``K``.
    build
        A tag of the files (a fresh one each build: window task keys change with it; "": not
        known yet).
    compression
        Of the files written (the parse cache's: None, ``"lz4"`` or ``"zstd"``).
    generations
        A view's generations (names under the set directory); empty: this is one generation.
    """

    root: str | None
    key: str
    buckets: int
    build: str = ""  # the build that wrote the files (a fresh tag each build: window task keys)
    compression: str | None = None  # of the files, as the parse cache's (None: plain)
    generations: tuple[str, ...] = ()

    @staticmethod
    def key_of(**identity: Any) -> str:
        """A set's key: a digest of what makes its contents (label, ``K``, format)."""
        text = json.dumps({**identity, "version": BUCKETS_VERSION}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def path(self) -> str:
        """The set's (or generation's) directory, as seen by the process asking."""
        return os.path.join(_root(self.root), "buckets", *self.key.split("/"))

    def generation(self, name: str, build: str = "") -> BucketSet:
        """Generation ``name`` of this set directory."""
        base = self.key.split("/")[0]
        return replace(self, key=f"{base}/{name}", build=build, generations=())

    def view(self, names: list[str], builds: list[str]) -> BucketSet:
        """The data set made of generations ``names`` (their builds tag the view)."""
        tag = hashlib.sha256("/".join(sorted(builds)).encode()).hexdigest()[:12]
        return replace(self, key=self.key.split("/")[0], build=tag, generations=tuple(names))

    def parts_of(self) -> list[BucketSet]:
        """The generations to read (a generation: itself)."""
        return [self.generation(n) for n in self.generations] if self.generations else [self]

    def bucket_path(self, b: int) -> str:
        """Bucket ``b``'s Arrow file (a view: its first generation's)."""
        return os.path.join(self.parts_of()[0].path, f"b{int(b):06d}.arrow")

    def free(self) -> int:
        """Free bytes on the disk that holds (or will hold) the set."""
        base = _root(self.root)
        if not os.path.isdir(base):  # (a worker that joined after the cache was opened)
            own_root(base)
        return shutil.disk_usage(base).free

    # -- the markers ---------------------------------------------------------------------
    def found(self) -> list[dict[str, Any]]:
        """The complete generations of this set directory: name, parts, sizes digest, rows, build.

        Read on a worker: the files are where the workers see them.
        """
        base = os.path.join(_root(self.root), "buckets", self.key.split("/")[0])
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return []
        out = []
        for name in names:
            meta = _marker(os.path.join(base, name, MARKER))
            if (meta is None or meta.get("version") != BUCKETS_VERSION
                    or meta.get("buckets") != self.buckets or not isinstance(meta.get("parts"), list)):
                continue
            out.append({"name": name, "parts": [str(p) for p in meta["parts"]],
                        "sizes": str(meta.get("sizes")), "rows": int(meta.get("rows", 0)),
                        "build": str(meta.get("build", "?"))})
        return out

    def complete(self, sizes_digest: str) -> str:
        """The tag of the build that completed this generation for these sizes ("": none).

        Marks it used.

        Parameters
        ----------
        sizes_digest
            :func:`digest` of the buckets' rows the caller expects.

        Returns
        -------
        str
        """
        meta = _marker(os.path.join(self.path, MARKER))
        if (meta is None or meta.get("version") != BUCKETS_VERSION
                or meta.get("buckets") != self.buckets or meta.get("sizes") != sizes_digest):
            return ""
        self.use()
        return str(meta.get("build", "?"))

    def use(self) -> None:
        """Mark every generation read used now (a generation unused for a day may be removed)."""
        now = time.time()
        for g in self.parts_of():
            with contextlib.suppress(OSError):
                os.utime(os.path.join(g.path, MARKER), (now, now))

    def forget(self) -> None:
        """Mark the generations incomplete (a bucket found missing or damaged): rebuilt next run."""
        for g in self.parts_of():
            with contextlib.suppress(OSError):
                os.remove(os.path.join(g.path, MARKER))

    def drop_unsealed(self) -> bool:
        """Remove this generation's files if it has no marker (a build cut short); whether it did.

        A sealed generation is left alone, and so is a link (never followed).
        """
        path = self.path
        if os.path.islink(path) or not os.path.isdir(path) \
                or os.path.exists(os.path.join(path, MARKER)):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True

    def seal(self, sizes_digest: str, parts: dict[str, int], rows: int, tag: str, build: str) -> None:
        """Write this generation's marker (it is complete) and remove its build's runs.

        Parameters
        ----------
        sizes_digest
            :func:`digest` of the buckets' rows.
        parts
            The parse cache's parts the generation holds, each with its number of blocks (its
            blocks' ids: the part's salt + 0 .. n - 1; what a reader needs to leave out the
            rows of a part that changed without dealing the generation again).
        rows
            Their rows.
        tag
            The build's runs to remove ("": none).
        build
            This build's name (:meth:`complete` returns it).
        """
        write_file(os.path.join(self.path, MARKER), json.dumps({
            "version": BUCKETS_VERSION, "buckets": self.buckets, "sizes": sizes_digest,
            "rows": int(rows), "build": build, "parts": sorted(parts),
            "part_blocks": {p: int(n) for p, n in sorted(parts.items())}, "created": time.time()}))
        if tag:
            shutil.rmtree(os.path.join(self.path, f"runs-{tag}"), ignore_errors=True)

    def sweep(self, parts: list[str]) -> None:
        """Remove generations of ``parts`` that no data set used for ``STALE_SECONDS``.

        Of any set directory, this view's own excepted; then set directories left empty; and
        any generation left unsealed (a build cut short) untouched that long
        (``remove_unsealed``).
        """
        mine = {g.path for g in self.parts_of()}
        now = time.time()

        def stale(path: str, meta: dict[str, Any]) -> bool:
            with contextlib.suppress(OSError):
                return (path not in mine
                        and now - os.stat(os.path.join(path, MARKER)).st_mtime > STALE_SECONDS)
            return False

        base = os.path.join(_root(self.root), "buckets")
        remove_generations(base, set(parts), stale)
        remove_unsealed(base, now - STALE_SECONDS)

    # -- runs (the build's first step) -----------------------------------------------------
    def write_run(self, tag: str, name: str, tables: list[pa.Table], rows: np.ndarray,
                  buckets: np.ndarray, trace: dict[str, np.ndarray]) -> int:
        """Write a run: rows ``rows`` of ``tables`` (one after another) sorted by their ``buckets``.

        The sort is stable (rows of one bucket stay in the order given); ``trace``'s columns
        (one value per row given) are appended. One ``take`` of the tables makes the run. Its
        offsets (``offsets[k]``: the first row of bucket ``k``) go beside it, ``<name>.npy``.

        Returns
        -------
        int
            The run's rows.
        """
        directory = os.path.join(self.path, f"runs-{tag}")
        self.make_dirs()
        own_dir(directory)
        order = np.argsort(buckets, kind="stable")
        offsets = np.searchsorted(buckets[order], np.arange(self.buckets + 1))
        run = one_table(tables).take(rows[order])
        for column, values in trace.items():
            run = run.append_column(column, pa.array(values[order]))
        _write_arrow(os.path.join(directory, f"{name}.arrow"), run, self.compression)
        _save_offsets(os.path.join(directory, f"{name}.npy"), offsets)
        return len(order)

    def read_run(self, tag: str, name: str, b0: int, b1: int) -> tuple[pa.Table, np.ndarray]:
        """Buckets ``b0 .. b1 - 1`` of run ``name``: a contiguous range of its rows.

        Returns
        -------
        tuple
            The rows and where each bucket starts in them (``b1 - b0 + 1`` offsets).

        Raises
        ------
        FileNotFoundError
            The run is not where this process looks (workers that share no file system).
        """
        directory = os.path.join(self.path, f"runs-{tag}")
        offsets = np.load(os.path.join(directory, f"{name}.npy"), mmap_mode="r")
        here = np.array(offsets[int(b0):int(b1) + 1], dtype=np.int64)
        lo, hi = int(here[0]), int(here[-1])
        return _read_rows(os.path.join(directory, f"{name}.arrow"), lo, hi), here - lo

    def merge_runs(self, tag: str, inputs: list[str], output: str, step_rows: int) -> int:
        """Merge consecutive runs into one, bucket by bucket, holding about ``step_rows`` rows.

        Bucket ``k`` of the output is bucket ``k`` of each input in turn (canonical order kept).
        The inputs are removed once the output is in place.

        Returns
        -------
        int
            The output's rows.
        """
        directory = os.path.join(self.path, f"runs-{tag}")
        offsets = [np.load(os.path.join(directory, f"{n}.npy")) for n in inputs]
        schemas = []
        for n in inputs:
            with pa.OSFile(os.path.join(directory, f"{n}.arrow"), "rb") as f:
                schemas.append(ipc.open_file(f).schema)
        schema = _common_schema(schemas)
        counts = np.stack([np.diff(o) for o in offsets])  # inputs x K
        per_bucket = counts.sum(axis=0)
        out_offsets = np.concatenate([[0], np.cumsum(per_bucket)])
        path = os.path.join(directory, f"{output}.arrow")
        with _BatchWriter(path, schema, self.compression) as writer:
            b0 = 0
            while b0 < self.buckets:  # ranges of buckets of about step_rows rows
                b1 = int(np.searchsorted(out_offsets, out_offsets[b0] + max(step_rows, 1), "right"))
                b1 = min(max(b1 - 1, b0 + 1), self.buckets)
                pieces = [self.read_run(tag, n, b0, b1) for n in inputs]
                tables = [_conform(t, schema) for t, _ in pieces]
                whole = pa.concat_tables(tables) if tables else schema.empty_table()
                bases = np.cumsum([0] + [t.num_rows for t in tables[:-1]])
                # bucket by bucket, each input's rows of it in turn
                starts = np.stack([base + off[:-1] for base, (_, off) in zip(bases, pieces, strict=True)])
                lengths = counts[:, b0:b1]
                starts, lengths = starts.T.reshape(-1), lengths.T.reshape(-1)
                total = int(lengths.sum())
                firsts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
                index = np.repeat(starts - firsts, lengths) + np.arange(total)
                writer.write(whole.take(index))
                b0 = b1
        _save_offsets(os.path.join(directory, f"{output}.npy"), out_offsets)
        for n in inputs:
            for ext in (".arrow", ".npy"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, n + ext))
        return int(out_offsets[-1])

    # -- buckets ---------------------------------------------------------------------------
    def make_dirs(self) -> None:
        """Make the generation's directory and those above it, each checked as ours (0700)."""
        base = os.path.join(_root(self.root), "buckets")
        own_dir(base)
        for name in self.key.split("/"):
            base = os.path.join(base, name)
            own_dir(base)

    def write_bucket(self, b: int, tables: list[pa.Table]) -> None:
        """Write this generation's bucket ``b`` from its rows, put in canonical order.

        By block id, then row.
        """
        table = one_table(tables) if tables else pa.table({})
        _write_arrow(self.bucket_path(b), compact(_canonical(table)), self.compression)

    def read_bucket(self, b: int, columns: list[str] | None = None) -> pa.Table:
        """Bucket ``b``'s rows in canonical order (only ``columns`` read; None: all).

        A view of several generations reads each one's rows of the bucket and puts them in canonical
        order (block id, then row).

        Raises
        ------
        FileNotFoundError
            The bucket is not where this process looks.
        """
        gens = self.parts_of()
        if len(gens) == 1:
            return _read_file(gens[0].bucket_path(b), columns)
        wanted = None if columns is None else [*columns, *TRACE_COLUMNS]
        tables = [_read_file(g.bucket_path(b), wanted) for g in gens]
        tables = [t for t in tables if t.num_rows] or tables[:1]
        if len(tables) > 1:
            schema = _common_schema([t.schema for t in tables])
            tables = [_canonical(pa.concat_tables([_conform(t, schema) for t in tables]))]
        table = tables[0]
        if columns is not None:
            table = table.select([c for c in table.column_names if c in set(columns)])
        return table


def _canonical(table: pa.Table) -> pa.Table:
    """``table``'s rows by block id, then row (as ``np.lexsort``: the trace columns as int64)."""
    if TRACE_COLUMNS[0] not in table.column_names or table.num_rows < 2:
        return table
    blocks = table.column(TRACE_COLUMNS[0]).to_numpy()
    rows = table.column(TRACE_COLUMNS[1]).to_numpy()
    if np.all((blocks[1:] > blocks[:-1]) | ((blocks[1:] == blocks[:-1]) & (rows[1:] > rows[:-1]))):
        return table  # in order already
    return table.take(np.lexsort((rows, blocks)))


def remove_generations(base: str, parts: set[str],
                       also: Callable[[str, dict[str, Any]], bool] | None = None) -> None:
    """Remove the generations under ``base`` (``<root>/buckets``) holding one of ``parts``.

    Every set directory's generations (and a set of daskfeed <= 1, one generation at the top),
    those ``also(path, marker)`` agrees to (None: all of them); then set directories left empty.
    Links are never followed; a directory without a marker (being built) is left alone.
    """
    for name in _listdir(base):
        top = os.path.join(base, name)
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        for g in [top, *(os.path.join(top, n) for n in _listdir(top))]:
            meta = None if os.path.islink(g) else _marker(os.path.join(g, MARKER))
            if meta is not None and parts & set(meta.get("parts") or ()) \
                    and (also is None or also(g, meta)):
                _remove(g)
        with contextlib.suppress(OSError):
            if os.path.isdir(top) and not os.listdir(top):
                os.rmdir(top)


def remove_unsealed(base: str, before: float) -> int:
    """Remove the generations under ``base`` never sealed and untouched since ``before``.

    A build cut short (a reader closed, a process killed) leaves a generation's directory with
    no marker: its runs and some buckets. The next build of the same generation writes it
    again; a generation no build comes back to would stay for good. One whose directory and
    whose subdirectories (its runs) were last changed before ``before`` (``time.time()``) is
    no build's any more. Links are never followed. Returns how many were removed.
    """
    removed = 0
    for name in _listdir(base):
        top = os.path.join(base, name)
        if os.path.islink(top) or not os.path.isdir(top) or os.path.exists(os.path.join(top, MARKER)):
            continue  # (not a set directory, or a set of daskfeed <= 1: a generation itself)
        for g in (os.path.join(top, n) for n in _listdir(top)):
            if os.path.islink(g) or not os.path.isdir(g) or ".removing-" in g \
                    or os.path.exists(os.path.join(g, MARKER)):
                continue
            try:
                changed = max([os.stat(g).st_mtime, *(os.stat(os.path.join(g, n)).st_mtime
                                                      for n in _listdir(g))])
            except OSError:
                continue
            if changed < before:
                _remove(g)
                removed += 1
    return removed


def _read_file(path: str, columns: list[str] | None) -> pa.Table:
    """An Arrow file's rows (only ``columns``; None: all)."""
    with pa.OSFile(path, "rb") as f:
        reader = ipc.open_file(f)  # compressed files: only the columns read are decoded
        if columns is not None:
            wanted = set(columns)
            keep = [i for i, fld in enumerate(reader.schema) if fld.name in wanted]
            reader = ipc.open_file(f, options=ipc.IpcReadOptions(included_fields=keep))
        return reader.read_all()


def _marker(path: str) -> dict[str, Any] | None:
    """A generation's marker (None: absent, unreadable or not one)."""
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _remove(path: str) -> None:
    """Rename, then remove (a reader sees the whole directory or none)."""
    gone = f"{path}.removing-{uuid.uuid4().hex[:8]}"
    with contextlib.suppress(OSError):
        os.rename(path, gone)
        shutil.rmtree(gone, ignore_errors=True)


def digest(sizes: np.ndarray) -> str:
    """A short digest of the buckets' rows (what a set's marker is checked against)."""
    return hashlib.sha256(np.asarray(sizes, dtype=np.int64).tobytes()).hexdigest()[:24]


def _write_arrow(path: str, table: pa.Table, compression: str | None) -> None:
    """Write ``table`` to ``path`` whole or not at all (a fresh temporary name, then a rename)."""
    tmp = temporary_name(path)
    try:
        with create_new(tmp, perms=0o600) as raw, pa.PythonFile(raw, mode="w") as sink, \
                ipc.new_file(sink, table.schema,
                             options=ipc.IpcWriteOptions(compression=compression)) as writer:
            if table.num_rows:
                # one chunk, cut into batches of BATCH_ROWS rows: a range is read by its batches
                whole = table.unify_dictionaries().combine_chunks() if table.num_columns else table
                writer.write_table(whole, max_chunksize=BATCH_ROWS)
        fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _save_offsets(path: str, offsets: np.ndarray) -> None:
    """A run's bucket offsets beside it (a fresh temporary name, then a rename)."""
    tmp = temporary_name(path)
    with create_new(tmp, perms=0o600) as f:
        np.save(f, np.asarray(offsets, dtype=np.int64))
    os.replace(tmp, path)


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _common_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for runs whose columns may differ in type (int32 and int64...).

    No dictionaries (a streamed file holds one dictionary per column); columns that cannot be
    promoted become text.
    """
    plain = [pa.schema([pa.field(f.name, _plain(f.type)) for f in s]) for s in schemas]
    try:
        return pa.unify_schemas(plain, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        names = plain[0].names
        clash = {n for n in names if len({s.field(n).type for s in plain if n in s.names}) > 1}
        return pa.schema([pa.field(n, pa.string() if n in clash else plain[0].field(n).type)
                          for n in names])


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns and types (dictionaries decoded)."""
    cols = []
    for f in schema:
        col = table.column(f.name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(cols, schema=schema)


class _BatchWriter:
    """Writes tables to an Arrow file in record batches of exactly ``BATCH_ROWS`` rows.

    The last one is shorter; a range of rows is then read by its batches. Whole or not at all.
    """

    def __init__(self, path: str, schema: pa.Schema, compression: str | None) -> None:
        self.path, self.schema = path, schema
        self.tmp = temporary_name(path)
        self.raw = create_new(self.tmp, perms=0o600)
        self.sink = pa.PythonFile(self.raw, mode="w")
        self.writer = ipc.new_file(self.sink, schema,
                                   options=ipc.IpcWriteOptions(compression=compression))
        self.pending: list[pa.Table] = []
        self.held = 0

    def write(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.held += table.num_rows
        if self.held >= BATCH_ROWS:
            whole = pa.concat_tables(self.pending).combine_chunks()
            full = (whole.num_rows // BATCH_ROWS) * BATCH_ROWS
            self.writer.write_table(whole.slice(0, full), max_chunksize=BATCH_ROWS)
            rest = whole.slice(full)
            self.pending, self.held = [rest], rest.num_rows

    def __enter__(self) -> _BatchWriter:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        try:
            if kind is None and self.held:
                self.writer.write_table(pa.concat_tables(self.pending).combine_chunks(),
                                        max_chunksize=BATCH_ROWS)
            self.writer.close()
            self.sink.close()
            self.raw.close()
            if kind is None:
                fsync(self.tmp)
                os.replace(self.tmp, self.path)
        finally:
            with contextlib.suppress(OSError):
                os.remove(self.tmp)


def _read_rows(path: str, lo: int, hi: int) -> pa.Table:
    """Rows ``[lo, hi)`` of an Arrow file of ``BATCH_ROWS``-row record batches (only those read)."""
    with pa.OSFile(path, "rb") as f:
        reader = ipc.open_file(f)
        if hi <= lo:
            return reader.schema.empty_table()
        first, last = lo // BATCH_ROWS, (hi - 1) // BATCH_ROWS
        batches = [reader.get_batch(i) for i in range(first, last + 1)]
        return pa.Table.from_batches(batches, schema=reader.schema).slice(lo - first * BATCH_ROWS,
                                                                           hi - lo)
