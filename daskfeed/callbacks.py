"""The Keras side of a run: checkpoint, early-stopping and telemetry callbacks, and fit_from.

:func:`fit_from` is the ``fit`` that starts mid-epoch; the checkpoints on disk are
:mod:`daskfeed.checkpoint`'s (no keras there).

How the cursor is counted. Keras' ``batch`` argument of ``on_train_batch_end`` is not a
batch count one can rely on: with ``steps_per_execution=N`` a callback comes once per group of
``N`` batches and its ``batch`` is the group's *last* batch in Keras 3.15 but its *first* in
Keras 3.10 and 3.3. The cursor is therefore counted from the optimizer's step counter: the next
batch is the epoch's start batch plus the steps the optimizer took since the epoch began. The
counter is the raw one, which counts every batch also with ``gradient_accumulation_steps``
(Keras 3.5+ keeps it in ``optimizer._iterations``; its public ``iterations`` is then the number
of *applied* updates, ``batches // gradient_accumulation_steps``). The count is checked against
what the group just run can have trained (batches ``begin + 1 .. begin + N``, ``begin`` being
the group's first batch, which ``on_train_batch_begin`` receives in every Keras 3 release).
Where the optimizer does not take exactly one step per batch -- a model without an optimizer,
a ``LossScaleOptimizer`` (mixed precision: it skips the steps whose gradients overflow), a
``train_step`` that applies it twice or never -- the cursor is the end of that group instead
(``begin + N``, or the end of the epoch), with a warning when the count was out of range.

An epoch cut short by ``model.stop_training`` (set by a callback after a batch) ends with a
checkpoint at its true next batch, not with an epoch-end checkpoint, and :func:`fit_from`
then stops, as ``fit`` does.

Early stopping survives a resume. :class:`EarlyStopping` is Keras' callback whose state --
epochs waited, best value and epoch, whether it stopped, and the best weights -- the
:class:`Checkpointer` writes into every checkpoint (``state.json`` and
``best.weights.npz``), and that carries on across the two ``fit`` calls of :func:`fit_from`;
restored, a resumed run stops at the epoch the uninterrupted run would have stopped at and
restores the same best weights.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daskfeed._keras import keras
from daskfeed.checkpoint import Checkpoint, CheckpointStore, Cursor, json_value, optimizer_steps
from daskfeed.exceptions import CheckpointError, SchemaError
from daskfeed.rss import RSSSampler

if TYPE_CHECKING:
    from daskfeed.sequence import DaskSequence

__all__ = ["Checkpointer", "EarlyStopping", "EpochTelemetry", "fit_from", "make_early_stopping",
           "report_early_stopping", "resume_early_stopping"]


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
        An :class:`EpochTelemetry` placed before this callback; its records
        are merged into the history.
    early_stopping
        An :class:`EarlyStopping` placed before this callback: its state (and best weights)
        is saved with every checkpoint, so a resumed run keeps its patience.

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
                 early_stopping: EarlyStopping | None = None) -> None:
        super().__init__()
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
        self._warned = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the epoch, the batch it starts at, and the optimizer's step count."""
        self._epoch = int(epoch)
        self._start = self._next = int(self.sequence.start)
        self._base = optimizer_steps(self.model) if _counts_batches(self.model) else None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Note the group's first batch (what every Keras 3 passes here)."""
        self._begin = int(batch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Count the batches trained; checkpoint when the next one crosses a multiple of ``every``.

        ``batch`` itself is not used: its meaning depends on the Keras version.
        """
        last, self._next = self._next, self._trained_to()
        if not self.every or self._next >= self.sequence.plan.num_batches:
            return  # the epoch-end checkpoint follows
        if self._next // self.every > last // self.every:
            self._save(self._epoch, self._next)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the epoch and checkpoint at the start of the next one (or where it stopped)."""
        if self._next < self.sequence.plan.num_batches and getattr(self.model, "stop_training", False):
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

    def _trained_to(self) -> int:
        """The next batch to train after the group that just ran (see the module docstring)."""
        group = int(getattr(self.model, "steps_per_execution", 1) or 1)
        low = self._start + self._begin + 1
        high = min(self._start + self._begin + group, self.sequence.plan.num_batches)
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
            f"Checkpoints of epoch {self._epoch}: the optimizer's step count puts the next batch "
            f"at {counted}, but the group of steps Keras just ran puts it at {span}: the optimizer "
            "does not take one step per batch (a custom train_step?). Checkpoint cursors are "
            "counted from Keras' batch numbers instead.", stacklevel=2)

    def _save(self, epoch: int, batch: int) -> None:
        cursor = Cursor.of(self.sequence, epoch, batch)
        stopper = self.early_stopping
        self.saved.append(self.store.save(
            self.model, cursor, self.history, stopper.get_state() if stopper else None,
            stopper.best_weights if stopper else None))
        self.cursors.append((epoch, batch))


