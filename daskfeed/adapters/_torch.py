"""TorchDataset: a data set's batches as torch tensors, for a plain PyTorch training loop.

A ``torch.utils.data.IterableDataset`` over the keras-free
:class:`~daskfeed.batches.BatchStream` (no keras is imported): each ``iter()`` is one epoch,
every row exactly once, in the order ``(data, seed, batch_size, epoch)`` sets, and the next
``iter()`` the next epoch. ``state_dict()`` / ``load_state_dict()`` (torchdata's ``Stateful``
convention) resume exactly after the last batch yielded, also mid-epoch and in another process.
Ranks of ``torch.distributed`` read their own shard of the blocks, as ``daskfeed train``'s ranks
do. The batches are already batched: hand the dataset to a ``DataLoader`` with
``batch_size=None`` (and ``num_workers=0``: the Dask workers read and encode; copies of the
dataset in ``DataLoader`` worker processes would each serve the whole epoch).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from daskfeed.adapters._budget import InBudget
from daskfeed.batches import BatchStream, DataSettings, Prepared, StreamState
from daskfeed.cluster import close_client, trainer_threads
from daskfeed.core import BackendError, refuse_setting
from daskfeed.manifest import Manifest

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client

    from daskfeed.reading import Listing, PathsLike

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as err:  # pragma: no cover  (the torch extra is installed where tested)
    raise BackendError(
        "Expected PyTorch installed for daskfeed.TorchDataset. Received: "
        f"{err}.\nHint: pip install 'daskfeed[torch]' (make test-torch prefers the CPU wheel)."
    ) from err


class TorchDataset(IterableDataset):  # type: ignore[type-arg,misc]
    """Batches of a CSV set far larger than memory as torch tensors, read by a Dask cluster.

    Each ``iter()`` yields the rest of the current epoch, batch by batch, then moves to the next
    epoch: ``(x, y)`` or ``(x, y, w)`` with a ``weight`` column, ``x`` a dict of one tensor per
    feature column (text as int32 codes) or, with ``as_matrix=True``, one matrix of the numeric
    features. Numbers keep their value: a column beyond float32's exact range arrives as
    ``torch.int64`` or ``torch.float64``.

    Parameters
    ----------
    data
        A path, glob (``**`` too), list of paths, fsspec URL, or ``dask.dataframe.DataFrame``.
    label
        Name of the label column.
    memory_limit
        One memory budget (``"4GB"``). Without ``client``: the whole process tree's, split as
        ``daskfeed train`` splits it (a LocalCluster of ``nworkers`` started, and closed with
        the dataset; the prefetched batches and the shuffle windows sized from it). With a
        ``client``: this process's own (prefetch), the windows sized from its workers. None:
        the ``daskfeed.*`` config's sizes (and the current client, else a LocalCluster).
    client
        A ``distributed.Client`` or scheduler address (see ``memory_limit``).
    nworkers
        Workers of the LocalCluster started for ``memory_limit`` (default: from the CPUs).
    shard
        ``(rank, world_size)``: read only blocks ``b % world_size == rank``; every rank serves
        the same number of full batches per epoch. None: ``torch.distributed``'s rank and world
        size once its process group is initialized, else ``(0, 1)``.
    manifest, reference
        As :class:`~daskfeed.DaskSequence` takes them; ``reference`` may be the training
        ``TorchDataset`` (its statistics and features encode this data).
    features, exclude, batch_size, shuffle, seed, as_matrix, weight, cache, drop_remainder, skip_batches
        The data's settings, as :class:`~daskfeed.DaskSequence` takes them (one list of them:
        :meth:`DataSettings.resolve <daskfeed.batches.DataSettings.resolve>`).
    validation_split, subset, window_bytes, window_rows, prefetch_bytes, timeout
        Likewise (``window_bytes``, ``prefetch_bytes`` and, with a LocalCluster started for
        it, ``blocksize``: from ``memory_limit`` when not given).
    blocksize, encoding, dtype, storage_options, vocabulary_size, bad_lines, sep, na_values, decimal
        How the files are read, likewise.

    Beside a LocalCluster daskfeed starts (``memory_limit``, or no client), torch's threads are
    set for the budget (``torch.set_num_threads``): ``OMP_NUM_THREADS`` where this process has
    it, else the cores the cluster's workers leave, at least one (``threads`` says which). Its
    threads spin while they wait, and slow to a crawl on cores the workers use; and distributed
    sets ``OMP_NUM_THREADS=1`` in the process that starts its workers, so torch's own default
    depended on when it was imported. With a ``client`` of your own, torch is left as it is.

    Raises
    ------
    DaskfeedError
        Bad data or settings, with what was expected, what was received and a hint.

    Examples
    --------
    >>> ds = daskfeed.TorchDataset("data/log_quest/**/*.csv", label="cleared", as_matrix=True,
    ...                            exclude=["quest_id", "class", "region"],
    ...                            memory_limit="4GB")  # doctest: +SKIP
    >>> for epoch in range(3):  # doctest: +SKIP
    ...     for x, y in ds:
    ...         ...
    >>> ds.close()  # doctest: +SKIP
    """

    stream: BatchStream  # the batches, epoch after epoch
    threads: str | None  # torch's threads as set for the budget, in a line (None: left alone)

    def __init__(self, data: PathsLike | Listing | dd.DataFrame, *, label: str,
                 memory_limit: int | str | None = None,
                 client: Client | str | None = None, nworkers: int | None = None,
                 shard: tuple[int, int] | None = None,
                 manifest: Manifest | str | os.PathLike[str] | None = None,
                 reference: Manifest | TorchDataset | None = None,
                 features: list[str] | None = None, exclude: tuple[str, ...] | list[str] = (),
                 batch_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 as_matrix: bool = False, drop_remainder: bool = False,
                 skip_batches: str | None = None,
                 window_bytes: int | str | None = None, window_rows: int | None = None,
                 prefetch_bytes: int | str | None = None, timeout: float | str | None = None,
                 blocksize: int | str | None = None, encoding: str = "utf-8",
                 dtype: dict[str, str] | None = None,
                 storage_options: dict[str, Any] | None = None,
                 vocabulary_size: int | None = None,
                 cache: bool | str | os.PathLike[str] = True, bad_lines: str = "error",
                 sep: str | None = None, na_values: list[str] | tuple[str, ...] | None = None,
                 decimal: str = ".", weight: str | None = None,
                 validation_split: float | None = None, subset: str | None = None) -> None:
        super().__init__()
        ref = reference if isinstance(reference, Manifest) else None
        if isinstance(reference, TorchDataset):  # the training data: its features too
            if features is None and not exclude:
                features = list(reference.features)
            ref = reference.manifest
        rank, world = _distributed_shard() if shard is None else shard
        self._owned: Any = None  # the client of the LocalCluster started for memory_limit
        placed = InBudget.open(memory_limit, client=client, nworkers=nworkers,  # (as DaskSequence)
                               prefetch_bytes=prefetch_bytes, window_bytes=window_bytes,
                               blocksize=blocksize)
        if placed is not None:
            client = placed.client
            if placed.owned:
                self._own(client)
            prefetch_bytes, window_bytes = placed.prefetch_bytes, placed.window_bytes
            blocksize = placed.blocksize
        try:
            resolved = DataSettings.resolve(  # every setting resolved here, once
                label=label, features=features, exclude=exclude, weight=weight,
                batch_size=batch_size, shuffle=shuffle, seed=seed, as_matrix=as_matrix,
                drop_remainder=drop_remainder, shard=(int(rank), int(world)), timeout=timeout,
                prefetch_bytes=prefetch_bytes, window_bytes=window_bytes,
                vocabulary_size=vocabulary_size, cache=cache, validation_split=validation_split,
                subset=subset, blocksize=blocksize, encoding=encoding, dtype=dtype,
                storage_options=storage_options, bad_lines=bad_lines, sep=sep,
                na_values=na_values, decimal=decimal, skip_batches=skip_batches)
            prepared = Prepared(data, resolved, client=client, manifest=manifest, reference=ref)
            self.stream = BatchStream(prepared, window_rows=window_rows)
        except BaseException:
            self._close_owned()
            raise
        self.threads = set_torch_threads(prepared.client)

    def _own(self, client: Client) -> None:
        """Close ``client`` (and its LocalCluster) with the dataset, or when it is collected."""
        self._owned = client
        self._finalizer = weakref.finalize(self, close_client, client)

    # -- the data -----------------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        """What the scan found (columns, statistics, blocks)."""
        return self.stream.data.manifest

    @property
    def features(self) -> list[str]:
        """The feature columns, in order."""
        return list(self.stream.data.features)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` serves (or is serving)."""
        return self.stream.epoch

    @property
    def rows(self) -> int:
        """Rows of an epoch (this shard's)."""
        return self.stream.plan.rows

    def __len__(self) -> int:
        """Batches of a whole epoch (``DataLoader`` and progress bars read it)."""
        return self.stream.plan.num_batches

    # -- batches ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """The current epoch's batches from where the dataset stands, as tensors; then the next epoch.

        Raises
        ------
        DaskfeedError
            Read in a ``DataLoader`` worker process (``num_workers > 0``).
        """
        return _tensor_batches(self.stream, "TorchDataset")

    # -- resume (torchdata's Stateful convention) ---------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the dataset stands: after the last batch yielded (an epoch read to its end: the next).

        Returns
        -------
        dict
            The stream's resume state as it is (:meth:`BatchStream.get_state
            <daskfeed.batches.BatchStream.get_state>`: plain values, versioned), for
            ``torch.save`` beside the model's and the optimizer's state.
        """
        return self.stream.get_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on from a :meth:`state_dict`: the next ``iter()`` serves the batch after its last one.

        Parameters
        ----------
        state_dict
            Of this dataset or of one with the same data and settings (in the global order,
            under any budget or number of trainers); a state of an older daskfeed is read too.

        Raises
        ------
        CheckpointError
            The state is of other data or settings, or of no ``TorchDataset``.
        """
        self.stream.set_state(state_dict, where="The TorchDataset state")

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Stop prefetching, release windows in flight; close the cluster the dataset started."""
        stream = getattr(self, "stream", None)
        if stream is not None:
            stream.close()
        self._close_owned()

    def _close_owned(self) -> None:
        if self._owned is not None:
            self._finalizer()
            self._owned = None

    def __enter__(self) -> TorchDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        st = self.stream.data.settings
        return (f"TorchDataset({self.stream.data.source!r}, label={st.label!r}, "
                f"features={len(self.features)}, batch_size={st.batch_size}, "
                f"batches={len(self)}, epoch={self.epoch}, shard={tuple(st.shard)})")


