"""Scanning: the ONE pass over every block on the cluster that makes a ``Manifest``.

Scan tasks, column kinds, mergeable statistics, the watchdog, the results kept per part of
the files (``ScanStore``: a data set that grew scans its new files only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.scanning._scan import scan, scan_source
    from daskfeed.scanning._store import ScanStore
    from daskfeed.scanning._watchdog import ProgressCallback

__all__ = ["ProgressCallback", "ScanStore", "scan", "scan_source"]

__getattr__, __dir__ = attach(__name__, {
    "scan": "_scan", "scan_source": "_scan", "ScanStore": "_store", "ProgressCallback": "_watchdog",
})
