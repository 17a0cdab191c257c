"""Opening the parse cache of a data set, on the trainer: where, in which compression, with room.

:func:`open_cache` picks the entry of these files and read options under the cache root
(``daskfeed.cache-dir``, else :func:`default_root`), checks the disk has room for it
(:func:`estimate_bytes`), removes entries made for other contents of the same files (renamed
away first), entries of another cache format and the temporary files of writers killed
mid-write, evicts least recently used entries beyond ``daskfeed.cache-max-size``, and returns
the :class:`~daskfeed.cache._blocks.BlockCache` the workers read and write
(:mod:`daskfeed.cache._blocks`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes

from daskfeed.cache._arrow import forget_entry
from daskfeed.cache._blocks import BlockCache, part_salt, start_heartbeat
from daskfeed.cache._evict import REMOVING, evict, lease, root_lock, trainer_tag
from daskfeed.cache._layout import default_root
from daskfeed.cache._lineage import Layout, layouts, remember
from daskfeed.cache._root import entry_meta, is_entry_name, own_dir, own_root
from daskfeed.cache._writer import CACHE_VERSION
from daskfeed.core import CacheError, SettingError, config, write_file
from daskfeed.reading import FileInfo, Source, compression_of, file_key

if TYPE_CHECKING:
    from distributed import Client

STALE_TMP_SECONDS = 3600  # a writer renames its files within seconds; older ones were killed


# cache bytes per byte of input, per compression (measured on the demo data: uncompressed 0.87,
# lz4 0.61, zstd 0.32 of the CSV; kept conservative), for CSV and for compressed (.gz ...) files
_PER_INPUT_BYTE = {None: (1.0, 8.0), "lz4": (0.75, 5.0), "zstd": (0.6, 3.0)}

COMPRESSIONS = ("auto", "none", "lz4", "zstd")

_MARGIN = 1 << 30  # keep this much disk free beyond the estimate
LOCK_TIMEOUT = 600.0  # seconds to wait for the root's lock (daskfeed.cache-lock-timeout)


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


def _identity(paths: list[str]) -> str:
    """The same files, whatever their sizes, mtimes, partitioning and read options (for clean-up).

    An entry of the same paths made for other file contents is replaced by the new one (it can
    never be read again); one made with other read options stays beside it (a run with another
    setting, even a wrong one, does not take a good entry away; ``daskfeed.cache-max-size``
    bounds what is kept).
    """
    return hashlib.sha256(json.dumps(paths).encode()).hexdigest()[:16]


PartEntry = tuple[str, str, int, dict[str, Any]]  # an entry's (key, identity, input bytes, meta to record)
#: what _prepare takes: (base, parts, tag, max_bytes, lock_timeout)
PrepareArgs = tuple[str | None, list[PartEntry], str, int | None, float]
#: what _prepare returns: (free bytes, cached blocks, root, format removed, (evicted, their bytes, left))
Prepared = tuple[int, int, str, int | None, tuple[int, int, int]]


def _entries(source: Source, found: list[Layout]) -> list[PartEntry]:
    """What :func:`_prepare` needs of each entry of ``source``'s parts (laid out as ``found``)."""
    out = []
    for part, layout in zip(source.parts(), found, strict=True):
        lo = part.files[0]
        for key, nfiles, _ in layout.entries:
            files = source.files[lo:lo + nfiles]
            lo += nfiles
            meta = {"data": _describe_data(files), "files": [file_key(f) for f in files]}
            out.append((key, _identity([f.path for f in files]), sum(f.size for f in files), meta))
    return out


def _block_cache(base: str | None, source: Source, found: list[Layout], compression: str | None,
                 tag: str) -> BlockCache:
    """The cache of ``source``: its parts' entries, where each starts and its first block's id."""
    keys, starts, ids = [], [], []
    for part, layout in zip(source.parts(), found, strict=True):
        at = part.blocks[0]
        for key, _, nblocks in layout.entries:
            keys.append(key)
            starts.append(at)
            ids.append(part_salt(part.anchor or part.key) + at - part.blocks[0])
            at += nblocks
    grown = tuple((n, *layout.grew_from) for n, layout in enumerate(found) if layout.grew_from)
    return BlockCache(base, tuple(keys), tuple(starts), tuple(ids), compression, lease=tag,
                      grown=grown)


