"""Cache: every partition parsed once, kept as Arrow IPC files on the workers' disk.

The scan parses each CSV block once and, while it is in memory, writes it here; every epoch
after that reads Arrow instead of CSV (several times faster to read than to parse). A partition
that is missing (the manifest came from an earlier run, a worker on another machine, a damaged
or deleted cache file) is parsed again and written then.

Layout: ``<root>/<fingerprint>/g<first>-<tag>-<segment>.arrow`` holds the partitions of one scan
group (thousands of small files make a few segment files, not thousands), each partition a run
of record batches; the group's ``g<first>-<tag>.json`` marker, written last (after an fsync of
the segments, atomically), says where each partition is, so a reader never sees half a group.
The fingerprint covers every file's path, size and mtime and the read options (:meth:`daskfeed.
source.Source.fingerprint`): changed data or options get a new directory, and older directories
of the same files are removed when a new one is made, as are temporary files that writers killed
mid-write left behind. Directories are created with mode 0700.

What is stored is what the feed needs, not the CSV's exact text: whole numbers exactly (int32
when they fit, else int64), decimals as parsed (float64), string columns dictionary-encoded,
timestamps as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from daskfeed import config
from daskfeed.exceptions import CacheError
from daskfeed.files import compression_of
from daskfeed.tables import iter_tables

__all__ = ["CacheEntry", "PartitionCache", "block_tables", "clear", "default_root", "estimate_bytes",
           "list_entries", "open_cache"]

CACHE_VERSION = 3  # 3: whole numbers kept exact (int32/int64), decimals float64
FLUSH_BYTES = 16 << 20  # a segment file holds about this much Arrow data (memory: one per task)
STALE_TMP_SECONDS = 3600  # a writer renames its files within seconds; older ones were killed
# cache bytes per byte of input, per compression (measured on the demo data: uncompressed 0.87,
# lz4 0.61, zstd 0.32 of the CSV; kept conservative), for CSV and for compressed (.gz ...) files
_PER_INPUT_BYTE = {None: (1.0, 8.0), "lz4": (0.75, 5.0), "zstd": (0.6, 3.0)}
COMPRESSIONS = ("auto", "none", "lz4", "zstd")
_MARGIN = 1 << 30  # keep this much disk free beyond the estimate


def default_root() -> str:
    """``daskfeed.cache-dir`` if set, else ``$XDG_CACHE_HOME/daskfeed`` (``~/.cache/daskfeed``)."""
    root = config.get("cache-dir")
    if root:
        return os.path.expanduser(os.fspath(root))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "daskfeed")


def estimate_bytes(source: Any, compression: str | None = "zstd") -> int:
    """Disk the cache of ``source`` will take with ``compression``, from the input sizes (generous)."""
    plain, packed = _PER_INPUT_BYTE[compression]
    return int(sum(f.size * (packed if compression_of(f.path) else plain) for f in source.files))


@dataclass(frozen=True)
class PartitionCache:
    """One data set's cache directory (picklable: it travels to the workers with each task).

    ``root`` None: :func:`default_root` where the cache is used, i.e. on each worker (a remote
    worker's home, not the trainer's); ``key``: the data's directory under the root.
    """

    root: str | None
    key: str = ""
    compression: str | None = None  # of the files this cache writes (None: memory-mapped reads)

    @property
    def path(self) -> str:
        """The directory, as seen by the process asking."""
        root = default_root() if self.root is None else self.root
        return os.path.join(root, self.key) if self.key else root

    def lookup(self, index: int) -> list[tuple[str, int, int]] | None:
        """Where partition ``index`` is: ``[(segment file, first batch, batches), ...]`` or None."""
        found = _index(self.path, refresh=False).get(index)
        if found is None:
            found = _index(self.path, refresh=True).get(index)
        return found

    def has(self, index: int) -> bool:
        """Whether partition ``index`` is complete in the cache."""
        return self.lookup(index) is not None

    def tables(self, index: int, columns: list[str] | None = None,
               readers: dict[str, Any] | None = None) -> list[Any] | None:
        """The cached tables of partition ``index`` (None: not cached, or unreadable).

        ``columns``: only these (the others are not even decompressed); ``readers``: open
        segment files to reuse across calls (a window reads many partitions of one file).
        """
        import pyarrow as pa

        pieces = self.lookup(index)
        if pieces is None:
            return None
        readers = {} if readers is None else readers
        try:
            return [_read_piece(os.path.join(self.path, name), first, count, columns, readers)
                    for name, first, count in pieces]
        except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:  # damaged: reparse
            import warnings

            warnings.warn(f"daskfeed: cached partition {index} in {self.path} is unreadable "
                          f"({type(err).__name__}: {err}); parsing it from the CSV again.",
                          stacklevel=2)
            _forget(self.path, index)
            return None

    def writer(self, first: int) -> _Writer:
        """A writer for a group of partitions starting at ``first``: ``add``, then ``commit``."""
        return _Writer(self, first)

    def cached_partitions(self) -> int:
        """Number of complete partitions in the cache."""
        return len(_index(self.path, refresh=True))


# Per worker process: cache path -> (markers already read, partition -> pieces). Markers are
# written once and never change, so only new ones are read when a partition is not found.
_INDEXES: dict[str, tuple[set[str], dict[int, list[tuple[str, int, int]]]]] = {}
_INDEX_LOCK = threading.Lock()


def _index(path: str, refresh: bool) -> dict[int, list[tuple[str, int, int]]]:
    with _INDEX_LOCK:
        seen, parts = _INDEXES.setdefault(path, (set(), {}))
        if not refresh and parts:
            return parts
        try:
            names = sorted(n for n in os.listdir(path) if n.startswith("g") and n.endswith(".json"))
        except OSError:
            return parts
        fresh = []
        for name in names:
            if name in seen:
                continue
            try:
                with open(os.path.join(path, name), encoding="utf-8") as f:
                    meta = json.load(f)
                stamp = os.stat(os.path.join(path, name)).st_mtime_ns
            except (OSError, ValueError):
                continue
            seen.add(name)
            if meta.get("version") == CACHE_VERSION:
                fresh.append((stamp, meta))
        for _, meta in sorted(fresh, key=lambda m: m[0]):  # a rewritten partition: newest wins
            for key, pieces in meta["parts"].items():
                parts[int(key)] = [(str(n), int(b), int(c)) for n, b, c in pieces]
        return parts


def _forget(path: str, index: int) -> None:
    with _INDEX_LOCK:
        if path in _INDEXES:
            _INDEXES[path][1].pop(index, None)


def _read_piece(path: str, first: int, count: int, columns: list[str] | None,
                readers: dict[str, Any]) -> Any:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    reader = readers.get(path)
    if reader is None:
        source = pa.memory_map(path)  # batches of an uncompressed file are views of the mapping
        reader = ipc.open_file(source)
        if columns is not None:
            keep = [i for i, f in enumerate(reader.schema) if f.name in set(columns)]
            reader = ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=keep))
        readers[path] = reader
    batches = [reader.get_batch(b) for b in range(first, first + count)]
    return pa.Table.from_batches(batches, schema=reader.schema)


class _Writer:
    """Writes a group of partitions as a few Arrow IPC segment files, then one marker.

    Tables are kept until about ``FLUSH_BYTES`` have accumulated (or the next table's columns
    cannot share a file with them), then written as one segment (see :func:`_compact` for the
    column types; one dictionary per string column per segment); uncompressed (read as a memory
    map, nothing to decode) or zstd, see :func:`open_cache`. Every partition is a run of
    record batches of a segment. ``commit`` renames the segments into place and writes the marker
    last, so a reader never sees half a group.
    """

    def __init__(self, cache: PartitionCache, first: int) -> None:
        self.cache = cache
        self.stem = f"g{first:06d}-{uuid.uuid4().hex[:8]}"
        self.tag = f".tmp-{os.getpid()}"
        self.pending: list[tuple[int, Any]] = []
        self.pending_bytes = 0
        self.schema: Any = None  # the pending tables' columns, unified
        self.parts: dict[int, list[tuple[str, int, int]]] = {}
        self.segments: list[str] = []
        self.failed = False

    def begin(self, index: int) -> None:
        """Partition ``index`` starts (it is cached even if it has no rows)."""
        self.parts.setdefault(index, [])

    def add(self, index: int, table: Any) -> None:
        """One table of partition ``index``."""
        if self.failed:
            return
        import pyarrow as pa

        table = _compact(table)
        schema = table.schema
        if self.pending:
            try:
                schema = pa.unify_schemas([self.schema, table.schema], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. text here, numbers before
                self._flush()
        self.schema = schema
        self.begin(index)
        self.pending.append((index, table))
        self.pending_bytes += table.nbytes
        if self.pending_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.failed or not self.pending:
            return
        import pyarrow as pa
        import pyarrow.ipc as ipc

        name = f"{self.stem}-{len(self.segments):03d}.arrow"
        path = os.path.join(self.cache.path, name + self.tag)
        try:
            tables = [t for _, t in self.pending]
            whole = pa.concat_tables(tables, promote_options="permissive")
            whole = whole.unify_dictionaries()  # one dictionary per column per file
            schema = whole.schema
            with pa.OSFile(path, "wb") as f, ipc.new_file(
                f, schema, options=ipc.IpcWriteOptions(compression=self.cache.compression)
            ) as w:
                batch = 0
                offset = 0
                for index, t in self.pending:
                    batches = whole.slice(offset, t.num_rows).to_batches()  # [] if no rows
                    offset += t.num_rows
                    for b in batches:
                        w.write_batch(b)
                    self.parts[index].append((name, batch, len(batches)))
                    batch += len(batches)
            _fsync(path)  # the data is on disk before a marker can point at it
        except (OSError, pa.ArrowException):  # disk full or gone: the feed still works, from CSV
            self.failed = True
            self.abort()
            return
        finally:
            self.pending = []
            self.pending_bytes = 0
            self.schema = None
        self.segments.append(name)

    def commit(self) -> None:
        """Write what is pending, rename the segments into place, then write the marker."""
        self._flush()
        if self.failed:
            return
        try:
            for name in self.segments:
                final = os.path.join(self.cache.path, name)
                os.replace(final + self.tag, final)
            marker = os.path.join(self.cache.path, f"{self.stem}.json")
            with open(marker + self.tag, "w", encoding="utf-8") as f:
                json.dump({"version": CACHE_VERSION, "parts": {str(k): v for k, v in self.parts.items()}},
                          f)
            os.replace(marker + self.tag, marker)
        except OSError:
            self.abort()

    def abort(self) -> None:
        """Remove whatever this writer left behind."""
        self.failed = True
        for name in [*self.segments, f"{self.stem}-{len(self.segments):03d}.arrow"]:
            for suffix in (self.tag, ""):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.cache.path, name + suffix))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _compact(table: Any) -> Any:
    """Columns as the cache keeps them.

    Whole numbers exact (int32 when they fit, else int64), decimals as parsed (float64),
    strings dictionary-encoded.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = []
    for col in table.columns:
        t = col.type
        if pa.types.is_integer(t) and t != pa.int32():
            bounds = pc.min_max(col)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo is None or (-(2**31) <= lo and hi < 2**31):
                col = col.cast(pa.int32())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            col = pc.dictionary_encode(col)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def block_tables(index: int, block: Any, options: Any, cache: PartitionCache | None,
                 rejects: list[str] | None = None, *, use_cache: bool = True,
                 writer: _Writer | None = None, columns: list[str] | None = None,
                 readers: dict[str, Any] | None = None) -> Iterator[Any]:
    """Arrow tables of partition ``index``: from the cache, else parsed (and then cached).

    ``writer``: the scan's writer of a group of partitions (committed by the caller); without
    one, a partition parsed here is cached on its own. ``columns`` and ``readers``: see
    :meth:`PartitionCache.tables` (tables parsed from CSV have every column).
    """
    if cache is not None and use_cache:
        cached = cache.tables(index, columns, readers)
        if cached is not None:
            yield from cached
            return
    own = writer is None and cache is not None
    if own:
        assert cache is not None
        writer = cache.writer(index)
    try:
        if writer is not None:
            writer.begin(index)
        for table in iter_tables(block, options, rejects):
            if writer is not None:
                writer.add(index, table)
            yield table
    except BaseException:
        if own and writer is not None:
            writer.abort()
        raise
    if own and writer is not None:
        writer.commit()


