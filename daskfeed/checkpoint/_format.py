"""Checkpoints for exact resume: model + optimizer state + the data cursor, written atomically.

A checkpoint is a directory ``<output>/checkpoints/ckpt-<epoch>-<batch>/`` holding

* ``model.weights.h5`` -- ``model.save_weights``: every layer's weights *and* the optimizer's
  variables (its ``iterations`` counter, Adam's moments, ...), so training continues with the
  same optimizer state;
* ``state.json`` -- the data cursor: the training stream's resume state as it gave it
  (:class:`~daskfeed.batches.StreamState`: epoch, next batch, seed, batch size, manifest
  fingerprint, and what else fixes the batch order), the history of the completed epochs,
  the optimizer's iteration count, and the size and SHA-256 of every file of the checkpoint.

It is written atomically, and read back with a fallback to the previous one, by
:class:`~daskfeed.checkpoint._store.CheckpointStore`; the last :data:`KEEP` are kept.

What "exact" means. The cursor of a checkpoint is the first batch *not yet trained*: batches
before it were trained and are committed in the saved weights. Resuming (``train(resume=True)``,
``daskfeed train --resume``) continues the interrupted epoch at that batch, in the same order
(plans are a pure function of the data, seed, batch size and epoch), so every row of that epoch
is trained exactly once counting committed progress. Batches trained after the last checkpoint
but before the process died were never committed: their effect on the weights is lost with the
process, and they are trained again after the resume (once in the weights that survive).
Checkpoint more often (``checkpoint_every``) to lose less work.

How the cursor is counted, and how early stopping survives a resume: see
:mod:`daskfeed.training._callbacks`. This module needs no keras: it reads and writes what a model and
its callbacks hand it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from daskfeed.batches import StreamState
from daskfeed.core import CheckpointError

if TYPE_CHECKING:
    from keras import Model, Variable

KEEP = 2
"""Checkpoints kept: the newest and the one before it (the fallback)."""

VERSION = 1
WEIGHTS = "model.weights.h5"
BEST = "best.weights.npz"  # EarlyStopping's best weights (model.get_weights(), in order)
STATE = "state.json"

JsonScalar = int | float | str | bool | None


class StoppingState(TypedDict):
    """Early stopping's state, as ``state.json`` keeps it (:meth:`EarlyStopping.get_state`)."""

    monitor: str
    patience: int
    wait: int
    stopped_epoch: int
    best_epoch: int
    best: float | None
    best_weights: bool  # whether best.weights.npz holds the best epoch's weights


@dataclass
class Checkpoint:
    """A checkpoint read back from disk (validated)."""

    path: str
    cursor: StreamState
    history: list[dict[str, Any]] = field(default_factory=list)
    iterations: int | None = None
    """The optimizer's raw step counter (:func:`optimizer_steps`); None: no optimizer."""
    created: float = 0.0
    early_stopping: StoppingState | None = None
    """:meth:`EarlyStopping.get_state` when the run had early stopping."""

    @property
    def weights(self) -> str:
        """Path of the weights file (model and optimizer variables).

        Returns
        -------
        str
            ``<checkpoint>/model.weights.h5``.
        """
        return os.path.join(self.path, WEIGHTS)

    def best_weights(self) -> list[np.ndarray] | None:
        """EarlyStopping's best weights saved with this checkpoint (None: none saved).

        Returns
        -------
        list of numpy.ndarray or None
            The weights in ``model.get_weights()`` order; None when none were saved.
        """
        path = os.path.join(self.path, BEST)
        if not os.path.exists(path):
            return None
        with np.load(path) as z:
            return [z[f"arr_{i}"] for i in range(len(z.files))]

    def restore(self, model: Model) -> None:
        """Load the weights and optimizer state into ``model`` (built and compiled like the saved one).

        Parameters
        ----------
        model
            A built Keras model, compiled with the optimizer the run started with.

        Raises
        ------
        CheckpointError
            When the model does not fit the checkpoint, or the optimizer's iteration count
            read back differs from the saved one.
        """
        if not model.built:
            raise CheckpointError(
                f"Expected a built model to restore the checkpoint {self.path} into. Received: an "
                f"unbuilt {type(model).__name__}.\nHint: build the model in your builder (e.g. "
                "call it on keras.Input tensors) before returning it."
            )
        opt = getattr(model, "optimizer", None)
        if opt is not None and not opt.built:
            opt.build(model.trainable_variables)  # create its variables so they can be loaded
        try:
            model.load_weights(self.weights)
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise CheckpointError(
                f"The checkpoint {self.path} does not fit this model: {first}\nHint: resume with "
                "the same model (--model builder and its settings) the run started with."
            ) from err
        if opt is not None and self.iterations is not None:
            got = optimizer_steps(model)
            if got != self.iterations:
                raise CheckpointError(
                    f"Expected the optimizer to resume at iteration {self.iterations} (checkpoint "
                    f"{self.path}). Received: {got}.\nHint: resume with the same optimizer."
                )


def json_value(v: object) -> JsonScalar:
    """``v`` as JSON takes it: ints, strings, bools and None as they are, numbers as float, else text.

    Parameters
    ----------
    v
        A value of a Keras log or an epoch record (a NumPy or backend scalar, a number, text).

    Returns
    -------
    int, float, str, bool or None
        The value as ``json.dumps`` writes it.
    """
    if isinstance(v, (int, str, bool)) or v is None:
        return v
    try:
        return float(v)  # type: ignore[arg-type]  # any scalar with __float__
    except (TypeError, ValueError):
        return str(v)






def _step_variable(model: Model) -> Variable | None:
    """The optimizer variable that counts train steps, or None when there is no optimizer.

    Keras 3.5+ keeps the raw count in ``_iterations`` and makes ``iterations`` the count of
    applied updates when ``gradient_accumulation_steps`` is set; before 3.5 ``iterations`` is
    the raw count itself. A ``LossScaleOptimizer`` counts in its inner optimizer.
    """
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return None
    opt = getattr(opt, "inner_optimizer", opt)
    raw = getattr(opt, "_iterations", None)
    return raw if raw is not None else opt.iterations


def optimizer_steps(model: Model) -> int | None:
    """The train steps ``model``'s optimizer has taken (every batch, accumulated or applied).

    Parameters
    ----------
    model
        A compiled Keras model.

    Returns
    -------
    int or None
        The raw step counter (also with ``gradient_accumulation_steps``); None when the model
        has no optimizer.
    """
    var = _step_variable(model)
    return None if var is None else int(np.asarray(var))


