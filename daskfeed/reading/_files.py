"""Files: the input paths (glob, ``**``, directory, list, fsspec URL), their sizes, and blocks.

Listing gives each file's size, mtime and ETag in one request per pattern; :func:`make_blocks`
cuts the files into :class:`Block` s, the unit the scan counts, the cache stores and a
validation split assigns. Storage errors name the path and where credentials come from. A file
is known by its URL without credentials (:mod:`daskfeed.reading._credentials`).
"""

from __future__ import annotations

import glob
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from daskfeed.core import DataNotFoundError, redact_text, redact_url, warn_user
from daskfeed.reading._credentials import fsspec_target
from daskfeed.reading._suffixes import (
    COMPRESSIONS,
    CSV_SUFFIXES,
    PARQUET_SUFFIXES,
    compression_of,
    is_parquet,
)

_DATA_SUFFIXES = CSV_SUFFIXES + PARQUET_SUFFIXES


@dataclass(frozen=True)
class FileInfo:
    """One input file: path (with protocol for remote files), size in bytes, mtime, ETag.

    ``path`` is never a URL with credentials (:func:`~daskfeed.core.redact_url`): they
    are put back where the file is opened. ``etag`` is the object store's version tag (S3's
    ``ETag``; ``""`` for local files): an object rewritten within the same second at the same
    size still gets a new fingerprint.
    """

    path: str
    size: int
    mtime: float
    etag: str = ""


@dataclass(frozen=True)
class Block:
    """One block of the input: a byte range of one file (``length=-1``: the whole file).

    For a dask DataFrame input, ``path`` is ``"partition <i>"`` and ``file_index`` is ``i``.
    A byte range's records start after the first line break outside quoted fields at or after
    ``offset`` (speculated by each reader), unless ``start`` is set: then its records are exactly
    bytes ``start`` to ``stop`` (decided for the whole file, :meth:`daskfeed.Source.split_exactly`).
    """

    path: str
    offset: int
    length: int
    file_index: int
    start: int = -1
    stop: int = -1

    def describe(self) -> str:
        """Say which file and byte range this block covers, for error messages.

        Returns
        -------
        str
            ``"<path> (whole file)"`` or ``"<path> bytes <start>-<stop>"``.
        """
        if self.length < 0:
            return f"{self.path} (whole file)"
        if self.start >= 0:
            return f"{self.path} bytes {self.start}-{self.stop}"
        return f"{self.path} bytes {self.offset}-{self.offset + self.length}"


def protocol(path: str) -> str:
    """The fsspec protocol of ``path``.

    Parameters
    ----------
    path
        A local path or a URL.

    Returns
    -------
    str
        ``"s3"``, ``"gs"``, ... (``"file"`` for a local path).
    """
    return path.split("://", 1)[0] if "://" in path else "file"


def expand_paths(
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: dict[str, Any] | None = None,
    said: list[str] | None = None,
) -> list[FileInfo]:
    """Expand a path, glob (``**`` too), directory, URL or list of them into files.

    Parameters
    ----------
    data
        What the user gave; duplicates across items are listed once.
    storage_options
        Passed to fsspec (credentials, endpoint URL, ...), perhaps carrying the credentials of
        URLs (:func:`daskfeed.reading.url_credentials`).
    said
        Where what the listing has to say goes (files left out); None: warned at once.

    Returns
    -------
    list of FileInfo
        In the order of the items, each item's files sorted by path; a URL's files named
        without its credentials.

    Raises
    ------
    DataNotFoundError
        When a pattern matches nothing, a path does not exist, or storage refuses the listing.
    """
    storage_options = storage_options or {}
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not items:
        raise DataNotFoundError(
            "Expected at least one path or glob. Received: an empty list.\n"
            "Hint: pass a path such as 'data/log_quest/**/*.csv'."
        )
    files: dict[str, FileInfo] = {}
    for item in items:
        pattern = os.fspath(item)
        proto = protocol(pattern)
        for p, info in sorted(_listing(pattern, storage_options, said).items()):
            # (fsspec's http filesystem keeps whole URLs; the others strip the protocol)
            full = p if proto == "file" else redact_url(p if "://" in p else f"{proto}://{p}")
            if full not in files:
                files[full] = _file_info(full, info)
    return list(files.values())


