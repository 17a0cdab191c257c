"""DaskSequence: a ``keras.utils.PyDataset`` whose batches are computed by a Dask cluster.

The Keras glue (``seq[i]``, epochs, closing, pickling) around data made ready by
:class:`~daskfeed.batches._prepare.Prepared` (settings, client, scan, encoding); the epoch being served
is an :class:`~daskfeed.batches._epoch.EpochCursor`, the windows' tasks a
:class:`~daskfeed.batches._windows.WindowTasks`.
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any

from daskfeed.adapters._keras import keras, refuse_narrowed
from daskfeed.batches import (
    EpochCursor,
    EpochPlan,
    EpochStats,
    PlanSettings,
    Prefetcher,
    Prepared,
    Slice,
    WindowTasks,
    window_rows_for,
)
from daskfeed.cluster import Owner, WindowCancelled, connect, refuse_multiprocessing
from daskfeed.core import ClusterError, DaskfeedError, ManifestMismatchError, Stop, config
from daskfeed.dashboard import EpochSpans
from daskfeed.manifest import Manifest, WindowData, concat

__all__ = ["DaskSequence"]

# the prepared data's names that a sequence keeps under another (private) name
_RENAMED = {"scheduler_address": "_scheduler_address", "security": "_security"}


class DaskSequence(keras.utils.PyDataset):
    """Batches of a CSV set far larger than memory, materialized by a Dask cluster.

    The data are scanned once (:func:`daskfeed.scan`), then every epoch is planned as windows
    of blocks: workers read, encode and shuffle a window and send back compact numpy arrays
    while Keras trains on the one before. ``seq[i]`` is deterministic for ``(data, seed,
    batch_size, epoch)`` in any call order and from any thread; every row is delivered once
    per epoch. A batch is ``(x, y)``, or ``(x, y, w)`` with a ``weight`` column. The README's
    "From Python" section tells more (weights, the validation split, several trainers).

    Parameters
    ----------
    data
        A path, glob (``**`` too), list of paths, fsspec URL, or ``dask.dataframe.DataFrame``.
    label
        Name of the label column.
    features, exclude
        Feature columns in order (default: every column but the label), columns to leave out.
    batch_size
        Rows per batch (default ``daskfeed.batch-size``).
    shuffle, seed
        Permute blocks per epoch and rows across a window's blocks; the seed of every permutation.
    client
        A ``distributed.Client`` or scheduler address; default: the current client, else a
        LocalCluster owned (and closed) by this sequence.
    as_matrix
        Return ``x`` as one matrix of the numeric ``features`` instead of a dict.
    manifest
        A :class:`~daskfeed.manifest._manifest.Manifest` (or its JSON path) of this data made with the
        same settings (else :class:`~daskfeed.core._exceptions.ManifestMismatchError`): no rescan.
    cache
        Keep every block parsed once as Arrow on the workers' disk (:mod:`daskfeed.cache._blocks`):
        ``True`` uses ``daskfeed.cache-dir`` when it has room, a path that directory, ``False``
        none.
    sep, encoding, dtype, na_values, blocksize, storage_options
        How the data are read (see :class:`~daskfeed.reading._source.Source`).
    bad_lines
        Lines with the wrong number of fields: ``"error"``, ``"skip"`` or ``"quarantine"``.
    reference
        Manifest whose statistics encode the features (e.g. the training set's); default: this
        data's own.
    drop_remainder
        Drop the epoch's last batch when it is short.
    shard
        ``(rank, world_size)``: serve only blocks ``b`` with ``b % world_size == rank``; shards
        serve equal full batches per epoch (:func:`~daskfeed.batches._plan.equal_shard_batches`).
    weight
        A numeric column of per-row sample weights (``>= 0`` wherever there is a label, else
        :class:`~daskfeed.core._exceptions.DataError` names the first bad row's file and line).
    validation_split, subset
        Hold out whole blocks: ``subset="training"`` or ``"validation"`` with the same ``seed``
        (:func:`~daskfeed.manifest._split.split_blocks`); each part is scanned on its own.
    vocabulary_size
        Values kept per text column (default ``daskfeed.vocabulary-size``).
    window_bytes, window_rows, prefetch_bytes, timeout
        Memory knobs (see ``daskfeed.yaml``); normally derived from ``--memory-limit``.
    spans, scan_progress, stop
        A :class:`daskfeed.dashboard._plugin.EpochSpans` (a ``distributed.span`` per epoch), a scan
        progress callback, and a :class:`daskfeed.core._lifecycle.Stop` whose request ends every wait.
    **kwargs
        ``workers`` and ``max_queue_size`` for ``keras.utils.PyDataset``;
        ``use_multiprocessing=True`` is refused (:class:`~daskfeed.SchemaError`).

    Raises
    ------
    DaskfeedError
        Bad data or settings, with what was expected, what was received and a hint.

    Notes
    -----
    A sequence owns threads and futures: close it (:meth:`close`, or ``with``). It is also
    closed when garbage-collected or at interpreter exit.

    Examples
    --------
    >>> import daskfeed
    >>> train = daskfeed.DaskSequence("data/log_quest/**/*.csv", label="cleared",
    ...                               batch_size=1024)  # doctest: +SKIP
    >>> model = daskfeed.default_model(train)  # doctest: +SKIP
    >>> model.fit(train, epochs=3, shuffle=False)  # doctest: +SKIP
    >>> train.close()  # doctest: +SKIP
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
        spans: EpochSpans | None = None,
        scan_progress: Any = None,
        stop: Stop | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_multiprocessing(kwargs)
        super().__init__(**kwargs)  # Keras' own arguments, checked before any work
        prepared = Prepared(
            data, label=label, features=features, exclude=exclude, batch_size=batch_size,
            shuffle=shuffle, seed=seed, client=client, as_matrix=as_matrix, manifest=manifest,
            reference=reference, drop_remainder=drop_remainder, prefetch_bytes=prefetch_bytes,
            timeout=timeout, blocksize=blocksize, encoding=encoding, dtype=dtype,
            storage_options=storage_options, vocabulary_size=vocabulary_size, shard=shard,
            cache=cache, bad_lines=bad_lines, sep=sep, na_values=na_values, weight=weight,
            validation_split=validation_split, subset=subset, scan_progress=scan_progress)
        self._serve(prepared, spans=spans, stop=stop, window_rows=window_rows,
                    window_bytes=window_bytes)

    @classmethod
    def of(cls, prepared: Prepared, *, window_bytes: int | str | None = None,
           window_rows: int | None = None, spans: EpochSpans | None = None,
           stop: Stop | None = None, **kwargs: Any) -> DaskSequence:
        """The sequence serving data prepared before (e.g. while keras was loading).

        Parameters
        ----------
        prepared
            The data (:class:`~daskfeed.batches._prepare.Prepared`); the sequence takes over its client.
        window_bytes, window_rows, spans, stop, **kwargs
            As :class:`DaskSequence` takes them.

        Returns
        -------
        DaskSequence
        """
        refuse_multiprocessing(kwargs)
        seq = cls.__new__(cls)
        keras.utils.PyDataset.__init__(seq, **kwargs)
        seq._serve(prepared, spans=spans, stop=stop, window_rows=window_rows,
                   window_bytes=window_bytes)
        return seq

    def _serve(self, prepared: Prepared, *, spans: EpochSpans | None, stop: Stop | None,
               window_rows: int | None, window_bytes: int | str | None) -> None:
        """Take the prepared data (and its client) over and start serving.

        Rows per window, the windows' tasks and the cursor of epoch 0 (its first windows in
        flight).
        """
        self._owner = prepared.hand_over()  # the client: this sequence's to close if owned
        for name in Prepared.SHARED:
            setattr(self, _RENAMED.get(name, name), getattr(prepared, name))
        self._finalizer = weakref.finalize(self, self._owner.close)
        self._closed = False
        self._feeds: weakref.WeakSet[Any] = weakref.WeakSet()  # tf_feed feeds: closed with it
        try:
            refuse_narrowed({c.name: c.dtype for c in self.encoding.columns}
                            | {self.label: self.encoding.label_dtype})
        except BaseException:
            self._close_client()
            raise
        self.window_rows = window_rows_for(
            window_rows, config.get_bytes("window-bytes", window_bytes), self.manifest,
            self.encoding.bytes_per_row, self.prefetch_bytes, self.batch_size)
        self.failure: DaskfeedError | None = None  # the last error a batch raised
        self.spans = spans  # one distributed.span per epoch for the windows (dashboard)
        self._stop = stop  # None: the process-wide stop request (daskfeed.core._lifecycle)
        self._windows = WindowTasks(self.source, self.manifest.fingerprint, self.encoding,
                                    self.cache, spans)
        self._cursor = self._new_cursor(0, 0)

    # -- epochs -------------------------------------------------------------------------
    def on_epoch_begin(self) -> None:
        """Keras starts an epoch: batches it read before (the TF backend's peek) are trained now."""
        self._cursor.begin()

    def on_epoch_end(self) -> None:
        """Move to the next epoch's order once every batch of this epoch was delivered.

        Keras also calls this when ``fit`` starts (``EpochIterator.reset``), after the TF
        backend peeked at batches 0 and 1; that call never advances (even when those two
        batches are all that is left of a resumed epoch, see :meth:`EpochCursor.end
        <daskfeed.batches._epoch.EpochCursor.end>`), so the peeked windows are reused and training
        starts with the current epoch.
        """
        self._cursor.end()

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Jump to ``epoch`` (e.g. when resuming); batches follow that epoch's order.

        ``start > 0`` resumes the epoch at its batch ``start``: until the epoch ends,
        ``len(seq)`` is ``num_batches - start`` and ``seq[i]`` is the epoch's batch
        ``start + i`` (same order, same rows as an uninterrupted epoch). The rows of batches
        ``0 .. start - 1`` are not delivered again, and their windows are not computed.
        The next epoch starts at batch 0. Keras fixes the steps per epoch when ``fit``
        starts, so fit such a partial epoch on its own (``fit(..., initial_epoch=epoch,
        epochs=epoch + 1)``), then the remaining epochs in a second ``fit``
        (:func:`daskfeed.training._callbacks.fit_from` does both).

        Parameters
        ----------
        epoch
            The epoch to serve.
        start
            Its first batch served.

        Raises
        ------
        ValueError
            ``start`` is not a batch of the epoch.
        """
        epoch, start = int(epoch), int(start)
        if epoch != self._cursor.epoch or start != self._cursor.start:
            self._cursor.set(epoch, start)

    def set_last_epoch(self, epoch: int | None) -> None:
        """The run ends after ``epoch`` (None: not known): no window past it is fetched ahead.

        The next epoch's first windows are computed during the current one; for the last
        epoch of a run that is work for nothing. :func:`daskfeed.training._callbacks.fit_from` sets it.

        Parameters
        ----------
        epoch
            The run's last epoch.
        """
        self._cursor.set_last_epoch(None if epoch is None else int(epoch))

    @property
    def epoch(self) -> int:
        """The epoch whose batches ``seq[i]`` returns."""
        return self._cursor.epoch

    @property
    def start(self) -> int:
        """First batch of the current epoch served (``seq[0]``): 0 except when resuming."""
        return self._cursor.start

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan."""
        return self._cursor.plan

    @property
    def rows(self) -> int:
        """Rows delivered per epoch."""
        return self.plan.rows

    @property
    def last_epoch_stats(self) -> EpochStats | dict[str, Any]:
        """:meth:`epoch_stats` of the last epoch that ended (empty before the first)."""
        return self._cursor.last_stats or {}

    def stats_of(self, epoch: int) -> EpochStats | dict[str, Any]:
        """:meth:`epoch_stats` of ``epoch`` once it ended (one of the last eight); else empty.

        A feed that reads ahead (:mod:`daskfeed.adapters._tf_data`) may end an epoch, and begin the next,
        before Keras has trained its last batches: this is that epoch's record whatever came
        after it.

        Parameters
        ----------
        epoch
            The epoch.

        Returns
        -------
        EpochStats or dict
            Its figures, or ``{}`` when it has not ended (or ended long ago).
        """
        return self._cursor.ended.get(int(epoch), {})

    def epoch_stats(self) -> EpochStats:
        """Rows and batches served, seconds waited for data, windows computed this epoch.

        Returns
        -------
        EpochStats
            The current epoch's figures so far.
        """
        return self._cursor.stats()

    # -- the cluster side ---------------------------------------------------------------
    def _client_or_connect(self) -> Any:
        """The client; after unpickling, a new connection to the same scheduler (owned)."""
        self._check_usable()
        if self._client is None:
            self._client = connect(self._scheduler_address, security=self._security)
            self._owns_client = True
        if self._client.status in ("closing", "closed"):
            raise ClusterError(
                f"The Dask client of this DaskSequence ({self._scheduler_address}) was closed. "
                "Expected a running client.\nHint: close the DaskSequence before its client, "
                "or create it again with a running client."
            )
        return self._client

    def _submit(self, plan: EpochPlan, w: int) -> Any:
        return self._windows.submit(self._client_or_connect(), plan, w)

    def _new_prefetcher(self, plan: EpochPlan, order: list[int], budget: int | None) -> Prefetcher:
        """A prefetcher bound to ``plan``, whatever epoch comes next (``budget``: room lent to it)."""
        pf = Prefetcher(
            functools.partial(self._submit, plan),
            functools.partial(self._windows.estimate, plan), order,
            budget=self.prefetch_bytes if budget is None else budget, timeout=self.timeout,
            describe=functools.partial(self._windows.describe, plan), stop=self._stop,
        )
        if self._client is not None:  # unpickled copies start on their first batch
            pf.start(within_budget=budget is not None)
        return pf

    def _new_cursor(self, epoch: int, start: int) -> EpochCursor:
        settings = PlanSettings(
            counts=tuple(self.manifest.counts), batch_size=self.batch_size, seed=self.seed,
            shuffle=self.shuffle, window_rows=self.window_rows,
            drop_remainder=self.drop_remainder, shard=self.shard)
        cursor = EpochCursor(settings, self._new_prefetcher,
                             tolerance=self.workers + self.max_queue_size + 2)
        cursor.set(epoch, start)
        return cursor

    # -- PyDataset ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self.plan.num_batches - self.start

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        """Batch ``index`` of the current epoch as ``(x, y)``, or ``(x, y, w)`` with ``weight``.

        Parameters
        ----------
        index
            From 0 (the epoch's ``start``) to ``len(self) - 1``; negative from the end.

        Returns
        -------
        tuple
            ``(x, y)`` or ``(x, y, w)`` of numpy arrays (``x`` a dict by feature, or a matrix).

        Raises
        ------
        IndexError
            ``index`` is out of range.
        DaskfeedError
            Reading the batch's windows failed (kept in ``failure`` too).
        """
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
        plan, pf, i = self._cursor.reserve(index)
        slices = plan.batch(i)
        batch = self._rows(plan, pf, slices)
        self._cursor.served(plan, i, slices)
        return batch.batch()

    def _rows(self, plan: EpochPlan, pf: Prefetcher, slices: list[Slice]) -> WindowData:
        """The rows of ``slices`` of ``plan``'s windows, in order (waiting for their windows)."""
        pieces = []
        for s in slices:
            data: WindowData = pf.get(s.window)
            expected = plan.windows[s.window].rows
            if len(data) != expected:
                raise ManifestMismatchError(
                    f"Window {s.window} ({self._windows.describe(plan, s.window)}) has {len(data)} "
                    f"rows; the manifest says {expected}. The data changed after the scan.\n"
                    "Hint: rescan (remove the cached manifest) and restart."
                )
            pieces.append(data.take(s.start, s.stop))
        return concat(pieces)

    def to_tf_dataset(self) -> Any:
        """The sequence as a ``tf.data.Dataset`` fed many batches per Python call (TensorFlow).

        The same batches as ``seq[0] .. seq[len(seq) - 1]``, each epoch the sequence's next,
        at less cost to the trainer than Keras' one call per batch of a ``PyDataset``
        (:mod:`daskfeed.adapters._tf_data` tells how epochs are counted;
        :func:`daskfeed.training.fit_from`
        uses it with the callback that keeps Keras' epochs and the sequence's in step).

        Returns
        -------
        tf.data.Dataset
            ``len(self)`` batches per pass (its cardinality).

        Examples
        --------
        >>> model.fit(seq.to_tf_dataset(), epochs=3)  # doctest: +SKIP
        """
        from daskfeed.adapters._tf_data import WindowFeed, uses_windows

        uses_windows("windows")  # refuses other backends
        return WindowFeed(self).dataset()

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
        for feed in list(self._feeds):
            feed.close()
        self._cursor.close()
        self._close_client()

    def _close_client(self) -> None:
        self._owner.close()

    def _check_usable(self) -> None:
        """Refuse a closed sequence, and a fork's copy (Keras' worker processes)."""
        self._owner.check_process()
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
        for k in ("_owner", "_finalizer", "_closed", "_cursor", "_feeds"):
            state.pop(k, None)
        state["_resume"] = (self.epoch, self.start)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy in this process: it connects to the same scheduler on its first batch."""
        self.__dict__.update(state)
        self._owner = Owner()
        self._finalizer = weakref.finalize(self, self._owner.close)
        self._closed = False
        self._feeds = weakref.WeakSet()
        self._cursor = self._new_cursor(*self.__dict__.pop("_resume"))

    def __repr__(self) -> str:
        return (
            f"DaskSequence({self.source!r}, label={self.label!r}, "
            f"features={len(self.features)}, "
            + (f"weight={self.weight!r}, " if self.weight else "")
            + (f"validation_split={self.validation_split:g}, subset={self.subset!r}, "
               if self.subset else "")
            + f"batch_size={self.batch_size}, "
            f"batches={len(self)}, epoch={self.epoch}, shuffle={self.shuffle}"
            + (f", start={self.start})" if self.start else ")")
        )
