"""Adapters: the batches handed to Keras, as a ``PyDataset`` or a tf.data pipeline.

Keras is first imported here (``keras``, by the backend the core chose).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.adapters._keras import keras
    from daskfeed.adapters._sequence import DaskSequence
    from daskfeed.adapters._tf_data import fit_inputs

__all__ = ["DaskSequence", "fit_inputs", "keras"]

__getattr__, __dir__ = attach(__name__, {
    "keras": "_keras",
    "DaskSequence": "_sequence",
    "fit_inputs": "_tf_data",
})
