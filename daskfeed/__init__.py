"""daskfeed: train Keras models on CSV data sets far larger than memory, fed by Dask.

``import daskfeed`` is light: pandas, dask, distributed and keras load only when a name that
needs them is first used (PEP 562).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from daskfeed.exceptions import (
    BudgetError,
    CheckpointError,
    DaskfeedError,
    DataError,
    DataNotFoundError,
    FeedTimeoutError,
    ManifestMismatchError,
    SchemaError,
)

__version__ = "0.1.0"

_LAZY = {
    "Source": "daskfeed.source",
    "Manifest": "daskfeed.manifest",
    "scan": "daskfeed.scanner",
    "EpochPlan": "daskfeed.plan",
    "make_plan": "daskfeed.plan",
    "Budget": "daskfeed.cluster",
    "DaskSequence": "daskfeed.sequence",
    "predict": "daskfeed.predictions",
    "default_model": "daskfeed.model",
    "write_demo_data": "daskfeed.demo",
}

__all__ = [
    "Budget",
    "BudgetError",
    "CheckpointError",
    "DaskSequence",
    "DaskfeedError",
    "DataError",
    "DataNotFoundError",
    "EpochPlan",
    "FeedTimeoutError",
    "Manifest",
    "ManifestMismatchError",
    "SchemaError",
    "Source",
    "default_model",
    "make_plan",
    "predict",
    "scan",
    "write_demo_data",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'daskfeed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