# ------------------------------------------------------------------------- trainer side
def _identity(source: Any) -> str:
    """The same files, whatever their sizes, mtimes, partitioning and read options (for clean-up).

    One data set has one cache entry: an entry of the same paths made for other file contents
    or other read options is replaced by the new one, not kept beside it.
    """
    payload = json.dumps([f.path for f in source.files])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def open_cache(source: Any, root: str | os.PathLike[str] | None = None, *, required: bool = False,
               client: Any = None, compression: str | None = None) -> tuple[PartitionCache | None, str]:
    """Prepare the cache directory of ``source``; return it (or None) and a line saying why.

    The free space is checked up front against :func:`estimate_bytes`. ``compression``
    (default ``daskfeed.cache-compression``): ``"auto"`` writes uncompressed files (epochs read
    them as memory maps: several times faster than decoding) when the disk has room for them,
    else zstd (about a third of the CSV); or ``"none"``, ``"lz4"``, ``"zstd"``. With
    ``required`` (an explicit ``--cache DIR``) too little room is a :class:`CacheError`;
    otherwise the cache is left off and the reason returned. The default directory is
    resolved, created and checked on the workers (on a remote cluster: their disk).
    """
    if source.frame is not None:
        return None, "cache: off (the data is a dask DataFrame)"
    choice = str(config.get("cache-compression", compression))
    if choice not in COMPRESSIONS:
        raise ValueError(f"Expected cache compression in {COMPRESSIONS}. Received: {choice!r}.")
    candidates = [None, "zstd"] if choice == "auto" else [None if choice == "none" else choice]
    # an explicit directory is taken as given; the default is resolved on each worker
    base = os.path.abspath(os.path.expanduser(os.fspath(root))) if root else None
    key = source.fingerprint()
    args = (base, key, _identity(source), source.nbytes, _describe_data(source))
    where = base or "the workers' default cache directory"
    try:
        results = [_prepare(*args)] if client is None else list(client.run(_prepare, *args).values())
        free = min(r[0] for r in results)
        reused = min(r[1] for r in results)
        entries = sorted({r[2] for r in results})
    except OSError as err:
        where = getattr(err, "filename", None) or where
        if required:
            raise CacheError(
                f"Expected a writable cache directory. Received: {where} ({err.strerror or err}).\n"
                "Hint: pass --cache DIR on a writable disk, or --no-cache."
            ) from err
        return None, f"cache: off ({where} is not writable: {err.strerror or err})"
    where = entries[0] if len(entries) == 1 else f"{entries[0]} and {len(entries) - 1} other path(s)"
    fits = [c for c in candidates if reused or free >= estimate_bytes(source, c) + _MARGIN]
    if not fits:
        need = estimate_bytes(source, candidates[-1])
        msg = (f"Expected at least {(need + _MARGIN) / 1e9:.1f} GB free for the parse cache "
               f"({need / 1e9:.1f} GB estimated + 1 GB margin) in {os.path.dirname(where)}. "
               f"Received: {free / 1e9:.1f} GB free.")
        if required:
            raise CacheError(f"{msg}\nHint: pass --cache DIR on a larger disk, or --no-cache.")
        return None, f"cache: off — {msg}"
    cache = PartitionCache(base, key, fits[0])
    need = estimate_bytes(source, fits[0])
    state = (f"{reused} of the partitions cached" if reused else
             f"~{need / 1e9:.2f} GB to write {fits[0] or 'uncompressed'}, {free / 1e9:.0f} GB free")
    return cache, f"cache: {where} ({state})"


