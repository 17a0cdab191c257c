"""Training: ``train`` as named steps, its options, the default model, callbacks, outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.batches import DataSettings as DataOptions  # (deprecated: _options.__getattr__)
    from daskfeed.training._callbacks import Checkpointer, fit_from
    from daskfeed.training._early_stopping import EarlyStopping
    from daskfeed.training._loss_series import loss_steps
    from daskfeed.training._model import default_model
    from daskfeed.training._options import ClusterOptions, FitOptions, TrainOptions
    from daskfeed.training._rows import StepRows, batch_rows, trace_steps
    from daskfeed.training._train import train
    from daskfeed.training._watch import WatchCallback

__all__ = ["Checkpointer", "ClusterOptions", "DataOptions", "EarlyStopping", "FitOptions", "StepRows",
           "TrainOptions",
           "WatchCallback", "batch_rows", "default_model", "fit_from", "loss_steps", "trace_steps",
           "train"]

__getattr__, __dir__ = attach(__name__, {
    "Checkpointer": "_callbacks", "fit_from": "_callbacks",
    "EarlyStopping": "_early_stopping",
    "default_model": "_model",
    "ClusterOptions": "_options", "DataOptions": "_options", "FitOptions": "_options", "TrainOptions":
    "_options",
    "StepRows": "_rows", "batch_rows": "_rows", "trace_steps": "_rows",
    "loss_steps": "_loss_series",
    "train": "_train",
    "WatchCallback": "_watch",
})
