"""Cache: every block parsed once, kept as Arrow IPC files on the workers' disk.

The scan parses each CSV block once and, while it is in memory, writes it here; every epoch
after that reads Arrow instead of CSV (several times faster to read than to parse). A block
that is missing (the manifest came from an earlier run, a worker on another machine, a damaged
or deleted cache file) is parsed again and written then.

Layout: ``<root>/<fingerprint>/g<first>-<tag>-<n>.arrow`` holds the blocks of one scan task
(thousands of small files make a few Arrow files, not thousands), each block a range of record
batches; the task's ``g<first>-<tag>.json`` marker, written last (:mod:`daskfeed.cache_writer`),
says where each block is, so a reader never sees half a task's blocks. The fingerprint covers
every file's path, size and mtime and the read options (:meth:`daskfeed.source.Source.
fingerprint`): changed data or options get a new directory, and older directories of the same
files are removed when a new one is made, as are temporary files that writers killed mid-write
left behind. Directories are created with mode 0700.

What is stored is what the feed needs, not the CSV's exact text: whole numbers exactly (int32
when they fit, else int64), decimals as parsed (float64), string columns dictionary-encoded,
timestamps as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.ipc as ipc

from daskfeed.atomic import write_file
from daskfeed.cache_writer import CACHE_VERSION, BatchRange, CacheWriter
from daskfeed.exceptions import CacheError
from daskfeed.files import Block, compression_of
from daskfeed.source import Source
from daskfeed.tables import ReadOptions, iter_tables

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["COMPRESSIONS", "BlockCache", "block_tables", "default_root", "estimate_bytes",
           "forget_entry", "open_cache"]

STALE_TMP_SECONDS = 3600  # a writer renames its files within seconds; older ones were killed
REMOVING = ".removing-"  # an entry being removed is renamed to ``<key>.removing-<tag>`` first
# cache bytes per byte of input, per compression (measured on the demo data: uncompressed 0.87,
# lz4 0.61, zstd 0.32 of the CSV; kept conservative), for CSV and for compressed (.gz ...) files
_PER_INPUT_BYTE = {None: (1.0, 8.0), "lz4": (0.75, 5.0), "zstd": (0.6, 3.0)}
COMPRESSIONS = ("auto", "none", "lz4", "zstd")
_MARGIN = 1 << 30  # keep this much disk free beyond the estimate
Readers = dict[str, ipc.RecordBatchFileReader]  # open Arrow files, by path


def default_root() -> str:
    """The cache root when none is given: ``$XDG_CACHE_HOME/daskfeed`` (``~/.cache/daskfeed``).

    Returns
    -------
    str
        As seen by the process asking (on a worker: the worker's home).
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "daskfeed")


def estimate_bytes(source: Source, compression: str | None = "zstd") -> int:
    """Disk the cache of ``source`` will take with ``compression``, from the input sizes (generous).

    Parameters
    ----------
    source
        The data.
    compression
        Of the cache files: None, ``"lz4"`` or ``"zstd"``.

    Returns
    -------
    int
        Bytes.
    """
    plain, packed = _PER_INPUT_BYTE[compression]
    return int(sum(f.size * (packed if compression_of(f.path) else plain) for f in source.files))


@dataclass(frozen=True)
class BlockCache:
    """One data set's cache directory (picklable: it travels to the workers with each task).

    ``root`` None: :func:`default_root` where the cache is used, i.e. on each worker (a remote
    worker's home, not the trainer's); ``key``: the data's directory under the root. Blocks
    are numbered as in ``Source.blocks``.
    """

    root: str | None
    key: str = ""
    compression: str | None = None  # of the files this cache writes (None: memory-mapped reads)

    @property
    def path(self) -> str:
        """The directory, as seen by the process asking."""
        root = default_root() if self.root is None else self.root
        return os.path.join(root, self.key) if self.key else root

    def lookup(self, index: int) -> list[BatchRange] | None:
        """Where block ``index`` is: ``[(Arrow file, first batch, batches), ...]`` or None.

        Parameters
        ----------
        index
            The block's index in the source.

        Returns
        -------
        list of BatchRange or None
            The block's record batches; None when it is not (completely) cached.
        """
        found = _index(self.path, refresh=False).get(index)
        if found is None:
            found = _index(self.path, refresh=True).get(index)
        return found

    def has(self, index: int) -> bool:
        """Whether block ``index`` is complete in the cache.

        Parameters
        ----------
        index
            The block's index in the source.

        Returns
        -------
        bool
            True when the block is complete in the cache.
        """
        return self.lookup(index) is not None

    def tables(self, index: int, columns: list[str] | None = None,
               readers: Readers | None = None) -> list[pa.Table] | None:
        """The cached tables of block ``index`` (None: not cached, or unreadable).

        Parameters
        ----------
        index
            The block.
        columns
            Only these (the others are not even decompressed); None: all.
        readers
            Open Arrow files to reuse across calls (a window reads many blocks of one file).

        Returns
        -------
        list of pyarrow.Table or None
            None also when a file is damaged (with a warning; the block is parsed again).
        """
        ranges = self.lookup(index)
        if ranges is None:
            return None
        readers = {} if readers is None else readers
        try:
            return [_read_batches(os.path.join(self.path, name), first, count, columns, readers)
                    for name, first, count in ranges]
        except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as err:  # damaged: reparse
            warnings.warn(f"daskfeed: cached block {index} in {self.path} is unreadable "
                          f"({type(err).__name__}: {err}); parsing it from the CSV again.",
                          stacklevel=2)
            _forget(self.path, index)
            return None

    def writer(self, first: int) -> CacheWriter:
        """A writer for the blocks of a scan task starting at ``first``: ``add``, then ``commit``.

        Parameters
        ----------
        first
            The scan task's first block.

        Returns
        -------
        CacheWriter
            A writer into this cache entry.
        """
        return CacheWriter(self.path, self.compression, first)

    def cached_blocks(self) -> int:
        """Number of complete blocks in the cache.

        Returns
        -------
        int
            The blocks complete in the cache.
        """
        return len(_index(self.path, refresh=True))