class StreamLoader(IterableDataset):  # type: ignore[type-arg,misc]
    """A stream's batches as tensors for Keras' ``fit`` on PyTorch: the ``dataloader`` hand-off.

    :func:`~daskfeed.adapters._handoff.fit_inputs` hands ``fit`` a ``DataLoader`` of it
    (``batch_size=None``): each of Keras' epochs takes ``len`` batches from a new iterator, read
    a run of batches at a time (:meth:`BatchStream.runs
    <daskfeed.batches.BatchStream.runs>`), so a step costs a slice of arrays already batched
    instead of a ``PyDataset`` call, its window lookup and copy, and Keras' conversion. The
    batches and their order are the sequence's ``seq[0] .. seq[len(seq) - 1]``, epoch after
    epoch (the stream moves on as an epoch's last batch is handed out).

    Keras' first ``fit`` of a model takes one batch from an iterator to build it, then starts
    the epoch with a new one: :meth:`undo_passes` (called at ``on_train_begin``) serves that
    batch again, also when it was its epoch's only one. A pass (an iterator read) cut short
    before its epoch's end is likewise served again from where it began by the next pass.

    Parameters
    ----------
    stream
        The sequence's stream, where ``fit`` starts: ``len`` is the batches it serves of that
        epoch (the rest of a resumed one; ``fit_from`` fits a resumed epoch alone).
    """

    def __init__(self, stream: BatchStream) -> None:
        super().__init__()
        self.stream = stream
        self._len = len(stream)
        self._began: tuple[StreamState, int] | None = None  # where the last pass began

    def __len__(self) -> int:
        """Batches of an epoch from where the stream stood (Keras' steps per epoch)."""
        return self._len

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """The stream's current epoch from where it stands, as tensors (see the class's text)."""
        return self._pass()

    def undo_passes(self) -> None:
        """Serve again from where the last pass began (Keras' look at a batch before training)."""
        if self._began is not None:
            self._back(*self._began)
            self._began = None

    def _back(self, state: StreamState, iterated: int) -> None:
        if self.stream.epoch == state.epoch:
            self.stream.rewind(iterated)  # (the windows held stay)
        else:  # it moved on: an epoch of one batch
            self.stream.set_state(state)

    def _pass(self) -> Iterator[tuple[Any, ...]]:
        # (a generator: an iterator made and never read, as Keras makes one at an epoch's end,
        # runs none of this)
        if self._began is not None and self.stream.epoch == self._began[0].epoch:
            self._back(*self._began)  # the last pass was cut short within its epoch
        self._began = (self.stream.state(), self.stream.iterated)
        yield from _tensor_batches(self.stream, "the dataloader hand-off")


