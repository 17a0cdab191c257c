"""The global order's buckets held in the trainer: a data set small enough is not dealt to disk.

Bucket ``k`` is, by definition (:mod:`daskfeed.batches._buckets`), the rows with a label of
every block ``j`` whose place ``i`` in the block's stored order has ``(i + o_j) mod K == k``,
in canonical order (block id, then row). The build writes that to bucket files (deal, merge,
gather: every row written twice, then read by each window). Where the columns the model
reads fit in half the trainer's prefetch share, the trainer holds them instead, taken
once from the parse cache's files (views of their memory maps; each file's labels read once)
and *encoded once*, bucket after bucket, as the model takes them (taken in a thread while the
model is built: :class:`~daskfeed.batches._bucket_files.Buckets` with a build, whose wait the
first batch does, as for files dealt in the background; on a cluster of this machine an idle
worker takes them into files the trainer maps, :mod:`daskfeed.batches._held_aside`). A window
is then one gather of its rows from those arrays (:meth:`MemoryBuckets.window`), not a read, a
take and an encoding of Arrow rows each epoch. The same rows in the same order as the files,
encoded as the files' rows are: an epoch, a resume or a trainer of several reads exactly what
it would read from the bucket files; only where the rows come from differs.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from dask.utils import format_bytes

from daskfeed.batches._held_aside import take_aside
from daskfeed.batches._order import bucket_of
from daskfeed.cache import estimate_bytes, one_table
from daskfeed.cluster import release_after_task
from daskfeed.core import DataError, ManifestMismatchError
from daskfeed.manifest import WindowData, empty_window, encode_table, labelled

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    from distributed import Client

    from daskfeed.batches._prepare import Prepared
    from daskfeed.cache import BlockCache, BucketSet
    from daskfeed.manifest import Encoding

    Make: TypeAlias = Callable[[np.ndarray, int, str], np.ndarray]  # WindowData.allocate's make

    # what a window of the global order reads its buckets from: files, or rows held here
    BucketFiles: TypeAlias = "BucketSet | MemoryBuckets"

MEMORY_SHARE = 2  # held in memory: at most 1/MEMORY_SHARE of the trainer's prefetch bytes
TAKE_BYTES = 8 * 2**20  # the rows taken and encoded at a time (see encoded())


class MemoryBuckets:
    """A data set's buckets as positions in its rows, held in the trainer (see the module's text).

    A window (:func:`~daskfeed.batches._read.read_buckets`) reads :meth:`window`, encoded;
    :meth:`read_bucket` gives a bucket's rows as Arrow, as a :class:`~daskfeed.cache.BucketSet`
    does (:meth:`forget`, :meth:`bucket_path` too). The rows are taken by :meth:`take` (or on
    the first read: a copy pickled for another process takes them there).

    Parameters
    ----------
    cache
        The parse cache holding every block.
    counts
        Rows with a label per block (the manifest's).
    ids, offsets
        Each block's id (:meth:`~daskfeed.cache.BlockCache.block_ids`) and
        :func:`~daskfeed.batches._order.block_offsets` offset.
    buckets
        ``K``.
    encoding
        The columns read (``encoding.names``) and how the label is read.
    estimate
        Bytes they will hold, at most (what the trainer's prefetch room leaves aside).
    """

    def __init__(self, cache: BlockCache, counts: np.ndarray, ids: np.ndarray,
                 offsets: np.ndarray, buckets: int, encoding: Encoding, estimate: int) -> None:
        self.cache, self.counts, self.ids, self.offsets = cache, counts, ids, offsets
        self.buckets, self.encoding, self.estimate = int(buckets), encoding, int(estimate)
        self._held: WindowData | None = None  # the rows encoded, bucket after bucket
        self._starts = np.zeros(0, dtype=np.int64)  # where bucket k's begin in _held
        self._lock = threading.Lock()
        self.aside: Client | None = None  # (not pickled) a client whose workers take the rows

    def __dask_tokenize__(self) -> object:
        """The same rows, the same token (a window's task key)."""
        from dask.base import tokenize

        return ("daskfeed-memory-buckets", str(self.cache.root), self.buckets,
                tokenize(self.counts, self.ids, self.offsets, self.encoding))

    def __reduce__(self) -> tuple[Any, ...]:
        return (MemoryBuckets, (self.cache, self.counts, self.ids, self.offsets, self.buckets,
                                self.encoding, self.estimate))

    @property
    def nbytes(self) -> int:
        """Bytes held (0 before the first read)."""
        held = self._held
        return 0 if held is None else held.nbytes + self._starts.nbytes

    def take(self, abandon: Callable[[], BaseException | None] | None = None) -> None:
        """Take the rows from the parse cache and encode them, bucket after bucket (done once).

        ``abandon()`` (looked at between blocks) returns an error to stop with, or None.

        Raises
        ------
        DataError
            A block the cache no longer holds (removed or damaged since the stream began).
        ManifestMismatchError
            A block whose rows with a label are not the manifest's count.
        """
        with self._lock:
            if self._held is None:
                self._held, self._starts = self.take_rows(abandon)

    def take_rows(self, abandon: Callable[[], BaseException | None] | None = None,
                  allocate: Make | None = None) -> tuple[WindowData, np.ndarray]:
        """The rows taken and encoded in bucket order, and where each bucket begins in them.

        ``allocate``: what :func:`encoded` makes the arrays with (default: memory). Raises
        what :meth:`take` raises.
        """
        rows, positions, starts = self._take(abandon)
        # encoded once, in bucket order: a window is then one gather of its rows' places
        held = encoded(rows, positions, self.encoding, abandon, allocate)
        del rows
        release_after_task()  # (Arrow's copies, given back)
        return held, starts

    def taken(self, abandon: Callable[[], BaseException | None]) -> tuple[MemoryBuckets, str]:
        """:meth:`take` as a build of :class:`~daskfeed.batches._bucket_files.Buckets` does it.

        By an idle worker where :attr:`aside` is a client whose workers can
        (:mod:`daskfeed.batches._held_aside`), else here.
        """
        where = ""
        if self.aside is not None:
            with self._lock:
                if self._held is None:
                    got = take_aside(self, self.aside, abandon)
                    if got is not None:
                        self._held, self._starts = got
                        where = ", taken by a worker"
        self.take(abandon)
        return self, f"{int(self.counts.sum()):,} rows held (~{format_bytes(self.nbytes)}{where})"

    def _take(self, abandon: Callable[[], BaseException | None] | None
              ) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        columns = list(self.encoding.names)
        files: dict[str, pa.Table] = {}  # whole cache files, views of their memory maps
        tables: dict[object, pa.Table] = {}
        bases: dict[object, int] = {}
        spans: dict[object, tuple[int, int]] = {}  # the rows of each table the blocks cover
        located = []
        total = 0
        # blocks by id (as the trace column sorts them), each one's rows by place: a stable sort
        # by bucket then leaves every bucket in canonical order
        for j in np.argsort(self.ids.view(np.int64), kind="stable"):
            stop = abandon() if abandon is not None else None
            if stop is not None:  # (the reader was closed)
                raise stop
            found = self.cache.locate(int(j), columns, files)
            if found is None:
                raise DataError(
                    f"Expected block {int(j)} in the parse cache {self.cache.root}, whose rows "
                    "the trainer holds for the global order. Received: not there (removed or "
                    "damaged since the sequence was made).\nHint: run again (it is parsed again).")
            key, table, first, order = found
            if table.num_rows < first + len(order):  # a cache file shorter than its marker
                raise ManifestMismatchError(
                    f"Block {int(j)} has {max(table.num_rows - first, 0)} rows in its parse cache "
                    f"file; its marker says {len(order)}.\nHint: remove the parse cache "
                    "(daskfeed cache clear) and restart.")
            if key not in bases:
                bases[key], tables[key] = total, table
                total += table.num_rows
            lo, hi = spans.get(key, (first, first + len(order)))
            spans[key] = (min(lo, first), max(hi, first + len(order)))
            located.append((int(j), key, first, order))
        # which rows have a label: once per file over the rows its blocks cover (not per block)
        masks = {key: (lo, self._labelled(tables[key].slice(lo, hi - lo)))
                 for key, (lo, hi) in spans.items()}
        positions, dealt = [], []
        for j, key, first, order in located:
            lo, mask = masks[key]
            # the stored places of the rows with a label, as the deal takes them
            mine = order if mask is None else order[mask[first - lo + order]]
            if len(mine) != int(self.counts[j]):
                raise ManifestMismatchError(
                    f"Block {j} has {len(mine)} rows with a label in the parse cache; the "
                    f"manifest says {int(self.counts[j])}. The data changed after the scan.\n"
                    "Hint: rescan (remove the cached manifest) and restart.")
            positions.append(bases[key] + first + mine)
            dealt.append(len(mine))
        blocks = np.asarray([j for j, *_ in located], dtype=np.int64)
        bucket = bucket_of(self.offsets[blocks], np.asarray(dealt, dtype=np.int64), self.buckets)
        # (a stable sort of small whole numbers is a radix sort: ~9x faster than of int64)
        by_bucket = np.argsort(bucket.astype(np.min_scalar_type(max(self.buckets - 1, 0))),
                               kind="stable")
        starts = np.searchsorted(bucket[by_bucket], np.arange(self.buckets + 1))
        rows = one_table(list(tables.values())) if tables else pa.table({})
        rows = rows.select([c for c in columns if c in rows.column_names])
        del files, tables
        joined = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
        return rows, joined[by_bucket], starts.astype(np.int64)  # (positions bucket after bucket)

    def _labelled(self, rows: pa.Table) -> np.ndarray | None:
        """Which of ``rows`` have a label (None: all, or no label column is cached)."""
        return labelled(rows, self.encoding) if self.encoding.label in rows.column_names else None

    def window(self, window: list[tuple[int, int, tuple[int, ...]]],
               index: np.ndarray) -> WindowData:
        """The rows ``index`` of the window's buckets (concatenated in its order), encoded.

        What :func:`~daskfeed.batches._read.read_buckets` makes of the same buckets' rows read
        as Arrow and encoded: one gather from the rows encoded when they were taken.

        Raises
        ------
        DataError
            A bucket whose rows are not the number the window expects.
        """
        if self._held is None:  # (taken: no lock, the arrays are only read)
            self.take()
        held, starts = self._held, self._starts
        assert held is not None
        places = []
        for b, rows, _ in window:
            if int(starts[b + 1] - starts[b]) != rows:
                raise DataError(
                    f"Expected {rows} rows in bucket {b} ({self.bucket_path(b)}). Received: "
                    f"{int(starts[b + 1] - starts[b])}.\nHint: run again.")
            places.append(np.arange(starts[b], starts[b + 1], dtype=np.int64))
        if not places or not len(index):
            return empty_window(self.encoding)
        return held.rows(np.concatenate(places)[index])

    def read_bucket(self, b: int, columns: list[str] | None = None) -> pa.Table:
        """Bucket ``b``'s rows in canonical order, as Arrow (``columns``; None: those read).

        Read again from the parse cache at each call (for tests and tools: a window reads the
        encoded rows, :meth:`window`).
        """
        rows, positions, starts = self._take(None)
        rows = rows.take(positions[starts[b]:starts[b + 1]])
        return rows if columns is None else rows.select([c for c in columns
                                                         if c in rows.column_names])

    def bucket_path(self, b: int) -> str:
        """Where bucket ``b`` is (for messages): in the trainer's memory."""
        return f"in memory, from the parse cache {self.cache.root}"

    def forget(self) -> None:
        """Nothing to mark: no file was written (a bad read is raised as it is)."""

    def parts_of(self) -> list[BucketSet]:
        """No generations on disk (the check of :func:`~daskfeed.batches._here.reads_here`)."""
        return []


def encoded(rows: pa.Table, positions: np.ndarray, encoding: Encoding,
            abandon: Callable[[], BaseException | None] | None = None,
            allocate: Make | None = None) -> WindowData:
    """``encode_table(rows.take(positions), encoding)``, taken and encoded a run at a time.

    Every row ``positions`` names has a label (none is dropped: a run that encodes to another
    number of rows is refused). A run of about :data:`TAKE_BYTES` of ``rows`` is taken (Arrow's
    copy), encoded and copied into arrays made once for all of them: Arrow's copy of a run is
    then memory given back and reused, where a take of every row at once is as much fresh memory
    as the rows, and on these machines the first touch of fresh memory costs more than the
    take itself (2M rows of the bench's 7 columns in a fresh process: 0.83–1.63 s whole, with
    0.5–1.3 s of it the kernel's, against 0.22–0.36 s a run at a time).
    ``abandon()`` (looked at between runs) returns an error to stop with, or None;
    ``allocate`` makes the arrays (:meth:`~daskfeed.manifest.WindowData.allocate`'s ``make``).
    """
    n = len(positions)
    step = max(1024, TAKE_BYTES // max(1, rows.nbytes // max(rows.num_rows, 1)))
    held: WindowData | None = None
    for at in range(0, n, step):
        stop = abandon() if abandon is not None else None
        if stop is not None:
            raise stop
        part = encode_table(rows.take(positions[at:at + step]), encoding)
        if len(part) != min(step, n - at):  # a label the encoding reads otherwise than the take
            raise ManifestMismatchError(
                f"Expected {min(step, n - at):,} rows with a label in rows {at:,}.. of the parse "
                f"cache's rows the trainer holds. Received: {len(part):,} once encoded.\nHint: "
                "remove the parse cache (daskfeed cache clear) and restart, and report this.")
        if held is None:
            held = part.allocate(n, allocate)
        held.put(at, part)
    return held if held is not None else encode_table(rows.take(positions), encoding)


def memory_buckets(data: Prepared, counts: np.ndarray, ids: np.ndarray, offsets: np.ndarray,
                   buckets: int) -> MemoryBuckets | None:
    """The buckets of ``data`` held in the trainer, where they fit; else None (dealt to files).

    They fit where every block is cached and the estimate is at most ``1 / MEMORY_SHARE`` of
    the trainer's prefetch bytes: 8 bytes a value of the model's columns, the label and a
    weight, and 8 a row (what is held, encoded, is at most that; while it is taken, their
    places and one run's Arrow copy, :data:`TAKE_BYTES`, are beside it); or the whole parse cache of
    these files, uncompressed, if more (what the take maps: the rows without a label, long
    text). Not taken yet (:meth:`MemoryBuckets.taken`).

    Parameters
    ----------
    data
        Prepared data with a parse cache.
    counts, ids, offsets, buckets
        As :class:`MemoryBuckets` takes them.
    """
    cache, enc = data.cache, data.encoding
    assert cache is not None
    estimate = max(int(counts.sum()) * (8 * (len(enc.columns) + 1 + bool(enc.weight)) + 8),
                   estimate_bytes(data.source, None))
    if estimate > data.settings.prefetch_bytes // MEMORY_SHARE \
            or not all(cache.has(i) for i in range(len(counts))):
        return None
    return MemoryBuckets(cache, counts, ids, offsets, buckets, enc, estimate)
