"""Batches: the keras-free core every Keras hand-off stands on.

The plan of an epoch (pure), window tasks and their worker-side reading, prefetch bounded in
bytes, the epoch state, the data prepared for serving, the :class:`BatchStream` of their
batches that both Keras hand-offs (``DaskSequence`` and the tf.data hand-off) stand on, and its
one resume state (:class:`StreamState`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.batches._epoch import EpochStats
    from daskfeed.batches._layout import blocksize_for, largest_block, planned_window_bytes
    from daskfeed.batches._order import ORDER_FORMATS, ORDER_VERSION, GlobalOrder, unit_rows
    from daskfeed.batches._plan import EpochPlan, make_plan
    from daskfeed.batches._prepare import Prepared
    from daskfeed.batches._settings import DataSettings
    from daskfeed.batches._skips import (
        Skips,
        is_skipped,
        kept_batch,
        kept_before,
        skipped_count,
        skipped_rows,
    )
    from daskfeed.batches._state import STATE_VERSION, StreamState
    from daskfeed.batches._stream import BatchStream, Closes
    from daskfeed.batches._trace import BucketRows, batch_positions, dealt_sizes, file_rows

__all__ = ["ORDER_FORMATS", "ORDER_VERSION", "STATE_VERSION", "BatchStream", "BucketRows", "Closes",
           "DataSettings", "EpochPlan", "EpochStats", "GlobalOrder", "Prepared", "Skips",
           "StreamState", "batch_positions", "blocksize_for", "dealt_sizes", "file_rows",
           "is_skipped", "kept_batch", "kept_before", "largest_block", "make_plan",
           "planned_window_bytes", "skipped_count", "skipped_rows", "unit_rows"]

__getattr__, __dir__ = attach(__name__, {
    "EpochStats": "_epoch",
    "blocksize_for": "_layout", "largest_block": "_layout", "planned_window_bytes": "_layout",
    "EpochPlan": "_plan", "make_plan": "_plan", "ORDER_VERSION": "_order", "ORDER_FORMATS": "_order",
    "GlobalOrder": "_order", "unit_rows": "_order",
    "Prepared": "_prepare",
    "DataSettings": "_settings",
    "Skips": "_skips", "skipped_rows": "_skips", "is_skipped": "_skips", "kept_batch": "_skips",
    "kept_before": "_skips", "skipped_count": "_skips",
    "STATE_VERSION": "_state", "StreamState": "_state",
    "BatchStream": "_stream", "Closes": "_stream",
    "batch_positions": "_trace", "BucketRows": "_trace", "dealt_sizes": "_trace", "file_rows": "_trace",
})