def fit_from(model: keras.Model, sequence: DaskSequence, *, epochs: int, epoch: int = 0, batch: int = 0,
             **kwargs: Any) -> list[Any]:
    """``model.fit(sequence, ...)`` from epoch ``epoch``, batch ``batch`` to the end of ``epochs``.

    Keras fixes the steps per epoch when ``fit`` starts, so a resumed epoch (``batch > 0``)
    is fitted on its own, ``sequence`` serving its batches ``batch ..`` (see
    :meth:`~daskfeed.DaskSequence.set_epoch`), its progress bar numbered out of ``epochs``
    ("Epoch 2/6", not "Epoch 2/2"); the remaining epochs follow in a second ``fit``. Both use
    ``initial_epoch``, so epochs keep their numbers in callbacks and logs, and the optimizer
    state carries over. When a callback stops training
    (``model.stop_training``) during the resumed epoch, the remaining epochs are not fitted.
    Returns the ``History`` of each ``fit``.
    """
    fits = []
    if batch and epoch < epochs:
        sequence.set_epoch(epoch, batch)
        carried = [cb for cb in kwargs.get("callbacks") or () if isinstance(cb, EarlyStopping)]
        for cb in carried:  # one run in two fits: no restore of best weights in between
            cb.continuing = epoch + 1 < epochs
        # a bar that counts to ``epochs`` ("Epoch 2/6", not "Epoch 2/2") for this one-epoch fit
        callbacks = list(kwargs.get("callbacks") or ())
        if not any(isinstance(cb, keras.callbacks.ProgbarLogger) for cb in callbacks):
            callbacks.append(_ProgbarTo(epochs))
        try:
            fits.append(model.fit(sequence, initial_epoch=epoch, epochs=epoch + 1,
                                  **{**kwargs, "callbacks": callbacks}))
        finally:
            for cb in carried:
                cb.continuing = False
        epoch += 1
        if getattr(model, "stop_training", False):
            return fits
    if epoch < epochs:
        sequence.set_epoch(epoch)
        fits.append(model.fit(sequence, initial_epoch=epoch, epochs=epochs, **kwargs))
    return fits


