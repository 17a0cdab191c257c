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
