"""The local cluster daskfeed starts: loopback only, private spill directory, closed cleanly."""

from __future__ import annotations

import os
import stat

import psutil

from daskfeed.cluster import Budget, close_client, start_local_cluster


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    out = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.append((conn.pid, conn.laddr.ip, conn.laddr.port))
    return out


def test_every_listening_socket_is_on_loopback_and_spill_is_private():
    client = start_local_cluster(Budget.split("3GB", nworkers=2), dashboard_address="127.0.0.1:0")
    try:
        assert client.submit(sum, [1, 2]).result() == 3
        tree = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
        sockets = _listening(tree)
        assert len(sockets) >= 5, sockets  # scheduler, its dashboard, 2 nannies, 2 workers ...
        assert all(ip == "127.0.0.1" for _, ip, _ in sockets), sockets
        spill = client._daskfeed_spill
        assert stat.S_IMODE(os.stat(spill).st_mode) == 0o700
        assert client.dashboard_link.startswith("http://127.0.0.1:")
    finally:
        close_client(client)
    assert not os.path.exists(spill)
    # no worker, nanny or scheduler outlives the cluster (multiprocessing's own resource
    # tracker lives as long as this interpreter and is not ours to stop)
    children = [p for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [" ".join(p.cmdline()) for p in alive]
