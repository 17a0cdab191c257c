"""The Keras side of a run: the checkpoint callback, and fit_from.

:func:`fit_from` is the ``fit`` that starts mid-epoch; the checkpoints on disk are
:mod:`daskfeed.checkpoint`'s (no keras there), early stopping is
:mod:`daskfeed.training._early_stopping`.

How the cursor is counted. Keras' ``batch`` argument of ``on_train_batch_end`` is not a
batch count one can rely on: with ``steps_per_execution=N`` a callback comes once per group of
``N`` batches and its ``batch`` is the group's last batch in some Keras 3 releases and its first
in others. The cursor is therefore counted from the optimizer's step counter: the next
batch is the epoch's start batch plus the steps the optimizer took since the epoch began. The
counter is the raw one, which counts every batch also with ``gradient_accumulation_steps``
(Keras 3.5+ keeps it in ``optimizer._iterations``; its public ``iterations`` is then the number
of *applied* updates, ``batches // gradient_accumulation_steps``). The count is checked against
what the group just run can have trained (batches ``begin + 1 .. begin + N``, ``begin`` being
the group's first batch, which ``on_train_batch_begin`` receives in every Keras 3 release).
The counter is read only where a cursor is needed: when the group just run may have crossed a
checkpoint (Keras' count crossed a multiple of ``every``), and when an epoch is cut short: a
read waits for the device, so it is not made per batch.
Where the optimizer does not take exactly one step per batch -- a model without an optimizer,
a ``LossScaleOptimizer`` (mixed precision: it skips the steps whose gradients overflow), a
``train_step`` that applies it twice or never -- the cursor is the end of that group instead
(``begin + N``, or the end of the epoch), with a warning when the count was out of range.

An epoch cut short by ``model.stop_training`` (set by a callback after a batch) ends with a
checkpoint at its true next batch, not with an epoch-end checkpoint, and :func:`fit_from`
then stops, as ``fit`` does.

Early stopping survives a resume: the :class:`Checkpointer` writes the state of
:class:`~daskfeed.training._early_stopping.EarlyStopping` (epochs waited, best value and epoch, whether
it stopped, the best weights) into every checkpoint (``state.json`` and ``best.weights.npz``),
and it carries on across the two ``fit`` calls of :func:`fit_from`; restored, a resumed run
stops at the epoch the uninterrupted run would have stopped at, with the same best weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daskfeed.adapters import chosen_handoff, fit_inputs, keras
from daskfeed.checkpoint import CheckpointStore, json_value, optimizer_steps
from daskfeed.core import handoff_name, warn_user
from daskfeed.training._early_stopping import EarlyStopping
from daskfeed.training._telemetry import EpochTelemetry

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence


def _counts_batches(model: keras.Model) -> bool:
    """Whether ``model``'s optimizer takes one step per trained batch (so it can count them).

    Not without an optimizer, nor with a ``LossScaleOptimizer``: it skips the inner
    optimizer's step when the gradients overflow.
    """
    opt = getattr(model, "optimizer", None)
    return opt is not None and not hasattr(opt, "inner_optimizer")


class Checkpointer(keras.callbacks.Callback):
    """Keras callback: a checkpoint every ``every`` batches and at the end of every epoch.

    A mid-epoch checkpoint is written when the next batch to train crosses a multiple of
    ``every`` (counted from the epoch's batch 0, also in a resumed epoch); its cursor is that
    true next batch, counted from the optimizer's steps (see the module docstring), so it is
    exact whatever ``every`` and the model's ``steps_per_execution`` are (with
    ``steps_per_execution=4`` callbacks, hence checkpoints, come every 4 batches at most).
    ``every=0`` writes only the epoch-end ones. The epoch-end checkpoint is written after
    validation, with the cursor at ``(epoch + 1, 0)`` and the epoch's record (Keras logs +
    ``telemetry``'s) in the history; an epoch cut short by ``model.stop_training`` gets a
    checkpoint at its true next batch instead, and no record.

    Parameters
    ----------
    store
        Where to write.
    sequence
        The training :class:`~daskfeed.DaskSequence` (its ``start`` gives the offset of a
        resumed epoch).
    every
        Batches between mid-epoch checkpoints; 0: at epoch ends only.
    history
        Records of the epochs completed before this run (from the resumed checkpoint).
    telemetry
        The per-epoch telemetry callback ``train`` adds to ``fit`` (rows, rates, the wait for
        data, peak memory: see ``docs/watching.md``), placed before this callback; its records
        are merged into the history.
    early_stopping
        An :class:`EarlyStopping` placed before this callback: its state (and best weights)
        is saved with every checkpoint, so a resumed run keeps its patience.
    mark
        Told ``(epoch, position)`` — the batches of the epoch's order trained, by every trainer
        together — as each group of steps ends (``train`` keeps it in ``OUTPUT/trained.bin``:
        what a resume's certificate counts the rows trained twice from).

    Attributes
    ----------
    saved
        Paths of the checkpoints written, in order.
    cursors
        ``(epoch, batch)`` of each of them.
    """

    def __init__(self, store: CheckpointStore, sequence: DaskSequence, *, every: int = 0,
                 history: list[dict[str, Any]] | None = None,
                 telemetry: EpochTelemetry | None = None,
                 early_stopping: EarlyStopping | None = None,
                 mark: Callable[[int, int], None] | None = None) -> None:
        super().__init__()
        self.mark = mark  # told (epoch, position) as each group of steps ends (the resume certificate)
        self.store = store
        self.sequence = sequence
        self.every = max(0, int(every))
        self.history: list[dict[str, Any]] = list(history or [])
        self.telemetry = telemetry
        self.early_stopping = early_stopping
        self.saved: list[str] = []
        self.cursors: list[tuple[int, int]] = []
        self._epoch = 0
        self._start = 0  # the batch this epoch started at (> 0 in a resumed epoch)
        self._begin = 0  # first batch (within this fit's epoch) of the group being trained
        self._next = 0  # the next batch to train (within the whole epoch)
        self._base: int | None = None  # optimizer steps at epoch begin; None: not counted
        self._ran = False  # a group was trained this epoch (``_begin`` is this epoch's)
        self._warned = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the epoch, the batch it starts at, and the optimizer's step count.

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        self._epoch = int(epoch)
        self._start = self._next = int(self.sequence.start)
        self._ran = False
        self._base = optimizer_steps(self.model) if _counts_batches(self.model) else None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the group's first batch (what every Keras 3 passes here).

        Parameters
        ----------
        batch
            The batch within the epoch (as Keras numbers it).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        self._begin = int(batch)
        self._ran = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Checkpoint when the next batch to train crosses a multiple of ``every``.

        ``batch`` itself is not used: its meaning depends on the Keras version. The optimizer's
        count is read only when the group may have crossed one: Keras' count (the end of the
        group, never below the true next batch) crossed it.

        Parameters
        ----------
        batch
            The batch within the epoch (as Keras numbers it).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        if self.mark is not None:  # how far training went (Keras' count: no read of the device)
            self.mark(self._epoch, self.sequence.position(self._group_end(), self._epoch))
        if not self.every:
            return  # checkpoints at epoch ends only
        end = self._group_end()
        if end >= self._batches() or end // self.every <= self._next // self.every:
            return  # the epoch-end checkpoint follows, or no multiple crossed
        last, self._next = self._next, self._trained_to()
        if self._next // self.every > last // self.every:
            self._save(self._epoch, self._next)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the epoch and checkpoint at the start of the next one (or where it stopped).

        Parameters
        ----------
        epoch
            The epoch (0-based).
        logs
            Keras' logs (losses and metrics so far; may be None).
        """
        stopped = bool(getattr(self.model, "stop_training", False))
        if stopped and self._ran:
            self._next = self._trained_to()
        if self._next < self._batches() and stopped:
            if self.cursors[-1:] != [(self._epoch, self._next)]:
                self._save(self._epoch, self._next)  # stopped mid-epoch: not a complete epoch
            return
        rec = {k: json_value(v) for k, v in (logs or {}).items()}
        if self.telemetry is not None and self.telemetry.epochs:
            rec.update(self.telemetry.epochs[-1])
        rec["epoch"] = int(epoch)
        if self._start:
            rec["resumed_at_batch"] = self._start
        self.history.append(rec)
        self._save(int(epoch) + 1, 0)

    def _batches(self) -> int:
        """Batches of the epoch being trained (the stream may be a window ahead, in the next)."""
        return int(self.sequence.stream.plan_of(self._epoch).num_batches)

    def _group_end(self) -> int:
        """Where the group that just ran ends, by Keras' count: the next batch at the most."""
        group = int(getattr(self.model, "steps_per_execution", 1) or 1)
        return min(self._start + self._begin + group, self._batches())

    def _trained_to(self) -> int:
        """The next batch to train after the group that just ran (see the module docstring)."""
        low = self._start + self._begin + 1
        high = self._group_end()
        steps = optimizer_steps(self.model)
        if self._base is None or steps is None:
            return high
        counted = self._start + steps - self._base
        if low <= counted <= high:
            return counted
        self._warn(counted, low, high)
        return high

    def _warn(self, counted: int, low: int, high: int) -> None:
        if self._warned:
            return
        self._warned = True
        span = f"{low}" if low == high else f"{low} .. {high}"
        warnings.warn(
            f"Checkpoints of epoch {self._epoch + 1}: the optimizer's step count puts the next batch "
            f"at {counted}, but the group of steps Keras just ran puts it at {span}: the optimizer "
            "does not take one step per batch (a custom train_step?). Checkpoint cursors are "
            "counted from Keras' batch numbers instead.", stacklevel=2)

    def _save(self, epoch: int, batch: int) -> None:
        cursor = self.sequence.stream.state(epoch, batch)
        stopper = self.early_stopping
        self.saved.append(self.store.save(
            self.model, cursor, self.history, stopper.get_state() if stopper else None,
            stopper.best_weights if stopper else None))
        self.cursors.append((epoch, batch))


def fit_from(model: keras.Model, sequence: DaskSequence, *, epochs: int, epoch: int = 0, batch: int = 0,
             handoff: str = "auto", **kwargs: Any) -> list[keras.callbacks.History]:
    """``model.fit(sequence, ...)`` from epoch ``epoch``, batch ``batch`` to the end of ``epochs``.

    Keras fixes the steps per epoch when ``fit`` starts, so a resumed epoch (``batch > 0``)
    is fitted on its own, ``sequence`` serving its batches ``batch ..`` (see
    :meth:`~daskfeed.DaskSequence.set_epoch`), and so is each run of epochs whose batches
    skipped (``skip_batches``) give it another count; the remaining epochs follow in one
    ``fit``. Each uses ``initial_epoch``, so epochs keep their numbers in callbacks and logs,
    the progress bar counts them out of ``epochs`` ("Epoch 2/6", not "Epoch 2/2"), and the
    optimizer state carries over. When a callback stops training (``model.stop_training``),
    the epochs after it are not fitted.

    Parameters
    ----------
    model
        The compiled model.
    sequence
        The training sequence.
    epochs
        Epochs of the whole run.
    epoch, batch
        Where to start (a checkpoint's cursor; ``0, 0``: from the start).
    handoff
        How batches reach Keras, the hand-off: ``tf-data``, a ``tf.data`` pipeline fed a chunk
        of batches per Python call (as :meth:`~daskfeed.DaskSequence.to_tf_dataset`'s, TensorFlow
        backend only); ``dataloader``, a torch ``DataLoader`` of its batches read a run at a
        time (PyTorch backend only); ``pydataset``, the sequence itself (a ``PyDataset``, one
        call per batch); ``auto`` (default), ``tf-data`` on TensorFlow, ``dataloader`` on
        PyTorch and ``pydataset`` on JAX. The batches are the same; callbacks with a
        ``set_handoff`` method are told which it is (the wait for data is not measured the same
        way, see ``docs/watching.md``).
    **kwargs
        ``fit``'s other arguments (``callbacks``, ``validation_data``, ``verbose``, ...); the
        hand-off's old keyword ``feed=`` (``windows``, ``batches``) is still taken, with a
        warning.

    Returns
    -------
    list
        The ``History`` of each ``fit``.
    """
    if "feed" in kwargs:  # the hand-off's old keyword
        old = kwargs.pop("feed")
        handoff = handoff_name(str(old), what="feed")
        if handoff == old:
            warn_user("fit_from(feed=) is the old name of fit_from(handoff=); it works, but will "
                      "go.", FutureWarning)
    handoff = chosen_handoff(handoff, kwargs.get("class_weight"))  # once (an old name warns once)
    fits = []
    group = int(getattr(model, "steps_per_execution", 1) or 1)
    sequence.set_last_epoch(epochs - 1)  # nothing fetched ahead for an epoch that never comes
    runs = sequence.stream.epoch_runs(epoch + 1 if batch else epoch, epochs)
    if batch and epoch < epochs:
        runs.insert(0, (epoch, epoch + 1))  # the resumed epoch, from its batch
    carried = [cb for cb in kwargs.get("callbacks") or () if isinstance(cb, EarlyStopping)]
    # a bar that counts to ``epochs`` ("Epoch 2/6", not "Epoch 2/2") for each fit
    callbacks = list(kwargs.get("callbacks") or ())
    if not any(isinstance(cb, keras.callbacks.ProgbarLogger) for cb in callbacks):
        callbacks.append(_ProgbarTo(epochs))
    for first, end in runs:
        sequence.set_epoch(first, batch if first == epoch else 0)
        for cb in carried:  # one run in several fits: no restore of best weights in between
            cb.continuing = end < epochs
        try:
            with fit_inputs(sequence, handoff, {**kwargs, "callbacks": callbacks}, group) as (x, args):
                _tell_handoff(args, handoff)
                fits.append(model.fit(x, initial_epoch=first, epochs=end, **args))
        finally:
            for cb in carried:
                cb.continuing = False
        if getattr(model, "stop_training", False):
            return fits
    return fits


def _tell_handoff(args: dict[str, Any], handoff: str) -> None:
    """Tell the callbacks that measure the wait for data how batches reach Keras.

    Those with a ``set_handoff`` method (:class:`EpochTelemetry`,
    :class:`~daskfeed.training._watch.WatchCallback`) get ``handoff``: ``pydataset`` (the
    sequence itself), ``dataloader`` (a torch ``DataLoader`` of its batches) or ``tf-data`` (the
    tf.data hand-off's pipeline); a user's callback written for the old name, ``set_feed``,
    still gets ``windows`` for tf-data, else ``batches`` (batches read in the trainer's thread).
    """
    for cb in args.get("callbacks") or ():
        set_handoff = getattr(cb, "set_handoff", None)
        if callable(set_handoff):
            set_handoff(handoff)
            continue
        set_feed = getattr(cb, "set_feed", None)
        if callable(set_feed):
            set_feed("windows" if handoff == "tf-data" else "batches")


class _ProgbarTo(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, numbering epochs out of ``epochs`` whatever the ``fit`` was given."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self._total = int(epochs)

    def set_params(self, params: dict[str, Any]) -> None:
        """Keras' params, with the run's epoch count.

        Parameters
        ----------
        params
            Keras' params of the ``fit`` (``epochs``, ``steps``, ``verbose``).
        """
        super().set_params({**params, "epochs": self._total})
