"""A worker's close prints no traceback for the heartbeat it cut off; other failures still show."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

from daskfeed.cluster._quiet import HEARTBEAT_CUT, ClosingHeartbeat

# The race, made certain: the scheduler answers a heartbeat only 3 s after it was asked (a busy
# scheduler), and the cluster is closed while that heartbeat is in flight. Run in a fresh
# interpreter: the workers' stderr is the script's.
SCRIPT = r'''
import asyncio, sys, threading
from distributed import Client, LocalCluster

from daskfeed.cluster._start import quiet_close


def main(quiet):
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    client = Client(cluster)
    if quiet:
        quiet_close(client)
    answer = cluster.scheduler.handlers["heartbeat_worker"]
    asked = threading.Event()

    async def late(*args, **kwargs):
        asked.set()
        await asyncio.sleep(3)  # the busy scheduler under test, not a synchronisation
        return answer(*args, **kwargs)

    cluster.scheduler.handlers["heartbeat_worker"] = late
    assert asked.wait(60), "no heartbeat came"
    print("CLOSING", file=sys.stderr, flush=True)
    client.close()
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1] == "quiet")
'''


@pytest.mark.parametrize("quiet", [False, True], ids=["distributed-alone", "quiet_close"])
def test_closing_while_a_heartbeat_is_in_flight(tmp_path, quiet):
    """distributed alone logs the cut heartbeat with a traceback (the race is provoked); with
    quiet_close (what acquire_client does to a client it is handed) the close is silent."""
    script = tmp_path / "close.py"
    script.write_text(SCRIPT, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script), "quiet" if quiet else "loud"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    after = out.stderr.split("CLOSING", 1)[1]
    if quiet:
        assert "Traceback" not in after and HEARTBEAT_CUT not in after, after[-3000:]
    else:
        assert HEARTBEAT_CUT in after and "CommClosedError" in after, after[-3000:]


def _record(status: str, err: BaseException) -> logging.LogRecord:
    """The record Worker.heartbeat logs when its call fails with ``err``, its worker ``status``."""

    class Worker:
        def __init__(self) -> None:
            self.status = SimpleNamespace(name=status)

        def heartbeat(self):
            raise err

    try:
        Worker().heartbeat()
    except BaseException:
        info = sys.exc_info()
    return logging.LogRecord("distributed.worker", logging.ERROR, "worker.py", 1,
                             HEARTBEAT_CUT + ".", None, info)


def test_only_a_closing_worker_s_cut_heartbeat_is_dropped():
    keep = ClosingHeartbeat().filter
    assert not keep(_record("closing", ConnectionError("Stream is closed")))
    assert not keep(_record("closed", ConnectionError("Stream is closed")))
    assert keep(_record("running", ConnectionError("Stream is closed")))  # a real outage
    assert keep(_record("closing", ValueError("a bug")))  # not a closed connection
    other = logging.LogRecord("distributed.worker", logging.ERROR, "worker.py", 1, "other", None,
                              None)
    assert keep(other)


# A task still running when its cluster closes (a window fetched ahead, released by a closed
# sequence: its thread runs on): the worker's close cancels it. The task says when it runs
# (a distributed Event); the close comes then.
RUNNING = r'''
import sys, threading
from distributed import Client, Event, LocalCluster

from daskfeed.cluster._start import quiet_close


def window(name):
    Event(name).set()
    threading.Event().wait(6)  # a window's work, longer than the close waits for it


def main(quiet):
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    client = Client(cluster)
    if quiet:
        quiet_close(client)
    future = client.submit(window, "running", pure=False)
    assert Event("running", client=client).wait(60), "the task never ran"
    print("CLOSING", file=sys.stderr, flush=True)
    del future
    client.close()
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1] == "quiet")
'''


@pytest.mark.parametrize("quiet", [False, True], ids=["distributed-alone", "quiet_close"])
def test_closing_while_a_task_runs(tmp_path, quiet):
    """distributed alone warns that the running task ended with CancelledError; with quiet_close
    (what acquire_client does to a client it is handed) that warning is gone."""
    from daskfeed.cluster._quiet import TASK_CUT

    script = tmp_path / "running.py"
    script.write_text(RUNNING, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script), "quiet" if quiet else "loud"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    after = out.stderr.split("CLOSING", 1)[1]
    assert (TASK_CUT[1] in after) is not quiet, after[-3000:]


def test_only_a_task_cancelled_at_close_is_dropped():
    from daskfeed.cluster._quiet import CancelledAtClose

    keep = CancelledAtClose().filter

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.worker.state_machine", logging.WARNING, "w.py", 1,
                                 msg, None, None)

    assert not keep(record("Async instruction for <Task cancelled name=\"execute('x')\"> ended "
                           "with CancelledError"))
    assert keep(record("Async instruction for <Task> failed"))  # anything else still shows
    assert keep(record("Unhandled exception in async instruction for <Task>"))
