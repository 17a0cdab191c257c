"""Dashboard: the scheduler plugin behind ``/daskfeed`` and ``daskfeed_*``, and a run's events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.dashboard._plugin import EpochSpans, Links, install, report, report_cache, scan_span

__all__ = ["EpochSpans", "Links", "install", "report", "report_cache", "scan_span"]

__getattr__, __dir__ = attach(__name__, {
    "EpochSpans": "_plugin", "Links": "_plugin", "install": "_plugin", "report": "_plugin",
    "report_cache": "_plugin", "scan_span": "_plugin",
})