def _describe_data(source: Any) -> str:
    """E.g. ``data/log_quest/a.csv and 1,599 more files`` (for ``daskfeed cache list``)."""
    first = source.files[0].path if source.files else "?"
    more = len(source.files) - 1
    return f"{first} and {more:,} more file{'s' if more > 1 else ''}" if more else first


def _prepare(base: str | None, key: str, identity: str, nbytes: int,
             data: str = "") -> tuple[int, int, str]:
    """Create the entry ``key`` (0700) under ``base`` and drop stale entries of the same files.

    ``base`` None: this process's default root (run on each worker). Returns (free bytes,
    cached partitions, the entry's path).
    """
    base = default_root() if base is None else base
    entry = os.path.join(base, key)
    with _INDEX_LOCK:  # this process may have read an earlier directory of that name
        _INDEXES.pop(entry, None)
    os.makedirs(base, mode=0o700, exist_ok=True)
    for name in os.listdir(base):
        other = os.path.join(base, name)
        if other == entry or not os.path.isdir(other):
            continue
        try:
            with open(os.path.join(other, "meta.json"), encoding="utf-8") as f:
                same_files = json.load(f).get("identity") == identity
        except (OSError, ValueError):
            continue
        if same_files:  # the files changed since: that cache can never be read again
            shutil.rmtree(other, ignore_errors=True)
    os.makedirs(entry, mode=0o700, exist_ok=True)
    os.chmod(entry, 0o700)
    _sweep(entry)
    meta = os.path.join(entry, "meta.json")
    if not os.path.exists(meta):
        tmp = f"{meta}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"identity": identity, "csv_bytes": nbytes, "created": time.time(),
                       "version": CACHE_VERSION, "data": data}, f)
        os.replace(tmp, meta)
    cached = PartitionCache(entry).cached_partitions()
    return shutil.disk_usage(entry).free, cached, entry


