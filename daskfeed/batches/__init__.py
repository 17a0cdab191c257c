"""Batches: the keras-free core every Keras hand-off stands on.

The plan of an epoch (pure), window tasks and their worker-side reading, prefetch bounded in
bytes, the epoch state, and the data prepared for a sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.batches._epoch import EpochCursor, EpochStats, PlanSettings
    from daskfeed.batches._layout import blocksize_for, largest_block, planned_window_bytes, window_rows_for
    from daskfeed.batches._plan import EpochPlan, Slice, make_plan
    from daskfeed.batches._prefetch import Prefetcher
    from daskfeed.batches._prepare import Prepared
    from daskfeed.batches._windows import WindowTasks

__all__ = ["EpochCursor", "EpochPlan", "EpochStats", "PlanSettings", "Prefetcher", "Prepared", "Slice",
           "WindowTasks", "blocksize_for", "largest_block", "make_plan", "planned_window_bytes",
           "window_rows_for"]

__getattr__, __dir__ = attach(__name__, {
    "EpochCursor": "_epoch", "EpochStats": "_epoch", "PlanSettings": "_epoch",
    "blocksize_for": "_layout", "largest_block": "_layout", "planned_window_bytes": "_layout",
    "window_rows_for": "_layout",
    "EpochPlan": "_plan", "Slice": "_plan", "make_plan": "_plan",
    "Prefetcher": "_prefetch",
    "Prepared": "_prepare",
    "WindowTasks": "_windows",
})
