"""Training: ``train`` as named steps, its options, the default model, callbacks, outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.training._callbacks import fit_from
    from daskfeed.training._model import default_model
    from daskfeed.training._options import ClusterOptions, DataOptions, FitOptions, TrainOptions
    from daskfeed.training._train import train

__all__ = ["ClusterOptions", "DataOptions", "FitOptions", "TrainOptions", "default_model", "fit_from",
           "train"]

__getattr__, __dir__ = attach(__name__, {
    "fit_from": "_callbacks",
    "default_model": "_model",
    "ClusterOptions": "_options", "DataOptions": "_options", "FitOptions": "_options", "TrainOptions":
    "_options",
    "train": "_train",
})
