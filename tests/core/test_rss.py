"""The process tree's memory: its peak, and which process held what at the peak."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
from helpers import wait_for

from daskfeed.core._rss import RSSSampler

HOLD = "import sys; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); sys.stdin.read()"


def test_the_peak_is_broken_down_by_process():
    """A parent with a child holding 200 MiB: the peak counts both, the breakdown names each."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
        "stdin=subprocess.PIPE); print(c.pid, flush=True); sys.stdin.read(); c.stdin.close(); "
        "c.wait()"), HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        wait_for(lambda: child.memory_info().rss >= 200 * 2**20, 60, "the child's 200 MiB")
        with RSSSampler(interval=0.05, process=psutil.Process(parent.pid)) as rss:
            rss.sample()
        rows = rss.breakdown()
        assert rss.overall_peak == sum(v for _, v in rows)
        name = os.path.basename(child.cmdline()[0])
        assert [label for label, _ in rows] == [name, "root"]  # the child holds most
        assert rows[0][1] >= 200 * 2**20 > rows[1][1]
        assert rss.overall_parts == {name: rows[0][1], "root": rows[1][1]}
    finally:
        parent.stdin.close()
        parent.wait(30)
