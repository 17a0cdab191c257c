"""Cache entries on disk, as ``daskfeed cache list`` shows them and ``daskfeed cache clear`` removes them."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

from daskfeed.cache._arrow import forget_entry
from daskfeed.cache._buckets import remove_generations
from daskfeed.cache._evict import REMOVING, leased, root_lock
from daskfeed.cache._layout import default_root
from daskfeed.cache._root import entry_meta, own_dir, own_root
from daskfeed.core import config
from daskfeed.reading import FileInfo, stat_file


@dataclass(frozen=True)
class CacheEntry:
    """One data set's cache directory, as ``daskfeed cache list`` shows it."""

    path: str
    data: str  # which files (the first path and how many more)
    size: int  # bytes on disk
    csv_bytes: int  # bytes of the input it holds
    created: float
    files: tuple[tuple[str, int, float, str], ...] = ()  # (path, size, mtime, ETag) of its files


def list_entries(root: str | os.PathLike[str] | None = None) -> list[CacheEntry]:
    """The cache entries under ``root``, largest first.

    Parameters
    ----------
    root
        The cache root (the caller resolves ``daskfeed.cache-dir``); None: :func:`default_root`.

    Returns
    -------
    list of CacheEntry
        Directories without a readable ``meta.json`` are not daskfeed's and are left out, as
        are entries being removed.
    """
    base = os.fspath(root) if root is not None else default_root()
    entries = []
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    for name in names:
        path = os.path.join(base, name)
        meta = entry_meta(path)  # (an entry being removed is renamed: not an entry's name)
        if meta is None:
            continue  # not a daskfeed cache entry
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(path) for n in fs)
        files = tuple((str(f["path"]), int(f["size"]), float(f["mtime"]), str(f.get("etag", "")))
                      for f in meta.get("files", ()))
        entries.append(CacheEntry(path, str(meta.get("data") or "(files not recorded)"), size,
                                  int(meta.get("csv_bytes", 0)), float(meta.get("created", 0.0)),
                                  files))
    return sorted(entries, key=lambda e: -e.size)


def clear(root: str | os.PathLike[str] | None = None,
          keys: list[str] | None = None, lock_timeout: float | None = None) -> list[CacheEntry]:
    """Remove the cache entries under ``root`` (renamed away first), and what was made of them.

    Only under a root that is the user's and marked as daskfeed's
    (:func:`~daskfeed.cache.own_root`), only entries daskfeed made, none that a running
    trainer holds a lease on (see ``docs/data-that-grows.md``, "Housekeeping"); removing none, it removes
    nothing else either (not the scans' records).

    Parameters
    ----------
    root
        As for :func:`list_entries`.
    keys
        Only the entries whose directory name is in ``keys``; None: all.
    lock_timeout
        Seconds to wait for the root's lock; None: ``daskfeed.cache-lock-timeout``.

    Returns
    -------
    list of CacheEntry
        What was removed (an entry in use is not).

    Raises
    ------
    CacheError
        A root that is not the user's own, or not daskfeed's.
    """
    base = os.fspath(root) if root is not None else default_root()
    if not own_root(base, create=False):
        return []
    wait = config.cache_lock_timeout() if lock_timeout is None else lock_timeout
    with root_lock(base, wait):  # no trainer leases a part between its check and its removal
        return _clear_locked(base, keys)


def _clear_locked(base: str, keys: list[str] | None) -> list[CacheEntry]:
    removed = []
    now = time.time()
    for entry in list_entries(base):
        if (keys is None or os.path.basename(entry.path) in keys) and not leased(entry.path, now):
            forget_entry(entry.path)
            gone = f"{entry.path}{REMOVING}{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(OSError):
                os.rename(entry.path, gone)
                shutil.rmtree(gone, ignore_errors=True)
                removed.append(entry)
    if not removed:
        return removed
    everything = keys is None and not list_entries(base)  # (none kept in use)
    if everything and own_dir(os.path.join(base, "scans"), create=False):
        shutil.rmtree(os.path.join(base, "scans"), ignore_errors=True)  # (scanned again)
    # the sets made of a removed entry (a set of entries kept in use is a live trainer's: kept)
    _clear_buckets(base, None if everything else {os.path.basename(e.path) for e in removed})
    return removed


def _clear_buckets(base: str, parts: set[str] | None) -> None:
    """Remove the bucket sets made of any of ``parts`` (None: every set) under ``base``."""
    sets = os.path.join(base, "buckets")
    if not own_dir(sets, create=False):
        return
    if parts is None:
        shutil.rmtree(sets, ignore_errors=True)
        return
    remove_generations(sets, parts)


def gone_entries(root: str | os.PathLike[str] | None = None,
                 storage_options: dict[str, Any] | None = None) -> list[CacheEntry]:
    """The entries under ``root`` of files that changed or went since they were cached.

    Such an entry is never read again (a changed file makes a part of another key); an entry
    that does not record its files is not one of them.

    Parameters
    ----------
    root
        As for :func:`list_entries`.
    storage_options
        Passed to fsspec for files on object stores.

    Returns
    -------
    list of CacheEntry
        Largest first.
    """
    out = []
    for entry in list_entries(root):
        for path, size, mtime, etag in entry.files:
            try:
                now = stat_file(path, storage_options)
            except Exception:
                break  # not known to be gone: kept
            if now != FileInfo(path, size, mtime, etag):
                out.append(entry)
                break
    return out