@dataclass(frozen=True)
class CacheChoice:
    """Where a data set's parse cache goes, resolved once where the settings enter.

    Attributes
    ----------
    on
        False: no cache.
    root
        The cache root (``--cache DIR``, else ``daskfeed.cache-dir``); None: each worker's
        default (:func:`~daskfeed.cache.default_root`).
    required
        An explicit directory: too little room is an error, not a cache left off.
    compression
        ``daskfeed.cache-compression`` (``auto``, ``none``, ``lz4``, ``zstd``).
    max_size
        ``daskfeed.cache-max-size`` in bytes: least recently used parts of other data are
        evicted beyond it (see ``docs/data-that-grows.md``, "Housekeeping"); None: no bound.
    lock_timeout
        ``daskfeed.cache-lock-timeout`` in seconds: the longest wait for the root's lock.
    """

    on: bool = True
    root: str | None = None
    required: bool = False
    compression: str = "auto"
    max_size: int | None = None
    lock_timeout: float = LOCK_TIMEOUT

    @classmethod
    def resolve(cls, cache: bool | str | os.PathLike[str] | None) -> CacheChoice:
        """``True`` (the configured or default place), a directory, or ``False``/None (off)."""
        if cache is None or cache is False:
            return cls(on=False)
        root = None if cache is True else os.fspath(cache)
        bound = config.get("cache-max-size")
        return cls(root=root or config.cache_dir(), required=root is not None,
                   compression=str(config.get("cache-compression")),
                   max_size=None if bound in (None, "", 0) else parse_bytes(bound),
                   lock_timeout=config.cache_lock_timeout())

    def open(self, source: Source, client: Client | None) -> tuple[BlockCache | None, str]:
        """:func:`open_cache` as chosen: the cache (None: off) and the line saying so."""
        if not self.on:
            return None, "cache: off"
        return open_cache(source, self.root, compression=self.compression,
                          required=self.required, client=client, max_size=self.max_size,
                          lock_timeout=self.lock_timeout)


