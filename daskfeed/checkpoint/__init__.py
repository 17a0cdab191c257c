"""Checkpoints for exact resume: the format and the store (the data cursor is a ``batches.StreamState``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.checkpoint._format import Checkpoint, StoppingState, json_value, optimizer_steps
    from daskfeed.checkpoint._store import CheckpointStore, open_store

__all__ = ["Checkpoint", "CheckpointStore", "StoppingState", "json_value", "open_store",
           "optimizer_steps"]

__getattr__, __dir__ = attach(__name__, {
    "Checkpoint": "_format", "StoppingState": "_format", "json_value": "_format", "optimizer_steps":
    "_format",
    "CheckpointStore": "_store", "open_store": "_store",
})