# Per worker process: cache path -> (markers already read, block -> batch ranges). Markers are
# written once and never change, so only new ones are read when a block is not found.
_INDEXES: dict[str, tuple[set[str], dict[int, list[BatchRange]]]] = {}
_INDEX_LOCK = threading.Lock()


def _index(path: str, refresh: bool) -> dict[int, list[BatchRange]]:
    with _INDEX_LOCK:
        seen, blocks = _INDEXES.setdefault(path, (set(), {}))
        if not refresh and blocks:
            return blocks
        try:
            names = sorted(n for n in os.listdir(path) if n.startswith("g") and n.endswith(".json"))
        except OSError:
            return blocks
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
        for _, meta in sorted(fresh, key=lambda m: m[0]):  # a rewritten block: newest wins
            for key, ranges in meta["parts"].items():
                blocks[int(key)] = [(str(n), int(b), int(c)) for n, b, c in ranges]
        return blocks


def forget_entry(path: str) -> None:
    """Drop what this process knows of the cache entry ``path`` (it is replaced or removed).

    Parameters
    ----------
    path
        The cache entry's directory.
    """
    with _INDEX_LOCK:
        _INDEXES.pop(path, None)


def _forget(path: str, index: int) -> None:
    with _INDEX_LOCK:
        if path in _INDEXES:
            _INDEXES[path][1].pop(index, None)


def _read_batches(path: str, first: int, count: int, columns: list[str] | None,
                  readers: Readers) -> pa.Table:
    """Record batches ``[first, first + count)`` of the Arrow file ``path`` as a table."""
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