class _ProgbarTo(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, numbering epochs out of ``epochs`` whatever the ``fit`` was given."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self._total = int(epochs)

    def set_params(self, params: dict[str, Any]) -> None:
        """Keras' params, with the run's epoch count."""
        super().set_params({**params, "epochs": self._total})


class EarlyStopping(keras.callbacks.EarlyStopping):
    """Keras' ``EarlyStopping`` whose state survives a resume and :func:`fit_from`'s two fits.

    Keras' callback starts afresh in every ``fit`` (``on_train_begin``) and restores the
    best weights at the end of every ``fit``. Here the state is reset only when a run
    starts: :meth:`set_state` (from a checkpoint, :attr:`Checkpoint.early_stopping` and
    :meth:`Checkpoint.best_weights`) makes the next ``fit`` continue where the interrupted
    run was, and ``continuing`` (set by :func:`fit_from` for its first, partial-epoch fit)
    defers the restore of the best weights to the end of the run. Everything else is Keras'
    (``monitor``, ``patience``, ``mode``, ``min_delta``, ``restore_best_weights``...).

    Attributes
    ----------
    continuing
        True while a ``fit`` is only the first part of the run.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.continuing = False
        self._running = False
        self._loaded = False
        self.best_epoch = 0
        self.best: Any = None

    def get_state(self) -> dict[str, Any]:
        """What the next fit needs to go on as if never interrupted (JSON-ready)."""
        return {"monitor": self.monitor, "patience": int(self.patience), "wait": int(self.wait),
                "stopped_epoch": int(self.stopped_epoch), "best_epoch": int(self.best_epoch),
                "best": None if self.best is None else float(self.best),
                "best_weights": self.best_weights is not None}

    def set_state(self, state: dict[str, Any], best_weights: list[Any] | None = None) -> None:
        """Continue from ``state`` (:meth:`get_state` of the interrupted run) at the next fit.

        Raises
        ------
        CheckpointError
            When the checkpoint's early stopping watched another quantity.
        """
        if state.get("monitor") != self.monitor:
            raise CheckpointError(
                f"The checkpoint's early stopping monitored {state.get('monitor')!r}. Received: "
                f"monitor={self.monitor!r}.\nHint: resume with --monitor "
                f"{state.get('monitor')}, or train from scratch without --resume."
            )
        self.wait, self.stopped_epoch = int(state["wait"]), int(state["stopped_epoch"])
        self.best_epoch, self.best = int(state["best_epoch"]), state["best"]
        self.best_weights = best_weights
        self._loaded = True
        self._running = False

    @property
    def stopped(self) -> bool:
        """Whether this run stopped early."""
        return self.stopped_epoch > 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Start afresh (or from :meth:`set_state`) when a run starts; go on within one."""
        if self._running:
            return
        if not self._loaded:
            super().on_train_begin(logs)
        self._loaded = False
        self._running = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Restore the best weights when the run ends (not between :func:`fit_from`'s fits)."""
        if self.continuing and not getattr(self.model, "stop_training", False):
            return
        self._running = False
        super().on_train_end(logs)


class EpochTelemetry(keras.callbacks.Callback):
    """Per epoch: rows, training seconds, rows/s, data-wait fraction, peak RSS of the tree.

    ``seconds`` is the training part of the epoch (validation is ``val_seconds``);
    ``data_wait_fraction`` is the time ``__getitem__`` waited for windows over ``seconds``.
    """

    def __init__(self, sequence: DaskSequence, rss_sampler: RSSSampler | None = None) -> None:
        super().__init__()
        self.sequence = sequence
        self.rss = rss_sampler
        self.epochs: list[dict[str, Any]] = []
        self._t0 = self._t_train = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Start the epoch clock and a new RSS peak."""
        self._t0 = time.perf_counter()
        self._t_train = 0.0
        if self.rss is not None:
            self.rss.reset_peak()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Validation starts: the training part of the epoch ends here."""
        if self._t0 and not self._t_train:
            self._t_train = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the epoch's telemetry."""
        end = time.perf_counter()
        train_end = self._t_train or end
        seconds = max(train_end - self._t0, 1e-9)
        stats = self.sequence.last_epoch_stats
        rec = {
            "epoch": epoch,
            "rows": stats.get("rows", 0),
            "batches": stats.get("batches", 0),
            "seconds": round(seconds, 4),
            "val_seconds": round(end - train_end, 4),
            "rows_per_s": round(stats.get("rows", 0) / seconds, 1),
            "data_wait_seconds": round(stats.get("wait_seconds", 0.0), 4),
            "data_wait_fraction": round(min(1.0, stats.get("wait_seconds", 0.0) / seconds), 4),
            "windows_computed": stats.get("windows_computed", 0),
        }
        if self.rss is not None:
            rec["peak_rss_bytes"] = int(self.rss.peak)
        self.epochs.append(rec)


def make_early_stopping(patience: int | None, monitor: str | None, net: keras.Model,
                        echo: Callable[[str], None]) -> EarlyStopping | None:
    """The :class:`EarlyStopping` of a run (None: ``patience`` None), its monitor checked.

    Parameters
    ----------
    patience, monitor
        Epochs without improvement, and the quantity watched (as resolved by
        :class:`~daskfeed.options.FitOptions`).
    net
        The compiled model: ``monitor`` must be a quantity it logs.
    echo
        Where the setting is said.

    Raises
    ------
    SchemaError
        When the model does not log ``monitor``.
    """
    if patience is None or monitor is None:
        return None
    names = _logged_names(net)
    if names is not None and monitor.removeprefix("val_") not in names:
        shown = ", ".join(sorted(names | {f"val_{n}" for n in names}))
        raise SchemaError(f"Expected a quantity the model logs to monitor: {shown}. Received: "
                          f"monitor={monitor!r}.\nHint: pick one of those (--monitor).")
    echo(f"early stopping: {monitor}, patience {patience} epoch{'s' if patience != 1 else ''}; "
         "the best epoch's weights are restored at the end")
    return EarlyStopping(monitor=monitor, patience=patience, restore_best_weights=True)


def _logged_names(net: keras.Model) -> set[str] | None:
    """Names ``fit`` logs for ``net`` (without ``val_``); None when they cannot be told."""
    cfg = net.get_compile_config() or {}
    names = {"loss"}
    for key, prefix in (("metrics", ""), ("weighted_metrics", "weighted_")):
        given = cfg.get(key) or []
        if not isinstance(given, (list, tuple)):
            return None
        for m in given:
            if not isinstance(m, str):  # a metric object: its logged name is its own business
                return None
            names.add(prefix + m)
    return names


def resume_early_stopping(stopper: EarlyStopping | None, ckpt: Checkpoint, net: keras.Model,
                          echo: Callable[[str], None]) -> bool:
    """Carry the checkpoint's early-stopping state on.

    Parameters
    ----------
    stopper
        This run's early stopping, or None.
    ckpt
        The checkpoint resumed from.
    net
        The model: given the best weights when that run had stopped early.
    echo
        Where the state carried on is said.

    Returns
    -------
    bool
        True when the checkpoint's run had stopped early (nothing left to train).
    """
    state = ckpt.early_stopping
    if stopper is None or state is None:
        if state is not None:
            echo("the checkpoint's early stopping is not continued (no --early-stopping)")
        elif stopper is not None:
            echo("early stopping starts now (the checkpoint's run had none)")
        return False
    stopper.set_state(state, ckpt.best_weights())
    echo(f"early stopping resumed: {state['wait']} epoch(s) without improvement of "
         f"{state['monitor']} so far, best {state['best']} at epoch {state['best_epoch'] + 1}")
    if not state["stopped_epoch"]:
        return False
    best = ckpt.best_weights()
    if best is not None:
        net.set_weights(best)
    echo(f"the run stopped early after epoch {state['stopped_epoch'] + 1}: nothing left to train; "
         f"the weights of epoch {state['best_epoch'] + 1} are restored")
    return True


def report_early_stopping(stopper: EarlyStopping | None, epochs: int,
                          echo: Callable[[str], None]) -> dict[str, Any] | None:
    """Say whether and where early stopping stopped, and which weights the model has.

    Parameters
    ----------
    stopper
        The run's early stopping, or None.
    epochs
        Epochs the run was asked for.
    echo
        Where it is said.

    Returns
    -------
    dict or None
        What ``history.json`` records of it (None: no early stopping).
    """
    if stopper is None:
        return None
    state = stopper.get_state()
    best = state["best"]
    restored = state["best_weights"]
    if stopper.stopped:
        echo(f"early stopping: {state['monitor']} did not improve for {state['patience']} "
             f"epoch(s); stopped after epoch {state['stopped_epoch'] + 1} of {epochs}")
    else:
        echo(f"early stopping: did not stop ({epochs} epochs trained)")
    if restored and best is not None:
        echo(f"restored the weights of epoch {state['best_epoch'] + 1}, the best "
             f"({state['monitor']} {best:.4f})")
    return {**{k: v for k, v in state.items() if k != "best_weights"},
            "stopped": stopper.stopped, "restored_best_weights": bool(restored)}
