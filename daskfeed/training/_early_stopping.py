"""Early stopping that survives a resume: Keras' callback with its state in every checkpoint.

:class:`EarlyStopping` carries on across the two ``fit`` calls of
:func:`daskfeed.training._callbacks.fit_from` and from a checkpoint's saved state; the functions make it
from a run's settings, resume it from a checkpoint, and report where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daskfeed.adapters import keras
from daskfeed.checkpoint import Checkpoint, StoppingState
from daskfeed.core import CheckpointError, SettingError

if TYPE_CHECKING:
    import numpy as np


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
        self.best: float | None = None

    def get_state(self) -> StoppingState:
        """What the next fit needs to go on as if never interrupted (JSON-ready).

        Returns
        -------
        StoppingState
            The monitor, patience, epochs waited, best value and epoch, and whether the best
            weights are kept.
        """
        return {"monitor": self.monitor, "patience": int(self.patience), "wait": int(self.wait),
                "stopped_epoch": int(self.stopped_epoch), "best_epoch": int(self.best_epoch),
                "best": None if self.best is None else float(self.best),
                "best_weights": self.best_weights is not None}

    def set_state(self, state: StoppingState, best_weights: list[np.ndarray] | None = None) -> None:
        """Continue from ``state`` (:meth:`get_state` of the interrupted run) at the next fit.

        Parameters
        ----------
        state
            The interrupted run's state (from its checkpoint).
        best_weights
            The best epoch's weights saved with it (None: none saved).

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
        """Whether this run stopped early.

        Returns
        -------
        bool
            True once early stopping stopped the run.
        """
        return self.stopped_epoch > 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Start afresh (or from :meth:`set_state`) when a run starts; go on within one.

        Parameters
        ----------
        logs
            Keras' logs (unused).
        """
        if self._running:
            return
        if not self._loaded:
            super().on_train_begin(logs)
        self._loaded = False
        self._running = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Restore the best weights when the run ends (not between :func:`fit_from`'s fits).

        Parameters
        ----------
        logs
            Keras' logs (passed on to Keras' ``EarlyStopping``).
        """
        if self.continuing and not getattr(self.model, "stop_training", False):
            return
        self._running = False
        super().on_train_end(logs)


def make_early_stopping(patience: int | None, monitor: str | None, net: keras.Model,
                        echo: Callable[[str], None]) -> EarlyStopping | None:
    """The :class:`EarlyStopping` of a run (None: ``patience`` None), its monitor checked.

    Parameters
    ----------
    patience, monitor
        Epochs without improvement, and the quantity watched (as resolved by
        :class:`~daskfeed.training._options.FitOptions`).
    net
        The compiled model: ``monitor`` must be a quantity it logs.
    echo
        Where the setting is said.

    Returns
    -------
    EarlyStopping or None
        The callback; None without ``patience``.

    Raises
    ------
    SettingError
        When the model does not log ``monitor``.
    """
    if patience is None or monitor is None:
        return None
    names = _logged_names(net)
    if names is not None and monitor.removeprefix("val_") not in names:
        shown = ", ".join(sorted(names | {f"val_{n}" for n in names}))
        raise SettingError(f"Expected a quantity the model logs to monitor: {shown}. Received: "
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
