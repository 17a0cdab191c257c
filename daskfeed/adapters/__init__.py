"""Adapters: a BatchStream's batches handed to Keras, as a PyDataset or a tf.data pipeline.

``DaskSequence`` is the ``PyDataset``; the window feed the tf.data pipeline; both stand on a
:class:`~daskfeed.batches.BatchStream`.

Keras is first imported here (``keras``, by the backend the core chose).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.adapters._handoff import fit_inputs
    from daskfeed.adapters._keras import keras
    from daskfeed.adapters._sequence import DaskSequence

__all__ = ["DaskSequence", "fit_inputs", "keras"]

__getattr__, __dir__ = attach(__name__, {
    "keras": "_keras",
    "DaskSequence": "_sequence",
    "fit_inputs": "_handoff",
})
