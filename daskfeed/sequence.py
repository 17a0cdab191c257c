"""DaskSequence: a ``keras.utils.PyDataset`` whose batches are computed by a Dask cluster."""

from __future__ import annotations

import functools
import operator
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any

import numpy as np

from daskfeed import config
from daskfeed._keras import keras, refuse_narrowed
from daskfeed.cluster import acquire_client, close_client
from daskfeed.exceptions import (
    ClusterError,
    DaskfeedError,
    DataError,
    ManifestMismatchError,
    SchemaError,
)
from daskfeed.feed import (
    EXACT_FLOAT32,
    Encoding,
    WindowData,
    concat,
    encode_window,
    frame_weight_faults,
    read_window,
    record_line,
    weight_faults,
)
from daskfeed.labels import unknown_classes
from daskfeed.lifecycle import Stop, run_at_exit
from daskfeed.manifest import Manifest, id_warning, split_settings, unknown_column
from daskfeed.plan import EpochPlan, equal_shard_batches, make_plan
from daskfeed.prefetch import Prefetcher, WindowCancelled
from daskfeed.scanner import scan
from daskfeed.source import Source

__all__ = ["DaskSequence"]

MIN_WINDOWS = 8


class _Owner:
    """What a :class:`DaskSequence` must give back, held apart from it for its finalizer.

    The client (closed only if the sequence started it) and the process that may close it:
    a forked child inherits the parent's connection, which is not its to close.
    """

    def __init__(self) -> None:
        self.client: Any = None
        self.owns = False
        self.pid = os.getpid()
        _OWNERS.add(self)

    def close(self) -> None:
        """Drop the client, closing it if owned; idempotent, a no-op in another process."""
        if self.pid != os.getpid():
            return
        client, owns = self.client, self.owns
        self.client, self.owns = None, False
        if owns and client is not None:
            close_client(client)


_OWNERS: weakref.WeakSet[_Owner] = weakref.WeakSet()


def _close_owned_clients() -> None:
    """At interpreter exit: close the clients (and local clusters) sequences started."""
    for owner in list(_OWNERS):
        owner.close()


run_at_exit(_close_owned_clients)


def _refuse_multiprocessing(kwargs: dict[str, Any]) -> None:
    """Refuse Keras' worker processes before any scan or cluster work."""
    if kwargs.get("use_multiprocessing"):
        raise SchemaError(
            "DaskSequence does not run in Keras' worker processes. Expected "
            "use_multiprocessing=False (the default). Received: use_multiprocessing=True.\n"
            "Hint: the Dask workers already compute the batches and the trainer only slices "
            "arrays, so a process pool adds nothing: use workers=N (threads) to read batches "
            "concurrently, or leave the default."
        )


def _called_by_keras_reset() -> bool:
    """Whether Keras' ``EpochIterator.reset`` (the start of fit / evaluate) is calling us."""
    frame: Any = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "reset" and code.co_filename.endswith("epoch_iterator.py"):
            return True
        frame = frame.f_back
    return False


