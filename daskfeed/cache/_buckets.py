"""Buckets: a data set's rows dealt into ``K`` Arrow files, each a random sample of all of them.

The global order (:mod:`daskfeed.batches._order`) reads an epoch bucket by bucket; this module
keeps the files. A :class:`BucketSet` lives in ``<cache root>/buckets/<key>/`` (the key covers
the data set's parts, its label and ``K``):

- ``b<k>.arrow``: bucket ``k``'s rows in their canonical order (by block, then by the row's
  place in the block's stored order), every column as the parse cache keeps it plus ``__block``
  (the block's id, :meth:`~daskfeed.cache._blocks.BlockCache.block_id`) and ``__row`` (the row's
  place in the block's stored order, rows without a label counted): each row can be traced back
  to its block, so to its file and line. Written under a temporary name, then renamed.
- ``runs-<tag>/``: while the set is built, the *runs* of its first step (a group of blocks'
  rows sorted by bucket; ``r<n>.arrow`` and its bucket offsets ``r<n>.npy``), removed after.
- ``set.json``, written last: the format, ``K``, the buckets' rows and the parts: a set without
  it is not complete (a build cut short is built again).

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from daskfeed.cache._arrow import one_table
from daskfeed.cache._writer import BATCH_ROWS
from daskfeed.core import fsync, write_file

__all__ = ["BUCKETS_VERSION", "TRACE_COLUMNS", "BucketSet", "digest"]

BUCKETS_VERSION = 1
TRACE_COLUMNS = ("__block", "__row")  # each row's block id and place in its stored order
STALE_SECONDS = 24 * 3600  # a superseded set unused this long is removed when a new one is built


def _root(root: str | None) -> str:
    from daskfeed.cache._blocks import default_root

    return default_root() if root is None else root


@dataclass(frozen=True)
class BucketSet:
    """The bucket files of one data set (picklable: it travels to the workers with each task).

    Parameters
    ----------
    root
        The parse cache's root (None: each worker's default, as for the parse cache).
    key
        The set's name under ``<root>/buckets``.
    buckets
        ``K``.
    build
        The tag of the build whose files these are ("": not known yet).
    compression
        Of the files written (the parse cache's: None, ``"lz4"`` or ``"zstd"``).
    """

    root: str | None
    key: str
    buckets: int
    build: str = ""  # the build that wrote the files (a fresh tag each build: window task keys)
    compression: str | None = None  # of the files, as the parse cache's (None: plain)

    @staticmethod
    def key_of(**identity: Any) -> str:
        """A set's key: a digest of what makes its contents (data, label, ``K``, format)."""
        text = json.dumps({**identity, "version": BUCKETS_VERSION}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def path(self) -> str:
        """The set's directory, as seen by the process asking."""
        return os.path.join(_root(self.root), "buckets", self.key)

    def bucket_path(self, b: int) -> str:
        """Bucket ``b``'s Arrow file."""
        return os.path.join(self.path, f"b{int(b):06d}.arrow")

    def free(self) -> int:
        """Free bytes on the disk that holds (or will hold) the set."""
        base = _root(self.root)
        os.makedirs(base, mode=0o700, exist_ok=True)
        return shutil.disk_usage(base).free

    # -- the marker ----------------------------------------------------------------------
    def complete(self, sizes_digest: str) -> str:
        """The tag of the build that completed the set for buckets of these sizes ("": none).

        Marks the set used.

        Parameters
        ----------
        sizes_digest
            :func:`digest` of the buckets' rows the caller expects.

        Returns
        -------
        str
        """
        marker = os.path.join(self.path, "set.json")
        try:
            with open(marker, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return ""
        ok = (meta.get("version") == BUCKETS_VERSION and meta.get("buckets") == self.buckets
              and meta.get("sizes") == sizes_digest)
        if not ok:
            return ""
        with contextlib.suppress(OSError):
            now = time.time()
            os.utime(marker, (now, now))
        return str(meta.get("build", "?"))

    def forget(self) -> None:
        """Mark the set incomplete (a bucket found missing or damaged): the next run rebuilds it."""
        with contextlib.suppress(OSError):
            os.remove(os.path.join(self.path, "set.json"))

    def seal(self, sizes_digest: str, parts: list[str], tag: str, build: str) -> None:
        """Write the marker (the set is complete) and remove the build's runs and stale sets.

        Parameters
        ----------
        sizes_digest
            :func:`digest` of the buckets' rows.
        parts
            The parse cache's parts the set was made of.
        tag
            The build's runs to remove.
        build
            This build's name (:meth:`complete` returns it).
        """
        write_file(os.path.join(self.path, "set.json"), json.dumps({
            "version": BUCKETS_VERSION, "buckets": self.buckets, "sizes": sizes_digest,
            "build": build, "parts": sorted(parts), "created": time.time()}))
        shutil.rmtree(os.path.join(self.path, f"runs-{tag}"), ignore_errors=True)
        self._remove_superseded(set(parts))

    def _remove_superseded(self, parts: set[str]) -> None:
        """Remove other sets sharing a part with this one, unused for ``STALE_SECONDS``."""
        base = os.path.dirname(self.path)
        now = time.time()
        for name in os.listdir(base):
            other = os.path.join(base, name)
            if name == self.key or not os.path.isdir(other) or os.path.islink(other):
                continue
            marker = os.path.join(other, "set.json")
            try:
                with open(marker, encoding="utf-8") as f:
                    theirs = set(json.load(f).get("parts", ()))
                age = now - os.stat(marker).st_mtime
            except (OSError, ValueError, AttributeError):
                continue  # being built, or not a set: left alone
            if theirs & parts and age > STALE_SECONDS:
                gone = f"{other}.removing-{uuid.uuid4().hex[:8]}"
                with contextlib.suppress(OSError):
                    os.rename(other, gone)
                    shutil.rmtree(gone, ignore_errors=True)

    # -- runs (the build's first step) -----------------------------------------------------
    def write_run(self, tag: str, name: str, tables: list[pa.Table], buckets: np.ndarray) -> int:
        """Write a run: ``tables``' rows (in order) sorted by their ``buckets`` (stable).

        Its offsets (``offsets[k]``: the first row of bucket ``k``) go beside it, ``<name>.npy``.

        Returns
        -------
        int
            The run's rows.
        """
        directory = os.path.join(self.path, f"runs-{tag}")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        whole = one_table(tables)
        order = np.argsort(buckets, kind="stable")
        offsets = np.searchsorted(buckets[order], np.arange(self.buckets + 1))
        _write_arrow(os.path.join(directory, f"{name}.arrow"), whole.take(order), self.compression)
        path = os.path.join(directory, f"{name}.npy")
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "xb") as f:
            np.save(f, offsets.astype(np.int64))
        os.replace(tmp, path)
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

    # -- buckets ---------------------------------------------------------------------------
    def write_bucket(self, b: int, tables: list[pa.Table]) -> None:
        """Write bucket ``b`` from its rows (tables in canonical order)."""
        table = one_table(tables) if tables else pa.table({})
        _write_arrow(self.bucket_path(b), table, self.compression)

    def read_bucket(self, b: int, columns: list[str] | None = None) -> pa.Table:
        """Bucket ``b``'s rows in canonical order (only ``columns`` read; None: all).

        Raises
        ------
        FileNotFoundError
            The bucket is not where this process looks.
        """
        with pa.OSFile(self.bucket_path(b), "rb") as f:
            reader = ipc.open_file(f)  # compressed files: only the columns read are decoded
            if columns is not None:
                wanted = set(columns)
                keep = [i for i, fld in enumerate(reader.schema) if fld.name in wanted]
                reader = ipc.open_file(f, options=ipc.IpcReadOptions(included_fields=keep))
            return reader.read_all()


def digest(sizes: np.ndarray) -> str:
    """A short digest of the buckets' rows (what a set's marker is checked against)."""
    return hashlib.sha256(np.asarray(sizes, dtype=np.int64).tobytes()).hexdigest()[:24]


def _write_arrow(path: str, table: pa.Table, compression: str | None) -> None:
    """Write ``table`` to ``path`` whole or not at all (a fresh temporary name, then a rename)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as raw, pa.PythonFile(raw, mode="w") as sink, \
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