def open_cache(source: Source, root: str | os.PathLike[str] | None = None, *,
               compression: str = "auto", required: bool = False,
               client: Client | None = None, max_size: int | None = None,
               lock_timeout: float = LOCK_TIMEOUT) -> tuple[BlockCache | None, str]:
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
    max_size
        Bytes the root may hold: least recently used entries of other data, not in use, are
        evicted beyond it (see ``docs/data-that-grows.md``, "Housekeeping"); None: no bound.
    lock_timeout
        Seconds to wait for the root's lock.

    Returns
    -------
    tuple
        The cache (None: off) and one line saying where it is, or why it is off. Its parts are
        leased by this process, the leases renewed while it lives, until
        :meth:`~daskfeed.cache.BlockCache.release`.

    Raises
    ------
    CacheError
        With ``required``, when the directory is not writable or the disk too small; always,
        when the root (or a level under it) is not the user's own, or holds what daskfeed did
        not make (:func:`~daskfeed.cache.own_root`).
    SettingError
        For an unknown ``compression``.
    """
    if source.frame is not None:
        return None, "cache: off (the data is a dask DataFrame)"
    choice = str(compression)
    if choice not in COMPRESSIONS:
        raise SettingError(f"Expected cache compression in {COMPRESSIONS}. Received: {choice!r}."
                           "\nHint: daskfeed.cache-compression: auto, none, lz4 or zstd.")
    candidates = [None, "zstd"] if choice == "auto" else [None if choice == "none" else choice]
    # an explicit directory is taken as given; the default is resolved on each worker
    base = os.path.abspath(os.path.expanduser(os.fspath(root))) if root else None
    found = layouts(source, base or default_root())
    parts = _entries(source, found)
    tag = trainer_tag()
    args: PrepareArgs = (base, parts, tag, max_size, lock_timeout)
    try:
        results = [_prepare(*args)] if client is None else _on_workers(client, args)
    except CacheError:
        raise  # (an unsafe root is refused, whether the cache was asked for or not)
    except OSError as err:
        return None, _unwritable(err, base or "the workers' default cache directory", required)
    free = min(r[0] for r in results)
    reused = min(r[1] for r in results)
    entries = sorted({r[2] for r in results})
    where = entries[0] if len(entries) == 1 else f"{entries[0]} and {len(entries) - 1} other root(s)"
    fits = [c for c in candidates if reused or free >= estimate_bytes(source, c) + _MARGIN]
    if not fits:
        return None, _too_small(source, candidates[-1], free, where, required)
    need = estimate_bytes(source, fits[0])
    state = (f"{reused:,} of {source.npartitions:,} blocks cached" if reused else
             f"~{need / 1e9:.2f} GB to write {fits[0] or 'uncompressed'}, {free / 1e9:.0f} GB free")
    state += _removed(results, max_size)
    cache = _block_cache(base, source, found, fits[0], tag)
    remember(source, base or default_root(), found)
    start_heartbeat(cache, client)
    return cache, f"cache: {where} ({state})"


def _removed(results: list[Prepared], max_size: int | None) -> str:
    """What :func:`_prepare` removed on the workers, as the end of the cache's line ("" if nothing).

    Entries of another cache format, rebuilt; entries evicted for ``daskfeed.cache-max-size``, or
    the bytes kept over it because the rest is in use.
    """
    from dask.utils import format_bytes  # (dask is not loaded by `import daskfeed`)

    said = ""
    formats = sorted({r[3] for r in results if r[3] is not None})
    if formats:
        said += (f"; an entry in cache format {', '.join(map(str, formats))} was removed and is "
                 f"rebuilt in format {CACHE_VERSION}")
    evicted = sum(r[4][0] for r in results)
    if evicted:
        said += (f"; {evicted:,} least recently used entr{'y' if evicted == 1 else 'ies'} of other "
                 f"data ({format_bytes(sum(r[4][1] for r in results))}) evicted to stay under "
                 f"daskfeed.cache-max-size")
    kept = max(r[4][2] for r in results)
    if max_size is not None and kept > max_size:
        said += (f"; {format_bytes(kept)} kept, over daskfeed.cache-max-size "
                 f"({format_bytes(max_size)}): the rest is in use")
    return said


def _on_workers(client: Client, args: PrepareArgs) -> list[Prepared]:
    """:func:`_prepare` on every worker; a worker leaving meanwhile (scaled down) is left out."""
    from distributed.comm.core import CommClosedError

    out = []
    for result in client.run(_prepare, *args, on_error="return").values():
        if isinstance(result, CommClosedError):
            continue
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    if not out:
        raise OSError("no worker answered (all of them were leaving)")
    return out


def _remove_entry(path: str) -> bool:
    """Remove a cache entry for good, renamed away first.

    A window task of a sequence already closed may still be re-caching a block in it: a file it
    creates while ``rmtree`` runs would keep the directory (and its name) alive. Renamed, the
    name is gone at once and a late writer fails to write under it (it then leaves the block
    uncached, as on a full disk). Another worker removing the same entry renames it first:
    then there is nothing left to do here. Returns whether this call removed it.
    """
    gone = f"{path}{REMOVING}{os.getpid()}-{threading.get_ident()}"
    try:
        os.rename(path, gone)
    except OSError:
        return False
    shutil.rmtree(gone, ignore_errors=True)
    return True


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
           f"({need / 1e9:.1f} GB estimated + 1 GB margin) in {where}. "
           f"Received: {free / 1e9:.1f} GB free.")
    if required:
        raise CacheError(f"{msg}\nHint: pass --cache DIR on a larger disk, or --no-cache.")
    return f"cache: off — {msg}"


def _describe_data(files: list[FileInfo]) -> str:
    """E.g. ``data/log_quest/a.csv and 1,599 more files`` (for ``daskfeed cache list``)."""
    first = files[0].path if files else "?"
    more = len(files) - 1
    return f"{first} and {more:,} more file{'s' if more > 1 else ''}" if more else first


def _prepare(base: str | None, parts: list[PartEntry], tag: str = "", max_bytes: int | None = None,
             lock_timeout: float = LOCK_TIMEOUT,
             ) -> Prepared:
    """Create each part's entry (0700) under ``base``; drop stale entries of the same files.

    ``base`` None: this process's default root (run on each worker). The root is checked first
    (:func:`~daskfeed.cache._root.own_root`: ours, marked); only entries daskfeed made are
    touched: an entry of another cache format is removed (the scan writes it again), as is one
    of a part's paths made for other contents (one made with other read options is kept). Each
    part is marked used and leased by the trainer ``tag``; with ``max_bytes``, entries of other
    data are evicted beyond it (:func:`~daskfeed.cache._evict.evict`). Returns (free bytes,
    cached blocks, the root, the format of an entry removed for that, or None, and (entries
    evicted, their bytes, bytes left)). All of it under the root's lock
    (:func:`~daskfeed.cache._evict.root_lock`): no other process evicts or clears a part
    between its check of the leases and the removal.
    """
    base = default_root() if base is None else base
    own_root(base)
    with root_lock(base, lock_timeout):
        return _prepare_locked(base, parts, tag, max_bytes)


def _prepare_locked(base: str, parts: list[PartEntry], tag: str, max_bytes: int | None,
                    ) -> Prepared:
    ours = {key for key, _, _, _ in parts}
    contents = {identity: record["files"] for _, identity, _, record in parts}
    removed_format = None
    for name in os.listdir(base):
        other = os.path.join(base, name)
        if REMOVING in name and is_entry_name(name.split(REMOVING)[0]):
            if os.path.isdir(other) and not os.path.islink(other):  # a removal cut short
                shutil.rmtree(other, ignore_errors=True)  # (or going on: rmtree twice is harmless)
            continue
        meta = entry_meta(other)
        if meta is None:
            continue  # not a cache entry (or one being made)
        version = _version(meta)
        if version != CACHE_VERSION:  # written by another daskfeed: never read again
            forget_entry(other)
            _remove_entry(other)
            removed_format = version
        elif name not in ours and meta.get("identity") in contents and \
                meta.get("files") != contents[meta["identity"]]:
            forget_entry(other)  # the files changed since: that cache can never be read again
            _remove_entry(other)
    now = time.time()
    cached = 0
    for key, identity, nbytes, record in parts:
        entry = os.path.join(base, key)
        forget_entry(entry)  # this process may have read an earlier directory of that name
        own_dir(entry)
        _sweep(entry)
        meta_path = os.path.join(entry, "meta.json")
        if not os.path.exists(meta_path):
            write_file(meta_path, json.dumps({"identity": identity, "csv_bytes": nbytes, "created": now,
                                         "version": CACHE_VERSION, **record}), perms=0o600)
        cached += BlockCache(entry).cached_blocks()
        if tag:
            lease(entry, tag, now)
    evicted = (0, 0, 0) if max_bytes is None else evict(base, ours, max_bytes, _evicted)
    return shutil.disk_usage(base).free, cached, base, removed_format, evicted


def _evicted(path: str) -> bool:
    """Remove an entry evicted for the size bound (see :func:`_remove_entry`); whether it did."""
    forget_entry(path)
    return _remove_entry(path)


def _version(meta: dict[str, Any]) -> int:
    """The cache format a ``meta.json`` names (0: unreadable)."""
    try:
        return int(meta.get("version", 0))
    except (TypeError, ValueError):
        return 0


def _sweep(entry: str, now: float | None = None) -> int:
    """Remove the temporary files of writers killed mid-write (older than an hour) in ``entry``.

    Returns how many files were removed.
    """
    now = time.time() if now is None else now
    removed = 0
    for name in os.listdir(entry):
        path = os.path.join(entry, name)
        try:
            if ".tmp-" in name and now - os.lstat(path).st_mtime > STALE_TMP_SECONDS:
                os.remove(path)  # (a link itself, never its target)
                removed += 1
        except OSError:
            continue
    return removed
