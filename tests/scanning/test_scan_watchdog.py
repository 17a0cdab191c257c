"""The scan's watchdog judges progress, not task completion (issue 11, item 7)."""

from __future__ import annotations

import gzip
import io
import os
import time
import warnings

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

import daskfeed
from daskfeed.core._exceptions import FeedTimeoutError

HEADER = "x,label\n"


def _rows(start: int, n: int) -> bytes:
    return "".join(f"{i},{i % 2}\n" for i in range(start, start + n)).encode()


class _SlowLocalFileSystem(LocalFileSystem):
    """The local disk, throttled to ``RATE`` bytes per second (each read waits its share)."""

    protocol = "slowfile"
    RATE = 1.5e6

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode=mode, **kwargs)
        if "r" not in mode:
            return f
        rate = self.RATE

        class Throttled(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, buf) -> int:
                data = f.read(min(len(buf), 256 << 10))
                time.sleep(len(data) / rate)  # the behaviour under test: a slow disk, no stall
                buf[: len(data)] = data
                return len(data)

            def close(self) -> None:
                f.close()
                super().close()

        return io.BufferedReader(Throttled())


def test_a_slow_read_that_keeps_making_progress_never_trips_the_watchdog(tmp_path):
    from distributed import Client, LocalCluster

    fsspec.register_implementation("slowfile", _SlowLocalFileSystem, clobber=True)
    (tmp_path / "a.csv").write_text(HEADER + _rows(0, 100).decode())
    # ~8.9 MB of CSV, gzip'd (stored): 1.5 MB/s, so ~6 s of reading alone, well over twice the
    # 2 s timeout however fast the parse, decompressed in 1 MiB reads and parsed in chunks that
    # each report progress
    body = HEADER.encode() + _rows(0, 1_000_000)
    (tmp_path / "z.csv.gz").write_bytes(gzip.compress(body, compresslevel=0))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the compressed file's one-partition warning
            seen: list[tuple[int, int, int, float, bool]] = []
            m = daskfeed.scan(f"slowfile://{tmp_path}/*.csv*", label="label", client=client,
                              timeout=2, blocksize="1MiB", progress=lambda *a: seen.append(a))
        elapsed = time.monotonic() - t0
    assert elapsed > 2 * 2  # the read really outlasted the timeout
    assert m.rows == 100 + 1_000_000  # and every row of the slow file arrived
    # the progress callback saw rows arrive while the scan ran, then the whole at the end
    total = seen[-1][2]
    assert seen[-1][4] and seen[-1][1] == total and seen[-1][0] == m.rows
    assert any(0 < rows < m.rows and not finished for rows, _, _, _, finished in seen), seen


def test_a_hung_read_fails_within_the_timeout_naming_the_partition(tmp_path):
    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    (tmp_path / "a.csv").write_text(HEADER + _rows(0, 100).decode())
    fifo = tmp_path / "z.csv"
    os.mkfifo(fifo)  # nobody ever writes: opening it blocks forever
    client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="127.0.0.1:0")
    try:
        t0 = time.monotonic()
        with pytest.raises(FeedTimeoutError) as info:
            daskfeed.scan(str(tmp_path / "*.csv"), label="label", client=client, timeout=3)
        elapsed = time.monotonic() - t0
    finally:
        close_client(client)
    msg = str(info.value)
    assert "No scan task made progress within 3s" in msg, msg
    assert "z.csv" in msg and "Hint:" in msg, msg
    assert elapsed < 3 + 10, elapsed


def test_waiting_for_the_scan_leaves_one_waiter_per_task_however_often_it_looks(client, tmp_path,
                                                                             monkeypatch):
    """The trainer looks at the scan about every second; each look once started a waiter on
    every pending task and left it behind (``distributed.wait(FIRST_COMPLETED)``): N tasks
    watched for S seconds piled up ~N·S/2 coroutines, 0.5 GB of the trainer at 13 GB of CSV.
    Here 40 tasks looked at 150 times: the event loop's tasks do not grow with the looks."""
    import asyncio

    from distributed import Event

    from daskfeed.reading import Source
    from daskfeed.scanning import _watchdog

    (tmp_path / "a.csv").write_text(HEADER + _rows(0, 10).decode())
    src = Source(str(tmp_path / "a.csv"))
    monkeypatch.setattr(_watchdog, "LOOK", 0.005)  # many looks while the tasks stand still
    name = f"hold-{tmp_path.name}"

    def held(i: int) -> int:
        Event(name).wait()
        return i

    async def loop_tasks() -> int:
        return len(asyncio.all_tasks())

    before = client.sync(loop_tasks)
    futures = [client.submit(held, i, pure=False) for i in range(40)]
    looks, seen = [0], []

    def on_progress(rows: int, done: int, total: int, seconds: float, finished: bool) -> None:
        looks[0] += 1
        seen.append(client.sync(loop_tasks) - before)
        if looks[0] == 150:
            Event(name, client=client).set()

    try:
        _watchdog.await_scan(client, futures, [[0]] * 40, src, 120, f"t-{name}", on_progress)
        statuses = {f.status for f in futures}
    finally:
        Event(name, client=client).set()
        for f in futures:
            f.release()
    assert looks[0] >= 150 and statuses == {"finished"}, (looks, statuses)
    middle, late = max(seen[20:60]), max(seen[100:150])  # (~2 per task: its waiter, the client's)
    assert late <= middle + 10 and late <= 3 * 40, seen  # (the old loop: 40 more at each look)
