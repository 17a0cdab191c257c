"""Cluster: starting or reaching a Dask cluster, the memory budget, futures, client ownership.

The one place that starts a ``LocalCluster`` or connects to a scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.cluster._budget import (
        MAX_BLOCKSIZE,
        MIN_WORKER,
        TRAINER_RESERVE,
        WINDOW_BYTES,
        Budget,
        check_worker_memory,
        default_memory_limit,
        default_nworkers,
        parse_memory_limit,
    )
    from daskfeed.cluster._futures import (
        POLL_SECONDS,
        Pending,
        WindowCancelled,
        client_status,
        drop,
        explain,
        gathered_map,
        result,
        result_unless_paused,
        settle,
        wait_for,
    )
    from daskfeed.cluster._heap import release_after_task, trim_heap
    from daskfeed.cluster._owner import Owner, refuse_multiprocessing
    from daskfeed.cluster._remote import connect, make_security
    from daskfeed.cluster._start import (
        ClusterSpec,
        acquire_client,
        client_context,
        close_client,
        open_in_budget,
        start_local_cluster,
    )
    from daskfeed.cluster._threads import trainer_threads

__all__ = [
    "MAX_BLOCKSIZE",
    "MIN_WORKER",
    "POLL_SECONDS",
    "TRAINER_RESERVE",
    "WINDOW_BYTES",
    "Budget",
    "ClusterSpec",
    "Owner",
    "Pending",
    "WindowCancelled",
    "acquire_client",
    "check_worker_memory",
    "client_context",
    "client_status",
    "close_client",
    "connect",
    "default_memory_limit",
    "default_nworkers",
    "drop",
    "explain",
    "gathered_map",
    "make_security",
    "open_in_budget",
    "parse_memory_limit",
    "refuse_multiprocessing",
    "release_after_task",
    "result",
    "result_unless_paused",
    "settle",
    "start_local_cluster",
    "trainer_threads",
    "trim_heap",
    "wait_for",
]

__getattr__, __dir__ = attach(__name__, {
    "Budget": "_budget", "MAX_BLOCKSIZE": "_budget", "MIN_WORKER": "_budget", "TRAINER_RESERVE":
    "_budget", "WINDOW_BYTES": "_budget", "check_worker_memory": "_budget", "default_memory_limit":
    "_budget", "default_nworkers": "_budget", "parse_memory_limit": "_budget",
    "POLL_SECONDS": "_futures", "Pending": "_futures", "WindowCancelled": "_futures",
    "client_status": "_futures", "drop": "_futures",
    "explain": "_futures", "gathered_map": "_futures", "result": "_futures",
    "result_unless_paused": "_futures",
    "settle": "_futures", "wait_for": "_futures",
    "release_after_task": "_heap",
    "trim_heap": "_heap",
    "Owner": "_owner", "refuse_multiprocessing": "_owner",
    "connect": "_remote", "make_security": "_remote",
    "ClusterSpec": "_start", "acquire_client": "_start", "client_context": "_start",
    "close_client": "_start", "open_in_budget": "_start", "start_local_cluster": "_start",
    "trainer_threads": "_threads",
})
