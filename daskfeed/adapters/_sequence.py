"""DaskSequence: a ``keras.utils.PyDataset`` whose batches are computed by a Dask cluster.

The Keras glue (``seq[i]``, Keras' epoch calls, ``to_tf_dataset``) over a keras-free
:class:`~daskfeed.batches._stream.BatchStream` of data made ready by
:class:`~daskfeed.batches._prepare.Prepared` (settings, client, scan, encoding). The data's
settings are read from the prepared data, never copied.
"""

from __future__ import annotations

import difflib
import inspect
import os
from typing import TYPE_CHECKING, Any

from daskfeed.adapters._budget import InBudget
from daskfeed.adapters._keras import keras, refuse_narrowed
from daskfeed.adapters._tf_data import TFDataHandoff, uses_tf_data
from daskfeed.batches import BatchStream, DataSettings, EpochPlan, EpochStats, Prepared
from daskfeed.cluster import close_client, refuse_multiprocessing
from daskfeed.core import DaskfeedError, Stop, refuse_setting, warn_user
from daskfeed.dashboard import EpochSpans
from daskfeed.manifest import Manifest

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client

    from daskfeed.reading import Listing, PathsLike
    from daskfeed.scanning import ProgressCallback


class _Setting:
    """A setting of the data served, read where it is kept: the resolved settings (one place)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, seq: Any, owner: type | None = None) -> Any:
        return self if seq is None else getattr(seq.stream.data.settings, self.name)


class _Prepared:
    """What the data were made into (source, manifest, features, encoding, cache)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, seq: Any, owner: type | None = None) -> Any:
        return self if seq is None else getattr(seq.stream.data, self.name)