def block_tables(index: int, block: Block, options: ReadOptions, cache: BlockCache | None,
                 rejects: list[str] | None = None, *, use_cache: bool = True,
                 writer: CacheWriter | None = None, columns: list[str] | None = None,
                 readers: Readers | None = None) -> Iterator[pa.Table]:
    """Arrow tables of block ``index``: from the cache, else parsed (and then cached).

    Parameters
    ----------
    index, block, options
        The block, its number and how to parse it.
    cache
        Where blocks are cached (None: parse, cache nothing).
    rejects
        See :func:`daskfeed.tables.iter_tables`.
    use_cache
        False: parse even when the block is cached.
    writer
        The scan task's writer (committed by the caller); without one, a block parsed here is
        cached on its own.
    columns, readers
        See :meth:`BlockCache.tables` (tables parsed from CSV have every column).

    Yields
    ------
    pyarrow.Table
        The block's rows in file order.
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
def _identity(source: Source) -> str:
    """The same files, whatever their sizes, mtimes, partitioning and read options (for clean-up).

    One data set has one cache entry: an entry of the same paths made for other file contents
    or other read options is replaced by the new one, not kept beside it.
    """
    payload = json.dumps([f.path for f in source.files])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def open_cache(source: Source, root: str | os.PathLike[str] | None = None, *,
               compression: str = "auto", required: bool = False,
               client: Client | None = None) -> tuple[BlockCache | None, str]:
    """Prepare the cache directory of ``source``; return it (or None) and a line saying why.

    Parameters
    ----------
    source
        The data (a dask DataFrame is not cached).
    root
        The cache root (the caller resolves ``daskfeed.cache-dir``); None: :func:`default_root`
        resolved, created and checked on the workers (on a remote cluster: their disk).
    compression
        ``"auto"`` writes uncompressed files (epochs read them as memory maps: several times
        faster than decoding) when the disk has room for them, else zstd (about a third of the
        CSV); or ``"none"``, ``"lz4"``, ``"zstd"`` (the caller resolves
        ``daskfeed.cache-compression``).
    required
        True (an explicit ``--cache DIR``): too little room or an unwritable directory is an
        error; False: the cache is left off and the reason returned.
    client
        Prepares the directory on every worker; None: in this process.

    Returns
    -------
    tuple
        The cache (None: off) and one line saying where it is, or why it is off.

    Raises
    ------
    CacheError
        With ``required``, when the directory is not writable or the disk too small.
    ValueError
        For an unknown ``compression``.
    """
    if source.frame is not None:
        return None, "cache: off (the data is a dask DataFrame)"
    choice = str(compression)
    if choice not in COMPRESSIONS:
        raise ValueError(f"Expected cache compression in {COMPRESSIONS}. Received: {choice!r}.")
    candidates = [None, "zstd"] if choice == "auto" else [None if choice == "none" else choice]
    # an explicit directory is taken as given; the default is resolved on each worker
    base = os.path.abspath(os.path.expanduser(os.fspath(root))) if root else None
    key = source.fingerprint()
    args = (base, key, _identity(source), source.nbytes, _describe_data(source))
    try:
        results = [_prepare(*args)] if client is None else list(client.run(_prepare, *args).values())
    except OSError as err:
        return None, _unwritable(err, base or "the workers' default cache directory", required)
    free = min(r[0] for r in results)
    reused = min(r[1] for r in results)
    entries = sorted({r[2] for r in results})
    where = entries[0] if len(entries) == 1 else f"{entries[0]} and {len(entries) - 1} other path(s)"
    fits = [c for c in candidates if reused or free >= estimate_bytes(source, c) + _MARGIN]
    if not fits:
        return None, _too_small(source, candidates[-1], free, where, required)
    need = estimate_bytes(source, fits[0])
    state = (f"{reused} of the blocks cached" if reused else
             f"~{need / 1e9:.2f} GB to write {fits[0] or 'uncompressed'}, {free / 1e9:.0f} GB free")
    return BlockCache(base, key, fits[0]), f"cache: {where} ({state})"


def _remove_entry(path: str) -> None:
    """Remove a cache entry for good, renamed away first.

    A window task of a sequence already closed may still be re-caching a block in it: a file it
    creates while ``rmtree`` runs would keep the directory (and its name) alive. Renamed, the
    name is gone at once and a late writer fails to write under it (it then leaves the block
    uncached, as on a full disk). Another worker removing the same entry renames it first:
    then there is nothing left to do here.
    """
    gone = f"{path}{REMOVING}{os.getpid()}-{threading.get_ident()}"
    try:
        os.rename(path, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def _unwritable(err: OSError, where: str, required: bool) -> str:
    """Why the cache is off for want of a writable directory; a :class:`CacheError` if ``required``."""
    where = getattr(err, "filename", None) or where
    if required:
        raise CacheError(
            f"Expected a writable cache directory. Received: {where} ({err.strerror or err}).\n"
            "Hint: pass --cache DIR on a writable disk, or --no-cache."
        ) from err
    return f"cache: off ({where} is not writable: {err.strerror or err})"


def _too_small(source: Source, compression: str | None, free: int, where: str,
               required: bool) -> str:
    """Why the cache is off for want of disk; raised as a :class:`CacheError` if ``required``."""
    need = estimate_bytes(source, compression)
    msg = (f"Expected at least {(need + _MARGIN) / 1e9:.1f} GB free for the parse cache "
           f"({need / 1e9:.1f} GB estimated + 1 GB margin) in {os.path.dirname(where)}. "
           f"Received: {free / 1e9:.1f} GB free.")
    if required:
        raise CacheError(f"{msg}\nHint: pass --cache DIR on a larger disk, or --no-cache.")
    return f"cache: off — {msg}"


def _describe_data(source: Source) -> str:
    """E.g. ``data/log_quest/a.csv and 1,599 more files`` (for ``daskfeed cache list``)."""
    first = source.files[0].path if source.files else "?"
    more = len(source.files) - 1
    return f"{first} and {more:,} more file{'s' if more > 1 else ''}" if more else first


def _prepare(base: str | None, key: str, identity: str, nbytes: int,
             data: str = "") -> tuple[int, int, str]:
    """Create the entry ``key`` (0700) under ``base`` and drop stale entries of the same files.

    ``base`` None: this process's default root (run on each worker). Returns (free bytes,
    cached blocks, the entry's path).
    """
    base = default_root() if base is None else base
    entry = os.path.join(base, key)
    forget_entry(entry)  # this process may have read an earlier directory of that name
    os.makedirs(base, mode=0o700, exist_ok=True)
    for name in os.listdir(base):
        other = os.path.join(base, name)
        if other == entry or not os.path.isdir(other):
            continue
        if REMOVING in name:  # a removal cut short (or still going on: rmtree twice is harmless)
            shutil.rmtree(other, ignore_errors=True)
            continue
        try:
            with open(os.path.join(other, "meta.json"), encoding="utf-8") as f:
                same_files = json.load(f).get("identity") == identity
        except (OSError, ValueError):
            continue
        if same_files:  # the files changed since: that cache can never be read again
            _remove_entry(other)
    os.makedirs(entry, mode=0o700, exist_ok=True)
    os.chmod(entry, 0o700)
    _sweep(entry)
    meta = os.path.join(entry, "meta.json")
    if not os.path.exists(meta):
        write_file(meta, json.dumps({"identity": identity, "csv_bytes": nbytes, "created": time.time(),
                                     "version": CACHE_VERSION, "data": data}))
    cached = BlockCache(entry).cached_blocks()
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
