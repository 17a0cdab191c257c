"""Core: settings, errors, atomic writes, lifecycle, process memory, the backend's choice, secrets.

What every layer above stands on; it imports nothing else of daskfeed. ``attach`` makes the
lazy package faces (PEP 562) of every subpackage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core._lazy import attach

if TYPE_CHECKING:
    from daskfeed.core import _config as config
    from daskfeed.core._atomic import create_new, fsync, replace, temporary_name, write_file, writing
    from daskfeed.core._backend import BACKENDS, HANDOFFS, choose, handoff_name, native_logs_filtered, refuse
    from daskfeed.core._exceptions import (
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
        one_line_warnings,
        refuse_setting,
        warn_user,
    )
    from daskfeed.core._lifecycle import (
        PROCESS_STOP,
        SETTLE,
        Aborted,
        Stop,
        close_at_exit,
        raise_outside,
        run_at_exit,
    )
    from daskfeed.core._rss import RSSSampler, tree_rss
    from daskfeed.core._secrets import redact_text, redact_url, secret_options, url_parts
    from daskfeed.core._text import duration, eta_seconds

__all__ = [
    "BACKENDS",
    "HANDOFFS",
    "PROCESS_STOP",
    "SETTLE",
    "Aborted",
    "BackendError",
    "BudgetError",
    "CacheError",
    "CheckpointError",
    "ClusterError",
    "DaskfeedError",
    "DataError",
    "DataNotFoundError",
    "FeedTimeoutError",
    "ManifestMismatchError",
    "RSSSampler",
    "SchemaError",
    "SettingError",
    "Stop",
    "attach",
    "choose",
    "close_at_exit",
    "config",
    "create_new",
    "duration",
    "eta_seconds",
    "fsync",
    "handoff_name",
    "native_logs_filtered",
    "one_line_warnings",
    "raise_outside",
    "redact_text",
    "redact_url",
    "refuse",
    "refuse_setting",
    "replace",
    "run_at_exit",
    "secret_options",
    "temporary_name",
    "tree_rss",
    "url_parts",
    "warn_user",
    "write_file",
    "writing",
]

__getattr__, __dir__ = attach(__name__, {
    "create_new": "_atomic", "fsync": "_atomic", "replace": "_atomic", "temporary_name": "_atomic",
    "write_file": "_atomic", "writing": "_atomic",
    "BACKENDS": "_backend", "HANDOFFS": "_backend", "choose": "_backend", "handoff_name": "_backend",
    "native_logs_filtered": "_backend", "refuse": "_backend",
    "BackendError": "_exceptions", "BudgetError": "_exceptions", "CacheError": "_exceptions",
    "CheckpointError": "_exceptions", "ClusterError": "_exceptions", "DaskfeedError": "_exceptions",
    "DataError": "_exceptions", "DataNotFoundError": "_exceptions", "FeedTimeoutError": "_exceptions",
    "ManifestMismatchError": "_exceptions", "SchemaError": "_exceptions", "SettingError": "_exceptions",
    "refuse_setting": "_exceptions", "warn_user": "_exceptions", "one_line_warnings": "_exceptions",
    "Aborted": "_lifecycle", "PROCESS_STOP": "_lifecycle", "SETTLE": "_lifecycle", "Stop": "_lifecycle",
    "close_at_exit": "_lifecycle", "raise_outside": "_lifecycle", "run_at_exit": "_lifecycle",
    "RSSSampler": "_rss", "tree_rss": "_rss",
    "redact_text": "_secrets", "redact_url": "_secrets", "secret_options": "_secrets",
    "url_parts": "_secrets",
    "duration": "_text", "eta_seconds": "_text",
}, modules={"config": "_config"})
