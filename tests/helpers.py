"""Helpers shared by test files in several folders: waiting on processes, the repository's places,
deploy/compose.yaml's command lines, data written by predict's tests.

Imported as ``from helpers import ...``: tests/ is on ``sys.path`` (pytest puts the folder of
tests/conftest.py there), whichever folder the test file is in.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: tests/ and the repository's root, wherever the test file using them lies under tests/
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


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


def load_factor() -> float:
    """How much busier than its cores the machine is now: the 1-minute load average per core,
    at least 1. A bound on a duration the machine's speed sets (a process's exit, not an event
    the test can wait on) is multiplied by it, so it holds beside other work (CI, a CPU hog)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def foreground() -> None:
    """``preexec_fn`` of a command the test Ctrl-Cs: SIGINT as a terminal's foreground job has it.

    A shell ignores SIGINT in the commands it starts in the background (no job control), and a
    child inherits an ignored signal: a CI that runs the tests so would start ``daskfeed train``
    deaf to Ctrl-C (Python keeps an inherited ``SIG_IGN``), which no user at a terminal is.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cpu_hogs(count: int | None = None) -> list[subprocess.Popen]:
    """``count`` processes (default: two per core) that keep a core busy each until killed.

    At the trainer's priority, so its local workers (niced lower) get what is left: the machine
    a CI run beside other heavy jobs is.
    """
    import sys

    n = count if count is not None else 2 * (os.cpu_count() or 1)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


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


def compose_commands(scheduler_file: str) -> tuple[list[str], list[str], list[str]]:
    """deploy/compose.yaml's scheduler and worker command lines, on loopback ports the OS picks,
    meeting through ``scheduler_file``, with TLS certificates deploy/make_certs.py makes beside
    it (for the compose file's ``/tls/``); and the trainer's flags for them."""
    import sys

    import yaml

    certs = os.path.join(os.path.dirname(scheduler_file), "tls")
    subprocess.run([sys.executable, str(ROOT / "deploy" / "make_certs.py"), certs], check=True,
                   stdout=subprocess.DEVNULL)
    services = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]
    sched, worker = list(services["scheduler"]["command"]), list(services["worker"]["command"])

    def setopt(cmd: list[str], flag: str, value: str) -> None:
        cmd[cmd.index(flag) + 1] = value

    def mounted(cmd: list[str]) -> list[str]:  # the container's /tls/ is the directory made here
        return [os.path.join(certs, p[len("/tls/"):]) if p.startswith("/tls/") else p for p in cmd]

    setopt(sched, "--host", "127.0.0.1")
    setopt(sched, "--port", "0")
    setopt(sched, "--dashboard-address", "127.0.0.1:0")
    sched = [*mounted(sched), "--scheduler-file", scheduler_file]
    worker = [p for p in worker if not p.startswith(("tcp://", "tls://"))]
    setopt(worker, "--dashboard-address", "127.0.0.1:0")
    worker = [*mounted(worker), "--scheduler-file", scheduler_file, "--host", "127.0.0.1",
              "--nthreads", "1"]
    trainer = ["--tls-ca-file", os.path.join(certs, "ca.pem"),
               "--tls-cert", os.path.join(certs, "client.pem"),
               "--tls-key", os.path.join(certs, "client.key")]
    return sched, worker, trainer


def write_rows(root: str, *, n: int, files: int, seed: int, unseen: bool = False) -> None:
    """Rows with a text column (``unseen``: categories training never saw), blanks, numbers, a date."""
    import numpy as np

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    colors = ["red", "green", "mauve", "ochre"] if unseen else ["red", "green", "blue", "teal"]
    per = n // files
    for f in range(files):
        lines = ["row_id,color,size,count,day,cleared"]
        for i in range(f * per, (f + 1) * per):
            color, size = rng.choice(colors), rng.normal(5, 2)
            label = int(size + 2 * (color == "red") + rng.normal(0, 1) > 6)
            day = f"2024-{rng.integers(1, 13):02d}-{rng.integers(1, 28):02d}"
            lines.append(f"{i},{'' if rng.random() < 0.1 else color},"
                         f"{'' if rng.random() < 0.1 else f'{size:.3f}'},{rng.integers(0, 100)},"
                         f"{day},{label}")
        with open(os.path.join(root, f"part{f}.csv"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


# the features of the kill/resume harness's recording model (tests/killresume.py), the id first
RECORDED_FEATURES = ["row_id", "level", "deaths", "hour"]  # as_matrix: row_id is column 0


def write_wide_data(root: Path) -> str:
    """4 CSV files under ``root``: x1, a millisecond timestamp ts (int64, > 2**24, exact only in
    64 bits), a category, and a 0/1 label y from x1 and ts; returns their glob."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(3)
    for i in range(4):
        n = 1500
        x1 = rng.normal(size=n)
        ts = 1_700_000_000_000 + rng.integers(0, 10**9, n)
        # ts is in ms: its middle is 1_700_000_500_000 (the label depends on both columns)
        y = (x1 + (ts - 1_700_000_500_000) / 3e8 + rng.normal(0, 0.3, n) > 0).astype(int)
        pd.DataFrame({"x1": x1, "ts": ts, "cat": rng.choice(["a", "b", "c"], n), "y": y}).to_csv(
            root / f"part{i}.csv", index=False)
    return str(root / "*.csv")
