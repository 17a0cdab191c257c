"""Waiting helpers shared by the tests that start processes and watch them."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], timeout: float, what: str | Callable[[], str],
             interval: float = 0.05) -> Any:
    """Poll ``condition()`` until it returns something true (returned); after ``timeout`` s fail
    the test saying ``what`` never happened (``what``: a str, or a callable giving one)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g}s for {what() if callable(what) else what}")
        time.sleep(interval)  # polling interval


def wait_for_scheduler_file(path: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until ``proc`` (a starting ``dask scheduler``) has written its scheduler file."""
    def written() -> bool:
        assert proc.poll() is None, f"dask scheduler exited with status {proc.returncode}"
        return os.path.exists(path) and os.path.getsize(path) > 0

    wait_for(written, timeout, f"the scheduler file {path}", interval=0.1)


def in_process_budget(room: int = 3 * 10**9) -> str:
    """A memory limit for predict called in this test process: what the process holds now plus
    ``room`` (a CLI-sized budget). predict counts its caller's memory in the budget, and a test
    worker that ran many tests before holds more than a fresh CLI does."""
    import psutil

    return str(psutil.Process().memory_info().rss + room)