def _sweep(entry: str, now: float | None = None) -> int:
    """Remove temporary files killed writers left (older than an hour) and old-layout files.

    Returns how many files were removed.
    """
    now = time.time() if now is None else now
    removed = 0
    for name in os.listdir(entry):
        path = os.path.join(entry, name)
        try:
            stale = ".tmp-" in name and now - os.stat(path).st_mtime > STALE_TMP_SECONDS
            if stale or (name.startswith("p") and name.endswith((".arrow", ".json"))):  # version 1
                os.remove(path)
                removed += 1
        except OSError:
            continue
    return removed


# ------------------------------------------------------------------ daskfeed cache list / clear
@dataclass(frozen=True)
class CacheEntry:
    """One data set's cache directory, as ``daskfeed cache list`` shows it."""

    path: str
    data: str  # which files (the first path and how many more)
    size: int  # bytes on disk
    csv_bytes: int  # bytes of the input it holds
    created: float


def list_entries(root: str | os.PathLike[str] | None = None) -> list[CacheEntry]:
    """The cache entries under ``root`` (default :func:`default_root`), largest first."""
    base = os.fspath(root) if root is not None else default_root()
    entries = []
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    for name in names:
        path = os.path.join(base, name)
        try:
            with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue  # not a daskfeed cache entry
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(path) for n in fs)
        entries.append(CacheEntry(path, str(meta.get("data") or "(files not recorded)"), size,
                                  int(meta.get("csv_bytes", 0)), float(meta.get("created", 0.0))))
    return sorted(entries, key=lambda e: -e.size)


def clear(root: str | os.PathLike[str] | None = None, keys: list[str] | None = None) -> list[CacheEntry]:
    """Remove the cache entries under ``root`` (all, or those whose directory name is in ``keys``).

    Returns what was removed.
    """
    removed = []
    for entry in list_entries(root):
        if keys is None or os.path.basename(entry.path) in keys:
            shutil.rmtree(entry.path, ignore_errors=True)
            with _INDEX_LOCK:
                _INDEXES.pop(entry.path, None)
            removed.append(entry)
    return removed
