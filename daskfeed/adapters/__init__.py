"""Adapters: a BatchStream's batches handed to Keras (a PyDataset, a tf.data pipeline) or PyTorch.

``DaskSequence`` is the ``PyDataset``; the tf.data hand-off (``DaskSequence.to_tf_dataset``, and
``fit_inputs`` for ``fit``) hands a window's batches to a tf.data pipeline, the dataloader
hand-off (``fit_inputs`` on PyTorch) runs of batches to a torch ``DataLoader``; ``TorchDataset`` is a
``torch.utils.data.IterableDataset`` for a plain PyTorch loop (no keras); all stand on a
:class:`~daskfeed.batches.BatchStream`.

Keras is first imported here (``keras``, by the backend the core chose); torch by ``TorchDataset``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.adapters._handoff import chosen_handoff, fit_inputs
    from daskfeed.adapters._keras import keras
    from daskfeed.adapters._sequence import DaskSequence
    from daskfeed.adapters._torch import TorchDataset, set_torch_threads

__all__ = ["DaskSequence", "TorchDataset", "chosen_handoff", "fit_inputs", "keras",
           "set_torch_threads"]

__getattr__, __dir__ = attach(__name__, {
    "keras": "_keras",
    "DaskSequence": "_sequence",
    "fit_inputs": "_handoff",
    "chosen_handoff": "_handoff",
    "TorchDataset": "_torch", "set_torch_threads": "_torch",
})
