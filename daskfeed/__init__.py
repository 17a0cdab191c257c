"""daskfeed: train Keras models on CSV data sets far larger than memory, fed by Dask.

The one public face. ``import daskfeed`` is light: pandas, dask, distributed and keras load only
when a name that needs them is first used (PEP 562). The subpackages below are the stages of the
data flow, bottom to top: ``core``, ``cluster`` and ``dashboard``, ``reading``, ``cache``,
``manifest``, ``scanning``, ``batches`` (the keras-free core), ``adapters`` (Keras' hand-offs),
``inference``, ``checkpoint``, ``training``, ``cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import (
    BackendError,
    BudgetError,
    CacheError,
    CheckpointError,
    ClusterError,
    DaskfeedError,
    DataError,
    DataNotFoundError,
    FeedTimeoutError,
    ManifestMismatchError,
    SchemaError,
    SettingError,
    attach,
)

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence, TorchDataset
    from daskfeed.batches import DataSettings, EpochPlan, make_plan
    from daskfeed.checkpoint import CheckpointStore
    from daskfeed.cli import write_demo_data
    from daskfeed.cluster import Budget
    from daskfeed.inference import export, predict
    from daskfeed.manifest import Manifest
    from daskfeed.reading import Source
    from daskfeed.scanning import scan
    from daskfeed.training import (
        Checkpointer,
        ClusterOptions,
        DataOptions,
        EarlyStopping,
        FitOptions,
        TrainOptions,
        WatchCallback,
        batch_rows,
        default_model,
        fit_from,
        loss_steps,
        train,
    )

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "Budget",
    "BudgetError",
    "CacheError",
    "CheckpointError",
    "CheckpointStore",
    "Checkpointer",
    "ClusterError",
    "ClusterOptions",
    "DaskSequence",
    "DaskfeedError",
    "DataError",
    "DataNotFoundError",
    "DataOptions",
    "DataSettings",
    "EarlyStopping",
    "EpochPlan",
    "FeedTimeoutError",
    "FitOptions",
    "Manifest",
    "ManifestMismatchError",
    "SchemaError",
    "SettingError",
    "Source",
    "TorchDataset",
    "TrainOptions",
    "WatchCallback",
    "batch_rows",
    "default_model",
    "export",
    "fit_from",
    "loss_steps",
    "make_plan",
    "predict",
    "scan",
    "train",
    "write_demo_data",
]

__getattr__, __dir__ = attach(__name__, {
    "DaskSequence": "adapters", "TorchDataset": "adapters",
    "DataSettings": "batches", "EpochPlan": "batches", "make_plan": "batches",
    "CheckpointStore": "checkpoint",
    "write_demo_data": "cli",
    "Budget": "cluster",
    "Manifest": "manifest",
    "export": "inference", "predict": "inference",
    "Source": "reading",
    "scan": "scanning",
    "ClusterOptions": "training", "DataOptions": "training", "FitOptions": "training",
    "TrainOptions": "training", "default_model": "training", "Checkpointer": "training",
    "EarlyStopping": "training", "WatchCallback": "training", "fit_from": "training", "train": "training",
    "batch_rows": "training", "loss_steps": "training",
})