def refuse_missing_local(data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> None:
    """Refuse at once, before a cluster starts, a local path or glob that names no file.

    Cheap: a glob stops at its first match (the full listing comes when the data are read);
    URLs are left to that listing. Raises what :func:`expand_paths` raises for them.
    """
    if not isinstance(data, (str, os.PathLike, list, tuple)):
        return  # e.g. a dask DataFrame: no paths
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not items:
        expand_paths(items)  # the empty list's error
    for item in items:
        matches = _local_matches(item)
        if matches is not None and next(matches, None) is None:
            _listing(os.fspath(item), {})  # lists afresh: raises its error when nothing is there


def _local_matches(item: object) -> Iterator[str] | None:
    """What a local path or glob names, as a glob's walk meets it (None: not a local path)."""
    if not isinstance(item, (str, os.PathLike)) or protocol(os.fspath(item)) != "file":
        return None  # a URL, or not a path: the listing (or the reader) says what it expects
    stripped = fsspec.filesystem("file")._strip_protocol(os.fspath(item))
    if fsspec.core.has_magic(stripped):
        return glob.iglob(stripped, recursive=True, include_hidden=True)
    return iter([stripped] if os.path.exists(stripped) else [])


def a_local_file(data: object, looks: int = 64) -> str | None:
    """A file that local ``data`` (a path or glob, or the first of a list) names, found at once.

    The first a glob's walk meets, not the first of the sorted listing: for a look at a header
    while the full listing goes on (thousands of files take seconds). None for URLs, other
    data, or when no file is among the first ``looks`` matches.
    """
    item = data[0] if isinstance(data, (list, tuple)) and data else data
    matches = _local_matches(item)
    if matches is None:
        return None
    for _, found in zip(range(looks), matches, strict=False):
        if os.path.isfile(found):
            return found
    return None


def _listing(pattern: str, storage_options: dict[str, Any],
             said: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The files ``pattern`` names, each with fsspec's details (size, mtime, ETag).

    Listed with the URL's credentials (given in it, or carried), named without them.
    """
    proto = protocol(pattern)
    target, options = fsspec_target(pattern, storage_options)
    pattern = redact_url(pattern)  # what messages name
    fs = fsspec.filesystem(proto, **options)
    stripped = fs._strip_protocol(target)
    # fsspec keeps filesystems (and s3fs their listings) per process: list afresh, so an
    # object rewritten since an earlier listing gets its new size, mtime and ETag
    fs.invalidate_cache()
    try:  # one listing gives names, sizes and mtimes: no request per file afterwards
        found = _list(fs, pattern, stripped, said)
    except DataNotFoundError:  # (also a FileNotFoundError): ours, already clear
        raise
    except PermissionError as err:
        raise DataNotFoundError(
            f"Cannot read {pattern!r}: permission denied. Received: {reason(err)}.\n"
            f"Hint: {credentials_hint(proto)}"
        ) from err
    except FileNotFoundError as err:  # a bucket that does not exist (the glob lists it)
        raise DataNotFoundError(
            f"Cannot list {pattern!r}. Received: {reason(err)}.\n"
            "Hint: check the bucket name and the endpoint (storage_options / "
            "--storage-options endpoint_url=...)."
        ) from err
    except Exception as err:
        if getattr(err, "status", None) not in (401, 403):  # an HTTP server's refusal
            raise
        raise DataNotFoundError(
            f"Cannot read {pattern!r}: permission denied. Received: {reason(err)}.\n"
            f"Hint: {credentials_hint(proto)}"
        ) from err
    if not found and proto != "file":
        _refuse_missing_bucket(fs, pattern, stripped)
    if not found:
        what = "No file matches" if fsspec.core.has_magic(stripped) else "No such file"
        where = os.path.abspath(stripped) if proto == "file" else pattern
        raise DataNotFoundError(
            f"{what}: {pattern!r} (looked in {where}).\n"
            "Hint: check the path and quote globs so the shell does not expand them, "
            "e.g. \"data/log_quest/**/*.csv\"."
        )
    return found


def _without_notes(found: dict[str, dict[str, Any]], pattern: str,
                   said: list[str] | None) -> dict[str, dict[str, Any]]:
    """A directory's data files: ``.txt`` files beside ``.csv``/``.tsv``/Parquet ones are left out.

    A ``README.txt`` or ``notes.txt`` next to the data is not data; a directory of ``.txt``
    files only is (many exports name their CSV so). What is left out is said, with the glob
    that reads it (warned, or appended to ``said``).
    """
    def text(path: str) -> bool:
        base = path.lower()
        for packed in COMPRESSIONS:
            base = base.removesuffix(packed)
        return base.endswith(".txt")

    notes = sorted(p for p in found if text(p))
    if not notes or len(notes) == len(found):
        return found
    shown = ", ".join(os.path.basename(p) for p in notes[:3]) + (" ..." if len(notes) > 3 else "")
    note = (f"Left out {len(notes)} .txt file(s) in the directory {pattern!r} ({shown}): "
            f"its data are the {len(found) - len(notes)} CSV/TSV/Parquet file(s) beside them."
            f"\nHint: to read .txt files as CSV too, give a glob such as "
            f"{os.path.join(pattern, '**', '*.txt')!r} as well.")
    if said is None:
        warn_user(note)
    else:
        said.append(note)
    return {p: i for p, i in found.items() if p not in notes}


def _list(fs: fsspec.AbstractFileSystem, pattern: str, stripped: str,
          said: list[str] | None) -> dict[str, dict[str, Any]]:
    """One glob, directory walk or file lookup; a directory without data files is refused."""
    if fsspec.core.has_magic(stripped) and protocol(pattern) == "file":
        return _local_glob(stripped)
    if fsspec.core.has_magic(stripped):
        return {p: i for p, i in fs.glob(stripped, detail=True).items()
                if i.get("type") != "directory"}
    if fs.isdir(stripped):
        listed = fs.find(stripped, detail=True)
        found = {p: i for p, i in listed.items() if p.lower().endswith(_DATA_SUFFIXES)}
        if not found:
            where = os.path.abspath(stripped) if protocol(pattern) == "file" else pattern
            held = (f"it holds {len(listed)} other file(s), e.g. "
                    f"{os.path.basename(sorted(listed)[0])!r}" if listed else "it is empty")
            raise DataNotFoundError(
                f"Expected CSV or Parquet files in the directory {pattern!r} ({where}). "
                f"Received: no file ending in {', '.join(_DATA_SUFFIXES)} "
                f"there or below; {held}.\nHint: point at the directory holding the data, "
                "or give a glob such as \"data/**/*.csv\" for other file names."
            )
        return _without_notes(found, pattern, said)
    if fs.exists(stripped):
        return {stripped: fs.info(stripped)}
    return {}


def _local_glob(pattern: str) -> dict[str, dict[str, Any]]:
    """A local glob's files with their size and mtime, as fsspec's glob gives them, 3x faster.

    fsspec's local glob walks with a call of its own per file (0.8 s for 100,000 files here);
    the standard library's glob and one ``stat`` per file do the same work (hidden files
    matched too, as fsspec matches them; directories left out, as there).
    """
    found: dict[str, dict[str, Any]] = {}
    if sys.version_info >= (3, 11):
        paths = glob.iglob(pattern, recursive=True, include_hidden=True)
    else:  # (Python 3.10: hidden files are skipped)
        paths = glob.iglob(pattern, recursive=True)
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:  # gone since it was listed
            continue
        if not stat.S_ISDIR(st.st_mode):  # a FIFO too (reading it may hang: the watchdog says so)
            kind = "file" if stat.S_ISREG(st.st_mode) else "other"
            found[path] = {"name": path, "size": st.st_size, "mtime": st.st_mtime, "type": kind}
    return found


def _file_info(path: str, info: dict[str, Any]) -> FileInfo:
    """A :class:`FileInfo` from fsspec's details of one file (local or object store)."""
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    return FileInfo(path=path, size=int(info.get("size") or 0), mtime=float(mtime), etag=etag)


def _refuse_missing_bucket(fs: fsspec.AbstractFileSystem, pattern: str, stripped: str) -> None:
    """Raise a clear error when the bucket (container) of a remote ``pattern`` does not exist."""
    bucket = stripped.split("/", 1)[0]
    try:
        there = bool(bucket) and fs.exists(bucket)
    except OSError:  # cannot tell (e.g. may not list buckets): the usual "no file" error
        return
    if not there:
        raise DataNotFoundError(
            f"Cannot list {pattern!r}. Received: the bucket {bucket!r} does not exist.\n"
            "Hint: check the bucket name and the endpoint (storage_options / "
            "--storage-options endpoint_url=...)."
        )


def reason(err: BaseException) -> str:
    """What a storage error says, for a message.

    Parameters
    ----------
    err
        The error fsspec (or the store's client) raised.

    Returns
    -------
    str
        ``PermissionError: <the store's message>``, at most 300 characters of it; a URL in it
        without credentials (a store's message never holds the storage options).
    """
    text = redact_text((getattr(err, "strerror", None) or str(err) or "").strip())
    return f"{type(err).__name__}: {text[:300]}"


def credentials_hint(proto: str) -> str:
    """Where credentials come from, for a permission error.

    Parameters
    ----------
    proto
        The protocol refused (``"s3"``, ``"file"``, ...).

    Returns
    -------
    str
        One sentence for a ``Hint:`` line.
    """
    if proto in ("s3", "s3a"):
        return ("check the credentials: storage_options (--storage-options @options.json holding "
                "key and secret), else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
                "~/.aws/credentials on this machine and on every worker, and that they may list "
                "and read the bucket.")
    if proto == "file":
        return "check the file permissions."
    return (f"check the {proto}:// credentials (storage_options, or user:password in the URL) "
            "and the file permissions.")


def make_blocks(files: Sequence[FileInfo], blocksize: int) -> list[Block]:
    """Split files into byte-range blocks; compressed and Parquet files stay whole.

    Parameters
    ----------
    files
        The listed files.
    blocksize
        Bytes per block; a file no larger is one block.

    Returns
    -------
    list of Block
        In file order, each file's blocks by offset.
    """
    blocks: list[Block] = []
    for i, f in enumerate(files):
        if compression_of(f.path) or is_parquet(f.path) or f.size <= blocksize:
            blocks.append(Block(f.path, 0, -1, i))
            continue
        for off in range(0, f.size, blocksize):
            blocks.append(Block(f.path, off, min(blocksize, f.size - off), i))
    return blocks



def stat_file(path: str, storage_options: dict[str, Any] | None = None) -> FileInfo | None:
    """The file ``path`` as it is now (None: gone), asked afresh (not an object store's cache).

    Parameters
    ----------
    path
        A path or URL, as listed.
    storage_options
        Passed to fsspec.

    Returns
    -------
    FileInfo or None
        Its size, mtime and ETag.

    Raises
    ------
    Exception
        What the storage raises when it cannot tell (no credentials, no network).
    """
    target, options = fsspec_target(path, storage_options)
    fs, stripped = fsspec.core.url_to_fs(target, **options)
    fs.invalidate_cache(stripped)
    try:
        return _file_info(path, fs.info(stripped))
    except FileNotFoundError:
        return None


def relist(items: Sequence[str], storage_options: dict[str, Any] | None = None) -> dict[str, FileInfo]:
    """The files of ``items`` as they are now, by path (to find one that changed while read).

    Parameters
    ----------
    items
        The paths and globs a source was made of.
    storage_options
        Passed to fsspec.

    Returns
    -------
    dict
        Path -> FileInfo; an object store is listed again, not read from its listing cache.
    """
    for item in items:
        target, options = fsspec_target(item, storage_options)
        fs, _ = fsspec.core.url_to_fs(target, **options)
        fs.invalidate_cache()
    return {f.path: f for f in expand_paths(list(items), storage_options)}