class DaskSequence(keras.utils.PyDataset):
    """Batches of a CSV set far larger than memory, materialized by a Dask cluster.

    The data are scanned once (:func:`daskfeed.scan`), then every epoch is planned as windows
    of blocks: workers read, encode and shuffle a window and send back compact numpy arrays
    while Keras trains on the one before. ``seq[i]`` is deterministic for ``(data, seed,
    batch_size, epoch)`` in any call order and from any thread; every row is delivered once
    per epoch. A batch is ``(x, y)``, or ``(x, y, w)`` with a ``weight`` column. The guide
    ``docs/python.md`` tells more (weights, the validation split, several trainers).

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
    memory_limit
        One memory budget (``"4GB"``), as :class:`~daskfeed.TorchDataset` and ``daskfeed train``
        take it. Without ``client``: the whole process tree's, split as ``daskfeed train``
        splits it (a LocalCluster of ``nworkers`` started, and closed with the sequence; the
        prefetched windows, the shuffle windows and the blocks sized from it). With a
        ``client``: this process's own (prefetch), the windows sized from its workers. None:
        the ``daskfeed.*`` config's sizes.
    nworkers
        Workers of the LocalCluster started for ``memory_limit`` (default: from the CPUs).
    as_matrix
        Return ``x`` as one matrix of the numeric ``features`` instead of a dict.
    manifest
        A :class:`~daskfeed.Manifest` (or its JSON path) of this data made with the
        same settings (else :class:`~daskfeed.ManifestMismatchError`): no rescan.
    cache
        Keep every block parsed once as Arrow on the workers' disk (:mod:`daskfeed.cache`):
        ``True`` uses ``daskfeed.cache-dir`` when it has room, a path that directory, ``False``
        none.
    sep, encoding, dtype, na_values, decimal, blocksize, storage_options
        How the data are read (see :class:`~daskfeed.Source`).
    bad_lines
        Lines with the wrong number of fields: ``"error"``, ``"skip"`` or ``"quarantine"``.
    reference
        The training data: its ``DaskSequence`` (its statistics encode the features, and its
        features are this sequence's unless ``features`` / ``exclude`` are given), or its
        manifest (its statistics only); default: this data's own.
    drop_remainder
        Drop the epoch's last batch when it is short.
    skip_batches
        Batches of the global order to leave out, ``"3:48200-48260,4:17"`` (epochs and steps
        from 1, as ``daskfeed rows`` numbers them; ``docs/tracing.md``); a resume state
        (:meth:`~daskfeed.batches.BatchStream.set_state`) adds those it recorded.
    shard
        ``(rank, world_size)``: serve only blocks ``b`` with ``b % world_size == rank``; shards
        serve equal full batches per epoch (``docs/scale-out.md``, "Several trainers").
    weight
        A numeric column of per-row sample weights (``>= 0`` wherever there is a label, else
        :class:`~daskfeed.DataError` names the first bad row's file and line).
    validation_split, subset
        Hold out whole blocks: ``subset="training"`` or ``"validation"`` with the same ``seed``
        (``docs/command-line.md``, "Weights, a validation split, early stopping"); each part is
        scanned on its own.
    vocabulary_size
        Values kept per text column (default ``daskfeed.vocabulary-size``).
    window_bytes, window_rows, prefetch_bytes, timeout
        Memory knobs (see ``daskfeed.yaml``); normally derived from ``--memory-limit``.
    spans, scan_progress, stop
        A :class:`daskfeed.dashboard.EpochSpans` (a ``distributed.span`` per epoch), a scan
        progress callback, and a :class:`daskfeed.core.Stop` whose request ends every wait.
    **kwargs
        ``workers`` and ``max_queue_size`` for ``keras.utils.PyDataset``: ``workers > 1`` is
        taken as 1, with a warning (Keras' threads would train some epochs' batches twice and
        others' never; the sequence reads its windows ahead itself);
        ``use_multiprocessing=True`` is refused, and so is any other name
        (:class:`~daskfeed.SettingError`, naming it).

    Raises
    ------
    DaskfeedError
        Bad data or settings, with what was expected, what was received and a hint.

    Notes
    -----
    The batches come from a keras-free :class:`~daskfeed.batches.BatchStream`
    (``seq.stream``), which the tf.data hand-off reads too. A sequence owns threads and futures:
    close it (:meth:`close`, or ``with``). It is also closed when garbage-collected or at
    interpreter exit.

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
        data: PathsLike | Listing | dd.DataFrame,
        *,
        label: str,
        features: list[str] | None = None,
        exclude: tuple[str, ...] | list[str] = (),
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        client: Client | str | None = None,
        memory_limit: int | str | None = None,
        nworkers: int | None = None,
        as_matrix: bool = False,
        manifest: Manifest | str | os.PathLike[str] | None = None,
        reference: Manifest | DaskSequence | None = None,
        drop_remainder: bool = False,
        skip_batches: str | None = None,
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
        sep: str | None = None,
        na_values: list[str] | tuple[str, ...] | None = None,
        decimal: str = ".",
        weight: str | None = None,
        validation_split: float | None = None,
        subset: str | None = None,
        spans: EpochSpans | None = None,
        scan_progress: ProgressCallback | None = None,
        stop: Stop | None = None,
        **kwargs: Any,
    ) -> None:
        _keras_arguments(kwargs)
        super().__init__(**kwargs)  # Keras' own arguments, checked before any work
        if isinstance(reference, DaskSequence):  # the training sequence: its features too
            if features is None and not exclude:
                features = list(reference.features)
            reference = reference.reference
        owned: Client | None = None  # a client started (or connected) for these data
        placed = InBudget.open(memory_limit, client=client, nworkers=nworkers,  # one budget, as
                               prefetch_bytes=prefetch_bytes, window_bytes=window_bytes,  # train's
                               blocksize=blocksize)
        if placed is not None:
            client, owned = placed.client, placed.client if placed.owned else None
            prefetch_bytes, window_bytes = placed.prefetch_bytes, placed.window_bytes
            blocksize = placed.blocksize
        try:
            settings = DataSettings.resolve(  # every setting resolved here, once
                label=label, features=features, exclude=exclude, weight=weight,
                batch_size=batch_size, shuffle=shuffle, seed=seed, as_matrix=as_matrix,
                drop_remainder=drop_remainder, shard=shard, timeout=timeout,
                prefetch_bytes=prefetch_bytes, window_bytes=window_bytes,
                vocabulary_size=vocabulary_size, cache=cache, validation_split=validation_split,
                subset=subset, blocksize=blocksize, encoding=encoding, dtype=dtype,
                storage_options=storage_options, bad_lines=bad_lines, sep=sep,
                na_values=na_values, decimal=decimal, skip_batches=skip_batches)
        except BaseException:
            if owned is not None:
                close_client(owned)
            raise
        prepared = Prepared(data, settings, client=client, manifest=manifest,
                            reference=reference, scan_progress=scan_progress,
                            owns_client=owned is not None)
        self._serve(prepared, spans=spans, stop=stop, window_rows=window_rows)

    @classmethod
    def of(cls, prepared: Prepared, *, window_rows: int | None = None,
           spans: EpochSpans | None = None, stop: Stop | None = None,
           **kwargs: Any) -> DaskSequence:
        """The sequence serving data prepared before (e.g. while keras was loading).

        Parameters
        ----------
        prepared
            The data (:class:`~daskfeed.batches.Prepared`); the sequence takes over its client.
        window_rows, spans, stop, **kwargs
            As :class:`DaskSequence` takes them (the window bytes are the prepared data's).

        Returns
        -------
        DaskSequence
        """
        _keras_arguments(kwargs)
        seq = cls.__new__(cls)
        keras.utils.PyDataset.__init__(seq, **kwargs)
        seq._serve(prepared, spans=spans, stop=stop, window_rows=window_rows)
        return seq

    def _serve(self, prepared: Prepared, *, spans: EpochSpans | None, stop: Stop | None,
               window_rows: int | None) -> None:
        """Check the data fit the backend, then serve them from a stream (first windows in flight)."""
        try:
            refuse_narrowed({c.name: c.dtype for c in prepared.encoding.columns}
                            | {prepared.settings.label: prepared.encoding.label_dtype})
        except BaseException:
            prepared.close()
            raise
        self.stream = BatchStream(prepared, window_rows=window_rows, spans=spans, stop=stop,
                                  tolerance=self.workers + self.max_queue_size + 2)

    # -- the data's settings (DaskSequence's arguments, resolved) and what they were made into
    label = _Setting()
    weight = _Setting()
    batch_size = _Setting()
    validation_split = _Setting()
    subset = _Setting()
    shuffle = _Setting()
    seed = _Setting()
    drop_remainder = _Setting()
    shard = _Setting()
    timeout = _Setting()
    prefetch_bytes = _Setting()
    as_matrix = _Setting()
    source = _Prepared()
    cache = _Prepared()
    cache_status = _Prepared()
    manifest = _Prepared()
    reference = _Prepared()
    features = _Prepared()
    encoding = _Prepared()

    @property
    def window_rows(self) -> int:
        """Rows per window."""
        return self.stream.window_rows

    @property
    def spans(self) -> EpochSpans | None:
        """One ``distributed.span`` per epoch for the windows (the dashboard), or None."""
        return self.stream.spans

    @spans.setter
    def spans(self, spans: EpochSpans | None) -> None:
        self.stream.spans = spans

    @property
    def failure(self) -> DaskfeedError | None:
        """The last error a batch raised (Keras' TF backend re-raises it as a tf error)."""
        return self.stream.failure

    # -- epochs -------------------------------------------------------------------------
    def on_epoch_begin(self) -> None:
        """Keras starts an epoch: batches it read before (the TF backend's peek) are trained now.

        Not when Keras reads a batch to build the model (PyTorch and JAX, and TensorFlow under a
        distribution strategy): that pass also begins and ends an epoch, and a resumed epoch
        with one batch left would end there, its batch never trained.
        """
        if _building_the_model():
            self.stream.peek()
        else:
            self.stream.begin()

    def on_epoch_end(self) -> None:
        """Move to the next epoch's order once every batch of this epoch was delivered.

        Keras also calls this when ``fit`` starts (``EpochIterator.reset``), after the TF
        backend peeked at batches 0 and 1; that call never advances (even when those two
        batches are all that is left of a resumed epoch: such an epoch ends when the next batch
        is asked for, or at a second ``on_epoch_end`` with no ``on_epoch_begin`` between), so the
        peeked windows are reused and training starts with the current epoch.
        """
        self.stream.end()

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Jump to ``epoch`` (e.g. when resuming); batches follow that epoch's order.

        ``start > 0`` resumes the epoch at its batch ``start``: until the epoch ends,
        ``len(seq)`` is ``num_batches - start`` and ``seq[i]`` is the epoch's batch
        ``start + i`` (same order, same rows as an uninterrupted epoch). The rows of batches
        ``0 .. start - 1`` are not delivered again, and their windows are not computed.
        The next epoch starts at batch 0. Keras fixes the steps per epoch when ``fit``
        starts, so fit such a partial epoch on its own (``fit(..., initial_epoch=epoch,
        epochs=epoch + 1)``), then the remaining epochs in a second ``fit``
        (:func:`daskfeed.fit_from` does both).

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
        self.stream.set_epoch(epoch, start)

    @property
    def global_order(self) -> bool:
        """Whether batches follow the global order (the parse cache on files, shuffled).

        Then an epoch's order of rows follows from the data, the seed and the epoch alone; the
        budget (window size) and the number of trainers only decide how it is read and shared,
        and :meth:`set_position` resumes under any of them.
        """
        return self.stream.global_order

    def position(self, batch: int | None = None, epoch: int | None = None) -> int:
        """Batches of ``epoch`` trained by all trainers once this one's ``batch`` is next.

        See :meth:`BatchStream.position <daskfeed.batches.BatchStream.position>`.
        """
        return self.stream.position(batch, epoch)

    def set_position(self, epoch: int, position: int) -> None:
        """Serve ``epoch`` from ``position`` (a checkpoint's), in this sequence's layout.

        With the global order, under any budget and any number of trainers: this trainer goes
        on with its share of the batches from ``position`` on. Else as :meth:`set_epoch`.
        """
        self.stream.set_position(epoch, position)

    def set_last_epoch(self, epoch: int | None) -> None:
        """The run ends after ``epoch`` (None: not known): no window past it is fetched ahead.

        The next epoch's first windows are computed during the current one; for the last
        epoch of a run that is work for nothing. :func:`daskfeed.fit_from` sets it.

        Parameters
        ----------
        epoch
            The run's last epoch.
        """
        self.stream.set_last_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch whose batches ``seq[i]`` returns."""
        return self.stream.epoch

    @property
    def start(self) -> int:
        """First batch of the current epoch served (``seq[0]``): 0 except when resuming."""
        return self.stream.start

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan."""
        return self.stream.plan

    @property
    def rows(self) -> int:
        """Rows delivered per epoch."""
        return self.plan.rows

    @property
    def last_epoch_stats(self) -> EpochStats | dict[str, Any]:
        """:meth:`epoch_stats` of the last epoch that ended (empty before the first)."""
        return self.stream.last_epoch_stats

    def stats_of(self, epoch: int) -> EpochStats | dict[str, Any]:
        """:meth:`epoch_stats` of ``epoch`` once it ended (one of the last eight); else empty.

        A feed that reads ahead (the tf.data hand-off, :meth:`to_tf_dataset`) may end an epoch, and
        begin the next, before Keras has trained its last batches: this is that epoch's record
        whatever came after it.

        Parameters
        ----------
        epoch
            The epoch.

        Returns
        -------
        EpochStats or dict
            Its figures, or ``{}`` when it has not ended (or ended long ago).
        """
        return self.stream.stats_of(epoch)

    def epoch_stats(self) -> EpochStats:
        """Rows and batches served, seconds waited for data, windows computed this epoch.

        Returns
        -------
        EpochStats
            The current epoch's figures so far.
        """
        return self.stream.epoch_stats()

    # -- PyDataset ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.stream)

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
            Reading the batch's windows failed (kept in ``failure`` too: Keras' TF backend
            reads batches in a tf.data py_function, which re-raises it as a tf UnknownError;
            ``train()`` re-raises this one instead).
        """
        return self.stream.batch(index)

    def to_tf_dataset(self) -> Any:
        """The sequence as a ``tf.data.Dataset`` fed many batches per Python call (TensorFlow).

        The same batches as ``seq[0] .. seq[len(seq) - 1]``, each epoch the sequence's next,
        at less cost to the trainer than Keras' one call per batch of a ``PyDataset``
        (:func:`daskfeed.fit_from` uses it with the callback that keeps Keras' epochs and the
        sequence's in step; without that callback each pass is the sequence's next epoch, and
        after a pass cut short the next pass drops the rest of that epoch and is the epoch after it).

        Returns
        -------
        tf.data.Dataset
            ``len(self)`` batches per pass (its cardinality).

        Examples
        --------
        >>> model.fit(seq.to_tf_dataset(), epochs=3)  # doctest: +SKIP
        """
        uses_tf_data("tf-data")  # refuses other backends
        return TFDataHandoff(self.stream).dataset()

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.stream.closed

    def close(self) -> None:
        """Stop prefetching, release windows in flight, close the client if this sequence started it.

        Idempotent and quick: futures are released without waiting for the scheduler. Also
        runs when the sequence is garbage-collected or the interpreter exits. A closed
        sequence serves no batch. In a forked child it does nothing (the parent's
        connection is not the child's to close).
        """
        self.stream.close()

    def __enter__(self) -> DaskSequence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if "stream" not in self.__dict__:  # (a debugger's view of one still being made)
            return "<DaskSequence, not built yet>"
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


def _keras_arguments(kwargs: dict[str, Any]) -> None:
    """Refuse, before any work, what ``keras.utils.PyDataset`` would not take (or not run).

    Keras' own arguments (``workers``, ``max_queue_size``, ...) pass; ``workers > 1`` becomes 1
    (warned: see :func:`_one_keras_thread`); ``use_multiprocessing=True`` is refused
    (:func:`~daskfeed.cluster.refuse_multiprocessing`), and a name neither ``DaskSequence`` nor
    Keras takes is named, with the closest ones, instead of Keras' ``TypeError``.

    Raises
    ------
    SettingError
        A Keras worker process asked for, or an argument no one takes.
    """
    refuse_multiprocessing(kwargs)
    _one_keras_thread(kwargs)
    taken = [name for name, p in inspect.signature(keras.utils.PyDataset.__init__).parameters.items()
             if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [name for name in kwargs if name not in taken]
    if not unknown:
        return
    ours = [name for name in inspect.signature(DaskSequence.__init__).parameters
            if name not in ("self", "data", "kwargs")]
    close = {name: difflib.get_close_matches(name, ours + taken, n=1) for name in unknown}
    guesses = [f"{name!r} -> {close[name][0]!r}" for name in unknown if close[name]]
    refuse_setting(
        "Expected DaskSequence's arguments (see help(daskfeed.DaskSequence)) or Keras' "
        f"PyDataset's ({', '.join(taken)}).",
        f"{', '.join(f'{name}={kwargs[name]!r}' for name in unknown)}, which neither takes",
        (f"did you mean {', '.join(guesses)}?" if guesses else
         f"leave {'it' if len(unknown) == 1 else 'them'} out, or set what it means through the "
         "arguments above."))


def _one_keras_thread(kwargs: dict[str, Any]) -> None:
    """``workers=N > 1`` (Keras' threads reading batches ahead) becomes 1, with a warning.

    Keras' enqueuer keeps what its threads read ahead when a pass stops, and hands it out first
    in the next: after the pass Keras makes to build a model (PyTorch and JAX, TensorFlow under
    a strategy) each epoch of ``fit`` trained the batches read ahead of the epoch before, some
    of them twice and others never (measured: ``fit(epochs=3)`` trained epoch 0's batches 1-5
    twice and epoch 2's never). The sequence reads its windows ahead on the cluster itself, so
    the threads only sliced arrays.
    """
    workers = kwargs.get("workers", 1)
    if isinstance(workers, int) and workers > 1:
        warn_user(
            f"daskfeed: DaskSequence takes workers={workers} as workers=1. Expected one Keras "
            "thread reading batches: Keras' threads keep batches they read ahead when a pass "
            "stops and hand them out in the next one, so after a model's build epochs would "
            "train batches of the epoch before, some twice and others never.\nHint: leave "
            "workers out; the batches' windows are read ahead on the Dask cluster "
            "(prefetch_bytes) already.")
        kwargs["workers"] = 1


# Keras' trainers reading one batch of a fit's data to build the model before training
_BUILDS = frozenset({"_symbolic_build", "_maybe_symbolic_build"})


def _building_the_model(depth: int = 16) -> bool:
    """Whether Keras called this while reading a batch to build the model (not an epoch).

    Its trainer's ``_symbolic_build`` (``_maybe_symbolic_build`` on TensorFlow) iterates the
    epoch iterator, whose first step calls the adapter's ``on_epoch_begin``; so does JAX's
    ``predict`` itself, for a model not built yet. Nothing else of Keras' says so. Looked for
    among the few frames above (``depth``).
    """
    frame = inspect.currentframe()
    for _ in range(depth):
        if frame is None:
            return False
        code = frame.f_code
        if "keras" in code.co_filename and (
                code.co_name in _BUILDS or (code.co_name == "predict" and _jax_unbuilt(frame))):
            return True
        frame = frame.f_back
    return False


def _jax_unbuilt(frame: Any) -> bool:
    """Whether ``frame`` is JAX's ``predict`` of a model not built yet (it reads a batch first)."""
    if not frame.f_code.co_filename.replace("\\", "/").endswith("jax/trainer.py"):
        return False
    local = frame.f_locals
    if "outputs" in local:  # bound once the build is over: predict's own pass
        return False
    layers = getattr(local.get("self"), "_flatten_layers", None)
    return layers is not None and not all(layer.built for layer in layers())