class DaskSequence(keras.utils.PyDataset):
    """Batches of a CSV set far larger than memory, materialized by a Dask cluster.

    The data are scanned once (:func:`daskfeed.scan`), then every epoch is planned as windows
    of partitions. Workers read, encode and shuffle a window and send back compact numpy
    arrays; the next windows are in flight while Keras trains on the current one.

    ``seq[i]`` is deterministic for ``(data, seed, batch_size, epoch)``, correct in any call
    order and from concurrent threads. Every row is delivered exactly once per epoch; every
    batch holds ``batch_size`` rows except possibly the last. A batch is ``(x, y)``, or
    ``(x, y, w)`` with a ``weight`` column: Keras then weighs the loss and the metrics of
    each row by ``w``, in ``fit`` as in ``evaluate``.

    Parameters
    ----------
    data
        A path, glob (``**`` too), list of paths, fsspec URL, or ``dask.dataframe.DataFrame``.
    label
        Name of the numeric label column.
    features
        Feature columns, in order (default: every column but the label and ``exclude``).
    exclude
        Columns to leave out.
    batch_size
        Rows per batch (default ``daskfeed.batch-size``).
    shuffle
        Permute partitions per epoch and mix rows across the partitions of a window.
    seed
        Seed of every permutation.
    client
        A ``distributed.Client`` or scheduler address; default: the current client, else a
        LocalCluster owned (and closed) by this sequence.
    as_matrix
        Return ``x`` as one float32 matrix of the numeric ``features`` instead of a dict.
    manifest
        A :class:`~daskfeed.manifest.Manifest` (or path to its JSON) of this data: no rescan.
        It must have been made with the same settings (label, vocabulary size, read options;
        else :class:`~daskfeed.exceptions.ManifestMismatchError` names the one that differs);
        its partitions are used as they are (``blocksize=None`` takes the manifest's).
    cache
        Keep every partition parsed once as Arrow on the workers' disk (see
        :mod:`daskfeed.cache`), so later epochs never parse CSV: ``True`` (default) uses
        ``daskfeed.cache-dir`` (``~/.cache/daskfeed``) when the disk has room, a path uses
        that directory (an error if it lacks room), ``False`` turns it off.
    sep, encoding, dtype, na_values
        How the CSV is read: delimiter, text encoding, per-column dtype overrides, null
        markers missing in every column (see :class:`~daskfeed.source.Source`).
    bad_lines
        Lines with the wrong number of fields: ``"error"`` (default), ``"skip"`` (counted in
        ``manifest.bad_lines``) or ``"quarantine"`` (also kept in ``manifest.rejects``).
    reference
        Manifest whose statistics encode the features (e.g. the training set's, for a
        validation set); default: this data's own manifest.
    drop_remainder
        Drop the epoch's last batch when it is short.
    shard
        ``(rank, world_size)``: serve only partitions ``p`` with ``p % world_size == rank``
        (one trainer of several; the shards are disjoint and together the whole data). With
        ``world_size > 1`` every shard serves the same number of full batches per epoch,
        :func:`~daskfeed.plan.equal_shard_batches` (trainers that step together need that);
        the rest of each shard's rows that epoch, the tail of its shuffled order, is dropped
        and counted (``plan.dropped``, ``epoch_stats()["dropped_rows"]``).
    weight
        A numeric column of per-row sample weights: batches become ``(x, y, w)`` (float32)
        and the column is not a feature. Policy: every row with a label must have a weight
        >= 0. The scan's statistics of the column tell at construction, without another
        pass, whether any weight is missing or negative; if so, the rows are found and
        :class:`~daskfeed.exceptions.DataError` names the first one's file and line and
        counts them all, before anything is trained (rows without a label are skipped
        anyway, whatever their weight). A weight of 0 keeps a row out of the loss.
    validation_split, subset
        Hold out whole partitions for validation, as Keras' ``image_dataset_from_directory``
        does with files: ``validation_split=0.1, subset="training"`` serves the partitions
        left for training, ``subset="validation"`` the held-out ones (pass the same
        ``seed`` to both). The split is by partition, not by row: partitions are drawn by
        a hash of ``(seed, file, byte offset)`` until about ``validation_split`` of the
        bytes are held out (:func:`~daskfeed.plan.split_partitions`), so each part reads
        only its own partitions, the same rows every epoch and every run with the same seed
        and partitions (blocksize), never a row of the other part. Each part is scanned on
        its own, so the training manifest's statistics come from the training rows alone
        and the two scans together are one pass. Rows of one file region go to the same
        part.
    window_bytes, prefetch_bytes, timeout
        Memory knobs (see ``daskfeed.yaml``); normally derived from ``--memory-limit``.
    scan_progress
        Called while this data is scanned (see :func:`daskfeed.scan`'s ``progress``).
    spans
        A :class:`daskfeed.dashboard.EpochSpans`: each epoch's windows are computed inside its
        ``distributed.span`` (the dashboard's Fine Performance Metrics by epoch).
    stop
        A :class:`daskfeed.lifecycle.Stop`: its request ends every wait for a batch at once
        (:class:`~daskfeed.lifecycle.Aborted`); default: the process-wide one, which SIGINT /
        SIGTERM also end.
    **kwargs
        ``workers`` and ``max_queue_size`` for ``keras.utils.PyDataset``;
        ``use_multiprocessing=True`` is refused (:class:`~daskfeed.SchemaError`).

    Notes
    -----
    A sequence owns threads and futures: close it (:meth:`close`, or ``with DaskSequence(...)
    as seq:``). It is also closed when garbage-collected or at interpreter exit, and it stops
    waiting when its client closes; nothing it starts keeps the process alive, and Ctrl-C
    ends a wait for a batch at once.

    Examples
    --------
    >>> import daskfeed
    >>> from distributed import Client
    >>> client = Client(n_workers=2, threads_per_worker=1)  # doctest: +SKIP
    >>> train = daskfeed.DaskSequence("data/log_quest/**/*.csv", label="cleared",
    ...                               batch_size=1024, client=client)  # doctest: +SKIP
    >>> val = daskfeed.DaskSequence("data/log_quest_validate/**/*.csv", label="cleared",
    ...                             shuffle=False, reference=train.manifest,
    ...                             client=client)  # doctest: +SKIP
    >>> model = daskfeed.default_model(train)  # doctest: +SKIP
    >>> model.fit(train, validation_data=val, epochs=3, shuffle=False)  # doctest: +SKIP
    >>> train.close(); val.close()  # doctest: +SKIP

    One data set split 90/10 by partition, the validation part encoded like the training part:

    >>> train = daskfeed.DaskSequence("data/log_quest/**/*.csv", label="cleared",
    ...                               validation_split=0.1, subset="training", seed=1,
    ...                               client=client)  # doctest: +SKIP
    >>> val = daskfeed.DaskSequence("data/log_quest/**/*.csv", label="cleared",
    ...                             validation_split=0.1, subset="validation", seed=1,
    ...                             shuffle=False, reference=train.manifest,
    ...                             client=client)  # doctest: +SKIP
    """

    def __init__(
        self,
        data: Any,
        *,
        label: str,
        features: list[str] | None = None,
        exclude: tuple[str, ...] | list[str] = (),
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        client: Any = None,
        as_matrix: bool = False,
        manifest: Manifest | str | os.PathLike[str] | None = None,
        reference: Manifest | None = None,
        drop_remainder: bool = False,
        window_bytes: int | str | None = None,
        window_rows: int | None = None,
        prefetch_bytes: int | str | None = None,
        timeout: float | str | None = None,
        blocksize: int | str | None = None,
        encoding: str = "utf-8",
        dtype: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        vocabulary_size: int | None = None,
        shard: tuple[int, int] = (0, 1),
        cache: bool | str | os.PathLike[str] = True,
        bad_lines: str = "error",
        sep: str = ",",
        na_values: list[str] | tuple[str, ...] | None = None,
        weight: str | None = None,
        validation_split: float | None = None,
        subset: str | None = None,
        spans: Any = None,
        scan_progress: Any = None,
        stop: Stop | None = None,
        **kwargs: Any,
    ) -> None:
        _refuse_multiprocessing(kwargs)
        split = split_settings(validation_split, subset, int(seed))  # before any work
        self._owner = _Owner()
        self._finalizer = weakref.finalize(self, self._owner.close)
        self._closed = False
        super().__init__(**kwargs)
        self.batch_size = int(config.get("batch-size", batch_size))
        if self.batch_size < 1:
            raise ValueError(f"Expected batch_size >= 1. Received: batch_size={batch_size}.")
        self.label = label
        self.weight = weight
        self.validation_split = split["validation_split"] if split else 0.0
        self.subset = subset if split else None
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_remainder = bool(drop_remainder)
        self.shard = (int(shard[0]), int(shard[1]))
        self.timeout = config.get_seconds("timeout", timeout)
        self.prefetch_bytes = config.get_bytes("prefetch-bytes", prefetch_bytes)
        if manifest is not None and not isinstance(manifest, Manifest):
            manifest = Manifest.from_json(manifest)
        if manifest is not None and blocksize is None:  # its partitions: the same blocks
            blocksize = manifest.read_options.get("blocksize")
        self._scan_progress = scan_progress  # the scan's progress callback (see scan())
        self.source = Source(data, blocksize=blocksize, encoding=encoding, dtype=dtype,
                             storage_options=storage_options, bad_lines=bad_lines, sep=sep,
                             na_values=na_values)
        self._client, self._owns_client = acquire_client(client)
        self._scheduler_address = self._client.scheduler.address
        self._security = getattr(self._client, "security", None)  # tls:// reconnects after pickling
        try:
            self.cache, self.cache_status = self._open_cache(cache)
            self.manifest = self._resolve_manifest(manifest, label, vocabulary_size, split)
            self._scan_progress = None  # scanned: not kept (nor pickled)
            ref = reference if reference is not None else self.manifest
            self.reference = ref  # whose statistics encode the features
            if weight is not None:
                self._check_weight_column(weight, features)
                exclude = [*exclude, weight]
            self.features = ref.feature_names(features, exclude)
            if features is None and reference is None and (ids := ref.id_like(self.features)):
                warnings.warn(id_warning(ids), stacklevel=2)
            if reference is not None:
                self._check_compatible(reference)
                self._check_disjoint(reference)
                self._check_classes(reference)
            self.encoding = Encoding.from_manifest(ref, self.features, as_matrix, weight=weight)
            refuse_narrowed({c.name: c.dtype for c in self.encoding.columns}
                            | {self.label: self.encoding.label_dtype})
            if weight is not None:
                self._check_weights()
        except BaseException:
            self._close_client()
            raise
        self.as_matrix = bool(as_matrix)
        if window_rows is None:
            wbytes = config.get_bytes("window-bytes", window_bytes)
            window_rows = int(wbytes / max(self.manifest.bytes_per_row, 1.0))
            # the trainer must hold the current window and the next one within prefetch_bytes
            window_rows = min(window_rows, self.prefetch_bytes // (3 * self.encoding.bytes_per_row))
            # at least MIN_WINDOWS windows so the cluster reads ahead while the first is consumed
            # (a function of the data only: the plan must not depend on the number of workers)
            window_rows = min(window_rows, -(-self.manifest.rows // MIN_WINDOWS))
        self.window_rows = max(int(window_rows), self.batch_size, 1)
        self._lock = threading.RLock()
        self._warned_random = False
        self._epoch = 0
        self._start = 0
        self._plan: EpochPlan | None = None
        self._prefetcher: Prefetcher | None = None
        self.last_epoch_stats: dict[str, Any] = {}
        self.failure: DaskfeedError | None = None  # the last error a batch raised
        self.spans = spans  # one distributed.span per epoch for the windows (dashboard)
        self._stop = stop  # None: the process-wide stop request (daskfeed.lifecycle)
        self._set_epoch(0)

    # -- construction helpers ---------------------------------------------------------
    def _open_cache(self, cache: bool | str | os.PathLike[str] | None) -> tuple[Any, str]:
        from daskfeed.cache import open_cache

        if cache is None or cache is False:
            return None, "cache: off"
        root = None if cache is True else cache
        return open_cache(self.source, root or config.get("cache-dir"),
                          compression=config.get("cache-compression"), required=root is not None,
                          client=self._client)

    def _resolve_manifest(self, manifest: Manifest | None, label: str,
                          vocabulary_size: int | None, split: dict[str, Any] | None) -> Manifest:
        k = int(config.get("vocabulary-size", vocabulary_size))
        if manifest is None:
            return scan(self.source, label=label, client=self._client, timeout=self.timeout,
                        vocabulary_size=k, partition_cache=self.cache, progress=self._scan_progress,
                        validation_split=split["validation_split"] if split else None,
                        subset=split["subset"] if split else None, seed=self.seed)
        manifest.check_settings(self.source, label=label, vocabulary_size=k, split=split)
        manifest.warn_notes(stacklevel=4)  # what the scan said still holds: say it again
        return manifest

    def _check_compatible(self, reference: Manifest) -> None:
        for name in [*self.features, self.label]:
            mine = self.manifest.columns.get(name)
            theirs = reference.columns[name]
            if mine is None:
                raise SchemaError(
                    f"Expected column {name!r} (of the reference data) in this data. Received: "
                    f"columns {list(self.manifest.columns)[:20]}.\nHint: give both data sets "
                    "the same columns."
                )
            if mine.kind not in (theirs.kind, "empty"):
                raise SchemaError(
                    f"Column {name!r} is {theirs.kind} in the reference data but {mine.kind} "
                    "here.\nHint: give both data sets the same column types."
                )

    def _check_classes(self, reference: Manifest) -> None:
        """Refuse label text that is no class of the reference data, naming its file and line."""
        known = reference.classes
        unknown = sorted(set(self.manifest.classes or ()) - set(known or ()))
        if known is None or not unknown:
            return
        rows = sum(self.manifest.label_counts.get(v, 0) for v in unknown)
        first = "in the DataFrame's partitions"
        if self.source.frame is None:
            parts = [p for p, n in enumerate(self.manifest.counts) if n > 0]
            found = self._client.gather([self._client.submit(
                unknown_classes, p, self.source.blocks[p], self.source.options, self.label,
                tuple(known), self.cache, pure=False) for p in parts])
            p, hit = next((p, f) for p, f in zip(parts, found, strict=True) if f["row"] is not None)
            first = f"the first ({hit['value']!r}) at {self._row_place(p, hit['row'])}"
        raise DataError(
            f"Expected label values that are classes of the training data ({', '.join(known[:10])}"
            f"{' ...' if len(known) > 10 else ''}). Received: {', '.join(map(repr, unknown[:5]))}"
            f"{' ...' if len(unknown) > 5 else ''} in {rows:,} row(s) of label {self.label!r}; "
            f"{first}.\nHint: the model cannot learn a class it never saw: add rows of it to the "
            "training data, or leave these rows out of this data."
        )

    def _check_disjoint(self, reference: Manifest) -> None:
        """Refuse a sequence over rows of a split's training part that ``reference`` describes."""
        theirs = reference.split
        if not theirs or reference.fingerprint != self.manifest.fingerprint:
            return
        mine = self.manifest.split or {}
        same = all(mine.get(k) == theirs[k] for k in ("validation_split", "seed"))
        if not same or mine.get("subset") == theirs["subset"]:
            want = "validation" if theirs["subset"] == "training" else "training"
            raise SchemaError(
                f"The reference manifest is the {theirs['subset']} part of a split of this data "
                f"(validation_split={theirs['validation_split']:g}, seed={theirs['seed']}), so "
                "this sequence would serve some of its rows too. Expected the other part. "
                f"Received: validation_split={self.validation_split or None}, "
                f"subset={self.subset!r}, seed={self.seed}.\nHint: pass validation_split="
                f"{theirs['validation_split']:g}, subset={want!r}, seed={theirs['seed']}."
            )

    # -- sample weights ------------------------------------------------------------------
    def _check_weight_column(self, weight: str, features: list[str] | None) -> None:
        """The weight column exists, is numeric, and is neither the label nor a feature."""
        col = self.manifest.columns.get(weight)
        if col is None:
            raise SchemaError(unknown_column(weight, list(self.manifest.columns), "weight"))
        if weight == self.label or weight in (features or ()):
            what = "the label" if weight == self.label else "a feature"
            hint = ("pick another weight column" if weight == self.label else
                    "drop it from features (--features)")
            raise SchemaError(
                f"The weight column cannot also be {what}. Received: weight={weight!r}.\nHint: "
                f"{hint}."
            )
        if col.kind != "numeric":
            raise SchemaError(
                f"Expected a numeric weight column. Received: weight={weight!r}, a {col.kind} "
                f"column{f' with values such as {col.vocabulary[:3]}' if col.vocabulary else ''}.\n"
                "Hint: weights are numbers >= 0; pick a numeric column or fix this one."
            )
        wide = max((abs(v) for v in (col.min, col.max) if v is not None), default=0)
        if wide >= EXACT_FLOAT32:
            warnings.warn(
                f"Weight column {weight!r} holds values up to {wide:,}: Keras takes sample weights "
                "as float32, which rounds values beyond 2**24 (relative error < 6e-8). Hint: "
                "scale the weights down if that matters.", stacklevel=4)

    def _check_weights(self) -> None:
        """Refuse missing or negative weights in rows with a label, naming file and line.

        The scan's statistics of the column say whether there can be any; only then are the
        rows looked for on the cluster (one task per partition of this sequence).
        """
        col = self.manifest.columns[self.weight]  # type: ignore[index]
        if not col.missing and (col.min is None or col.min >= 0):
            return
        found = self._weight_faults()
        missing = sum(f["missing"] for _, f in found)
        negative = sum(f["negative"] for _, f in found)
        if not (missing or negative):
            return  # the missing weights are all in rows without a label (skipped)
        p, first = next((p, f) for p, f in found if f["row"] is not None)
        value = "missing" if np.isnan(first["value"]) else f"{first['value']:g}"
        raise DataError(
            f"Expected a weight >= 0 in every row with a label (weight column {self.weight!r}). "
            f"Received: {missing:,} row(s) with a missing weight and {negative:,} with a negative "
            f"one; the first ({value}) at {self._row_place(p, first['row'])}.\nHint: fill in or fix "
            "those weights, or drop those rows (a weight of 0 keeps a row out of the loss)."
        )

    def _weight_faults(self) -> list[tuple[int, dict[str, Any]]]:
        parts = [p for p, n in enumerate(self.manifest.counts) if n > 0]
        client = self._client
        if self.source.frame is not None:
            from dask import delayed

            frames = self.source.partitions()
            tasks = [delayed(frame_weight_faults)(frames[p], self.label, self.weight) for p in parts]
            futures = client.compute(tasks)
        else:
            futures = [client.submit(weight_faults, p, self.source.blocks[p], self.source.options,
                                     self.label, self.weight, self.cache, pure=False)
                       for p in parts]
        return list(zip(parts, client.gather(futures), strict=True))

    def _row_place(self, p: int, row: int) -> str:
        """``<file> line N (its byte range)``: where row ``row`` of partition ``p`` is."""
        block = self.source.blocks[p]
        if self.source.frame is not None:
            return f"partition {p}, row {row}"
        line = self._client.submit(record_line, block, self.source.options, row, pure=False).result()
        where = f"line {line}" if line is not None else f"row {row + 1} of the partition"
        return f"{block.path} {where} (partition {p}: {block.describe()})"

    # -- epochs -------------------------------------------------------------------------
    def _make_plan(self, epoch: int) -> EpochPlan:
        # several shards (trainers stepping together): the same number of full batches on
        # every shard; each drops the rest of its rows this epoch (counted in plan.dropped)
        equal = (equal_shard_batches(self.manifest.counts, batch_size=self.batch_size,
                                     nshards=self.shard[1]) if self.shard[1] > 1 else None)
        return make_plan(
            self.manifest.counts, batch_size=self.batch_size, epoch=epoch, seed=self.seed,
            shuffle=self.shuffle, window_rows=self.window_rows,
            drop_remainder=self.drop_remainder, shard=self.shard, max_batches=equal,
        )

    def _set_epoch(self, epoch: int, start: int = 0) -> None:
        plan = self._make_plan(epoch)
        if plan.num_batches == 0:
            raise SchemaError(
                f"Expected at least one batch. Received: {plan.rows} rows with "
                f"batch_size={self.batch_size}, drop_remainder={self.drop_remainder}.\n"
                "Hint: lower batch_size or add data."
            )
        if not 0 <= start < plan.num_batches:
            raise ValueError(f"Expected 0 <= start < {plan.num_batches} (batches of epoch {epoch}). "
                             f"Received: start={start}.")
        with self._lock:
            old, old_pf = self._plan, self._prefetcher
            self._epoch = epoch
            self._start = start
            self._plan = plan
            self._served: set[int] = set()
            # batches of each window still to serve (windows wholly before ``start`` have none)
            self._left = {w.index: sum(1 for b in plan.batches_of(w.index) if b >= start)
                          for w in plan.windows}
            self._jumps = 0
            self._last_index = -1
            self._epoch_t0 = time.perf_counter()
            if old is not None and old_pf is not None and (plan == old or plan.same_batches(old)):
                # same windows (this epoch at another start, or unshuffled): keep them held or in
                # flight -- cancelling and resubmitting the same keys races in distributed
                self._epoch_submitted0, self._epoch_wait0 = old_pf.submitted, old_pf.wait_seconds
                for w in plan.windows:
                    if not (start and self._left[w.index]):
                        old_pf.done_serving(w.index)  # evictable if room is needed
                return
            if old_pf is not None:
                old_pf.reset()
            self._epoch_submitted0, self._epoch_wait0 = 0, 0.0
            self._prefetcher = Prefetcher(  # bound to THIS plan, whatever epoch comes next
                functools.partial(self._submit, plan),
                functools.partial(self._estimate, plan),
                [w.index for w in plan.windows if self._left[w.index]],
                budget=self.prefetch_bytes, timeout=self.timeout,
                describe=functools.partial(self._describe, plan), stop=self._stop,
            )
            if self._client is not None:  # unpickled copies start on their first batch
                self._prefetcher.start()

    def on_epoch_end(self) -> None:
        """Move to the next epoch's order once every batch of this epoch was delivered.

        Keras also calls this when ``fit`` starts (``EpochIterator.reset``), after the TF
        backend peeked at batches 0 and 1; that call never advances (even when those two
        batches are all that is left of a resumed epoch), so the peeked windows are reused
        and training starts with the current epoch. With
        ``use_multiprocessing=True`` the batches are served in child processes, so every call
        advances.
        """
        if _called_by_keras_reset():
            return  # fit / evaluate is starting: no batch was trained, whatever was peeked
        with self._lock:
            complete = len(self._served) == self.plan.num_batches - self._start
            if not (complete or self.use_multiprocessing):
                return
            self.last_epoch_stats = self.epoch_stats()
        self._set_epoch(self._epoch + 1)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Jump to ``epoch`` (e.g. when resuming); batches follow that epoch's order.

        ``start > 0`` resumes the epoch at its batch ``start``: until the epoch ends,
        ``len(seq)`` is ``num_batches - start`` and ``seq[i]`` is the epoch's batch
        ``start + i`` (same order, same rows as an uninterrupted epoch). The rows of batches
        ``0 .. start - 1`` are not delivered again, and their windows are not computed.
        The next epoch starts at batch 0. Keras fixes the steps per epoch when ``fit``
        starts, so fit such a partial epoch on its own (``fit(..., initial_epoch=epoch,
        epochs=epoch + 1)``), then the remaining epochs in a second ``fit``
        (:func:`daskfeed.checkpoint.fit_from` does both). Not with ``use_multiprocessing=True``,
        where Keras' fit-start ``on_epoch_end`` advances to the next epoch.
        """
        epoch, start = int(epoch), int(start)
        if epoch != self._epoch or start != self._start:
            self._set_epoch(epoch, start)

    @property
    def epoch(self) -> int:
        """The epoch whose batches ``seq[i]`` returns."""
        return self._epoch

    @property
    def start(self) -> int:
        """First batch of the current epoch served (``seq[0]``): 0 except when resuming."""
        return self._start

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan."""
        assert self._plan is not None
        return self._plan

    @property
    def rows(self) -> int:
        """Rows delivered per epoch."""
        return self.plan.rows

    def epoch_stats(self) -> dict[str, Any]:
        """Rows and batches served, seconds waited for data, windows computed this epoch."""
        with self._lock:
            plan, pf = self.plan, self._prefetcher
            rows = sum(plan.batch_rows(i) for i in self._served)
            return {
                "epoch": plan.epoch,
                "rows": int(rows),
                "batches": len(self._served),
                "wait_seconds": (pf.wait_seconds - self._epoch_wait0) if pf else 0.0,
                "windows_computed": (pf.submitted - self._epoch_submitted0) if pf else 0,
                "start_batch": self._start,
                "windows": len(plan.windows),
                "dropped_rows": plan.dropped,
                "seconds": time.perf_counter() - self._epoch_t0,
            }

    # -- the cluster side ---------------------------------------------------------------
    def _client_or_connect(self) -> Any:
        """The client; after unpickling, a new connection to the same scheduler (owned)."""
        self._check_usable()
        if self._client is None:
            from daskfeed.cluster import connect

            self._client = connect(self._scheduler_address, security=getattr(self, "_security", None))
            self._owns_client = True
        if self._client.status in ("closing", "closed"):
            raise ClusterError(
                f"The Dask client of this DaskSequence ({self._scheduler_address}) was closed. "
                "Expected a running client.\nHint: close the DaskSequence before its client, "
                "or create it again with a running client."
            )
        return self._client

    def _submit(self, plan: EpochPlan, w: int) -> Any:
        from dask.base import tokenize

        client = self._client_or_connect()
        win = plan.windows[w]
        seed = plan.seed_of(w)
        # a tuple key: each window its own task group (so its epoch's span), prefix daskfeed-window
        key = (f"daskfeed-window-{tokenize(self.manifest.fingerprint, self.encoding, win.partitions, seed)}",
               w)
        if self.spans is not None:
            with self.spans(plan.epoch):
                return self._submit_window(client, plan, w, key, seed)
        return self._submit_window(client, plan, w, key, seed)

    def _submit_window(self, client: Any, plan: EpochPlan, w: int, key: Any, seed: Any) -> Any:
        win = plan.windows[w]
        if self.source.frame is None:
            blocks = [(p, self.source.blocks[p]) for p in win.partitions]
            return client.submit(read_window, blocks, self.source.options, self.encoding, seed,
                                 self.cache, key=key, retries=1)
        from dask import delayed

        parts = self._frame_partitions()
        d = delayed(encode_window, pure=True)(
            *[parts[p] for p in win.partitions], encoding=self.encoding, seed=seed,
            dask_key_name=key,
        )
        return client.compute(d, retries=1)

    def _frame_partitions(self) -> list[Any]:
        parts = getattr(self, "_parts", None)
        if parts is None:
            parts = self._parts = self.source.partitions()
        return parts

    def _estimate(self, plan: EpochPlan, w: int) -> int:
        return int(plan.windows[w].rows * self.encoding.bytes_per_row)

    def _describe(self, plan: EpochPlan, w: int) -> str:
        win = plan.windows[w]
        names = [self.source.blocks[p].describe() for p in win.partitions[:3]]
        more = f" and {len(win.partitions) - 3} more" if len(win.partitions) > 3 else ""
        return f"epoch {plan.epoch}, partitions {', '.join(names)}{more}"

    # -- PyDataset ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self.plan.num_batches - self._start

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        """Batch ``index`` of the current epoch as ``(x, y)``, or ``(x, y, w)`` with ``weight``."""
        self._check_usable()  # first: a forked child must not touch the parent's locks
        try:
            for _ in range(3):
                try:
                    return self._get(index)
                except WindowCancelled:
                    continue  # the epoch changed while we waited: serve from the current plan
            return self._get(index)
        except DaskfeedError as err:
            # Keras' TF backend reads batches in a tf.data py_function, which re-raises our error
            # as a tf UnknownError; train() re-raises this one instead (see ``failure``)
            self.failure = err
            raise

    def _get(self, index: int) -> tuple[Any, ...]:
        i = operator.index(index)
        with self._lock:
            plan, pf, start = self.plan, self._prefetcher, self._start
            n = plan.num_batches - start
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"Batch index {index} out of range for {n} batches.")
            self._note_access(i)
            i += start  # the plan's batch index (start > 0 only in a resumed epoch)
        assert pf is not None
        slices = plan.batch(i)
        pieces = []
        for s in slices:
            data: WindowData = pf.get(s.window)
            expected = plan.windows[s.window].rows
            if len(data) != expected:
                raise ManifestMismatchError(
                    f"Window {s.window} ({self._describe(plan, s.window)}) has {len(data)} rows; the "
                    f"manifest says {expected}. The data changed after the scan.\n"
                    "Hint: rescan (remove the cached manifest) and restart."
                )
            pieces.append(data.take(s.start, s.stop))
        batch = concat(pieces)
        with self._lock:
            if plan is self._plan and i not in self._served:
                self._served.add(i)
                for s in slices:
                    self._left[s.window] -= 1
                    if self._left[s.window] == 0:
                        pf.done_serving(s.window)
        return batch.batch()

    def _note_access(self, i: int) -> None:
        last = self._last_index
        self._last_index = i
        tolerance = self.workers + self.max_queue_size + 2
        if last < 0 or i == 0 or abs(i - last) <= tolerance:
            return
        self._jumps += 1
        if self._jumps >= 3 and not self._warned_random:
            self._warned_random = True
            warnings.warn(
                "DaskSequence is being read in random batch order (Keras' fit(shuffle=True) is "
                "the default). Batches stay correct, but windows may be computed more than "
                "once. daskfeed already shuffles partitions and rows itself: pass "
                "shuffle=False to model.fit() for the fast path.",
                stacklevel=3,
            )

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def _client(self) -> Any:
        return self._owner.client

    @_client.setter
    def _client(self, client: Any) -> None:
        self._owner.client = client

    @property
    def _owns_client(self) -> bool:
        return self._owner.owns

    @_owns_client.setter
    def _owns_client(self, owns: bool) -> None:
        self._owner.owns = bool(owns)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stop prefetching, release windows in flight, close the client if this sequence started it.

        Idempotent and quick: futures are released without waiting for the scheduler. Also
        runs when the sequence is garbage-collected or the interpreter exits. A closed
        sequence serves no batch. In a forked child it does nothing (the parent's
        connection is not the child's to close).
        """
        if self._owner.pid != os.getpid():
            return
        self._closed = True
        pf = self._prefetcher  # not under self._lock: close never waits for a batch
        if pf is not None:
            pf.close()
        self._close_client()

    def _close_client(self) -> None:
        self._owner.close()

    def _check_usable(self) -> None:
        """Refuse a closed sequence, and a fork's copy (Keras' worker processes)."""
        if self._owner.pid != os.getpid():
            raise SchemaError(
                f"This DaskSequence was created in process {self._owner.pid} and a batch was "
                f"asked for in process {os.getpid()}, a fork of it (Keras' "
                "use_multiprocessing=True?). Expected batches in the process that created it. "
                "Received: a forked copy, whose cluster connection and prefetch threads did not "
                "survive the fork.\nHint: leave use_multiprocessing=False (use workers=N "
                "threads); to use the data in another process, pickle the sequence (the copy "
                "connects to the same scheduler)."
            )
        if self._closed:
            raise DaskfeedError(
                "This DaskSequence is closed. Expected an open sequence.\nHint: create a new "
                "DaskSequence (pass manifest=old.manifest to skip the scan)."
            )

    def __enter__(self) -> DaskSequence:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_owner", "_finalizer", "_closed", "_prefetcher", "_lock", "_parts"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy in this process: it connects to the same scheduler on its first batch."""
        self.__dict__.update(state)
        self._owner = _Owner()
        self._finalizer = weakref.finalize(self, self._owner.close)
        self._closed = False
        self._lock = threading.RLock()
        self._prefetcher = None
        self._plan = None
        self._set_epoch(self._epoch, self._start)

    def __repr__(self) -> str:
        return (
            f"DaskSequence({self.source!r}, label={self.label!r}, "
            f"features={len(self.features)}, "
            + (f"weight={self.weight!r}, " if self.weight else "")
            + (f"validation_split={self.validation_split:g}, subset={self.subset!r}, "
               if self.subset else "")
            + f"batch_size={self.batch_size}, "
            f"batches={len(self)}, epoch={self._epoch}, shuffle={self.shuffle}"
            + (f", start={self._start})" if self._start else ")")
        )