def dataloader(stream: BatchStream) -> torch.utils.data.DataLoader:
    """``stream``'s batches as the ``DataLoader`` Keras' ``fit`` takes on PyTorch (see :class:`StreamLoader`).

    Parameters
    ----------
    stream
        The sequence's stream.

    Returns
    -------
    torch.utils.data.DataLoader
        Of already batched ``(x, y)`` / ``(x, y, w)`` tensors (``batch_size=None``, read in
        the trainer's thread: ``num_workers=0``).
    """
    return torch.utils.data.DataLoader(StreamLoader(stream), batch_size=None, num_workers=0)


def _tensor_batches(stream: BatchStream, what: str) -> Iterator[tuple[Any, ...]]:
    """The rest of ``stream``'s current epoch as tuples of tensors, read a run at a time."""
    if get_worker_info() is not None:
        refuse_setting(
            f"Expected {what} in a DataLoader with num_workers=0 (the Dask workers read "
            "and encode the batches).",
            "a DataLoader worker process (num_workers > 0), where each copy would serve the "
            "whole epoch and its position would be lost",
            "DataLoader(dataset, batch_size=None, num_workers=0), or iterate the dataset itself.")
    for batch in stream.runs():
        yield tuple(_tensors(part) for part in batch)


def _tensors(part: Any) -> Any:
    """A batch's arrays as tensors sharing their memory (a dict stays a dict).

    The arrays are views of a run of batches the stream copied for this iteration
    (:meth:`BatchStream.runs <daskfeed.batches.BatchStream.runs>`): no other batch shares
    their rows, so a loop may change a batch in place.
    """
    if isinstance(part, dict):
        return {k: torch.from_numpy(v) for k, v in part.items()}
    return torch.from_numpy(part)


def _distributed_shard() -> tuple[int, int]:
    """``torch.distributed``'s rank and world size where its process group is up; else ``(0, 1)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def set_torch_threads(client: Client) -> str | None:
    """Set torch's threads for the cores ``client``'s workers leave this process, and say so.

    Only beside a LocalCluster daskfeed started here (:func:`~daskfeed.cluster.trainer_threads`:
    ``OMP_NUM_THREADS`` as this process had it, else the cores less the workers' threads, at
    least one); torch is left as it is beside a cluster given as a client or an address.

    Parameters
    ----------
    client
        The client the data are read by.

    Returns
    -------
    str or None
        What was set and why, in a line; None when torch was left alone.
    """
    found = trainer_threads(client)
    if found is None:
        return None
    threads, why = found
    torch.set_num_threads(threads)
    return f"torch: {threads} thread(s) for the model ({why})"
