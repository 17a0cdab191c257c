"""What one ``model.fit`` is handed: the sequence, or its batches as tf.data or a DataLoader.

Above the hand-offs (:mod:`daskfeed.adapters._sequence`, :mod:`daskfeed.adapters._tf_data`,
:mod:`daskfeed.adapters._torch`), which do not import each other's users.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from daskfeed.adapters._keras import keras
from daskfeed.adapters._sequence import DaskSequence
from daskfeed.adapters._tf_data import TFDataHandoff, uses_tf_data
from daskfeed.core import SettingError, handoff_name


def chosen_handoff(handoff: str, class_weight: Any = None) -> str:
    """The hand-off ``handoff`` is on this backend: ``tf-data``, ``dataloader`` or ``pydataset``.

    ``auto`` is ``tf-data`` on TensorFlow, ``dataloader`` on PyTorch (``pydataset`` with a
    ``class_weight``, which Keras refuses with a ``DataLoader``) and ``pydataset`` on JAX.

    Parameters
    ----------
    handoff
        ``auto``, ``tf-data``, ``dataloader`` or ``pydataset`` (an old name with a warning).
    class_weight
        ``fit``'s ``class_weight``, if any.

    Returns
    -------
    str

    Raises
    ------
    SettingError
        Another name, a hand-off of another backend (``tf-data`` off TensorFlow,
        ``dataloader`` off PyTorch), or ``dataloader`` with a ``class_weight``.
    """
    handoff = handoff_name(handoff)
    if uses_tf_data(handoff):
        return "tf-data"
    backend = keras.backend.backend()
    if handoff == "dataloader" and backend != "torch":
        raise SettingError(f"Expected the PyTorch backend with the dataloader hand-off (a torch "
                           f"DataLoader). Received: KERAS_BACKEND={backend!r}.\nHint: --handoff "
                           "auto (or pydataset).")
    if handoff == "dataloader" and class_weight is not None:
        raise SettingError("Expected no class_weight with the dataloader hand-off (Keras takes "
                           "none with a torch DataLoader). Received: class_weight="
                           f"{class_weight!r}.\nHint: --handoff auto (or pydataset), or a weight "
                           "column (--weight).")
    if handoff == "dataloader" or (handoff == "auto" and backend == "torch" and class_weight is None):
        return "dataloader"
    return "pydataset"


@contextlib.contextmanager
def fit_inputs(sequence: DaskSequence, handoff: str, kwargs: dict[str, Any],
               steps_per_execution: int = 1) -> Iterator[tuple[Any, dict[str, Any]]]:
    """What one ``model.fit`` over ``sequence`` is handed: the data and its other arguments.

    With the dataloader hand-off (``dataloader``, or ``auto`` on the PyTorch backend): a torch
    ``DataLoader`` of the sequence's batches read a run at a time (as ``TorchDataset`` reads
    them), ``len(sequence)`` of them per epoch, a ``DaskSequence`` given as ``validation_data``
    as one too, a callback first in ``callbacks`` that serves again the batch Keras reads to
    build the model, and ``shuffle=False``.

    With the tf.data hand-off (``tf-data``, or ``auto`` on the TensorFlow backend): ``sequence`` as
    a ``tf.data`` dataset fed many batches per Python call (a stream with
    ``steps_per_epoch=len(sequence)`` where it can be), the callback that keeps Keras' epochs and
    the sequence's in step first in ``callbacks``, a ``DaskSequence`` given as ``validation_data``
    as a dataset too, and
    ``shuffle=False`` (daskfeed shuffles; Keras would warn that ``fit`` does not shuffle a
    dataset); the feeds are closed on leaving. Otherwise the sequence itself and ``kwargs`` as
    they are.

    Parameters
    ----------
    sequence
        The training sequence, where its next ``fit`` starts (epoch and batch).
    handoff
        ``auto``, ``tf-data``, ``dataloader`` or ``pydataset``.
    kwargs
        ``fit``'s other arguments.
    steps_per_execution
        The model's: a stream needs it to divide the epoch's batches.

    Yields
    ------
    tuple
        ``(x, kwargs)`` for ``model.fit(x, **kwargs)``.
    """
    chosen = chosen_handoff(handoff, kwargs.get("class_weight"))
    if chosen == "dataloader":
        from daskfeed.adapters._torch import dataloader

        loader = dataloader(sequence.stream)
        out = {**kwargs, "shuffle": False}
        out["callbacks"] = [_UndoPeek(loader.dataset), *(kwargs.get("callbacks") or ())]
        if isinstance(kwargs.get("validation_data"), DaskSequence):
            out["validation_data"] = dataloader(kwargs["validation_data"].stream)
        yield loader, out
        return
    if chosen == "pydataset":
        yield sequence, kwargs
        return
    feeds = [TFDataHandoff(sequence.stream)]
    out = {**kwargs, "shuffle": False}
    out["callbacks"] = [feeds[0].callback(), *(kwargs.get("callbacks") or ())]
    # one iterator for the whole fit: a stream, unless the epoch is a resumed one (fitted alone),
    # steps are the caller's, or a group of steps would cross an epoch's end
    stream = (not sequence.start and "steps_per_epoch" not in kwargs
              and len(sequence) % max(int(steps_per_execution), 1) == 0)
    if stream:
        out["steps_per_epoch"] = len(sequence)
    if isinstance(kwargs.get("validation_data"), DaskSequence):
        feeds.append(TFDataHandoff(kwargs["validation_data"].stream))
        out["validation_data"] = feeds[1].dataset()
    try:
        yield feeds[0].dataset(stream=stream), out
    finally:
        for f in feeds:
            f.close()


class _UndoPeek(keras.callbacks.Callback):
    """At ``on_train_begin``: serve again what Keras read to build the model before training."""

    def __init__(self, loader: Any) -> None:
        super().__init__()
        self.loader = loader

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """``fit`` begins training: the batch its model build read is served again.

        Parameters
        ----------
        logs
            Keras' logs (unused).
        """
        self.loader.undo_passes()
