"""The local cluster daskfeed starts: loopback only, private spill directory, closed cleanly."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

# Runs in a fresh interpreter so that no other cluster of the test session shares the process.
AUDIT = r'''
import json, os, stat, psutil
from daskfeed.cluster._budget import Budget
from daskfeed.cluster._start import close_client, spill_directory, start_local_cluster

def main():
    client = start_local_cluster(Budget.split("3GB", nworkers=2), dashboard_address="127.0.0.1:0")
    assert client.submit(sum, [1, 2]).result() == 3
    tree = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    sockets = [(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
               if c.status == psutil.CONN_LISTEN and c.pid in tree]
    spill = spill_directory(client)
    mode = stat.S_IMODE(os.stat(spill).st_mode)
    link = client.dashboard_link
    close_client(client)
    children = [p for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())]
    _, alive = psutil.wait_procs(children, timeout=10)
    print(json.dumps({"sockets": sockets, "mode": mode, "spill_left": os.path.exists(spill),
                      "link": link, "alive": [" ".join(p.cmdline()) for p in alive]}))

if __name__ == "__main__":
    main()
'''


def test_every_listening_socket_is_on_loopback_and_spill_is_private(tmp_path):
    script = tmp_path / "audit.py"
    script.write_text(AUDIT, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    sockets = report["sockets"]
    assert len(sockets) >= 5, sockets  # scheduler + dashboard, 2 nannies, 2 workers (+ their http)
    assert all(ip == "127.0.0.1" for ip, _ in sockets), sockets
    assert report["mode"] == 0o700
    assert not report["spill_left"]
    assert report["link"].startswith("http://127.0.0.1:")
    assert not report["alive"], report["alive"]


# Runs in a fresh interpreter: the dashboard's modules are not imported by another test yet.
SPAWNING = r'''
import json, multiprocessing, sys
from daskfeed.cluster._budget import Budget
from daskfeed.cluster._start import close_client, start_local_cluster

seen = []

def spawning():
    seen.append({"dashboard": "distributed.dashboard.scheduler" in sys.modules,
                 "workers": len(multiprocessing.active_children())})

def main():
    before = "distributed.dashboard.scheduler" in sys.modules
    client = start_local_cluster(Budget.split("3GB", nworkers=2), dashboard_address="127.0.0.1:0",
                                 spawning=spawning)
    try:
        ok = client.submit(sum, [1, 2]).result() == 3
        workers = len(client.scheduler_info()["workers"])
    finally:
        close_client(client)
    print(json.dumps({"before": before, "seen": seen, "ok": ok, "workers": workers}))

if __name__ == "__main__":
    main()
'''


def test_spawning_is_called_once_the_dashboard_is_imported_before_any_worker_starts(tmp_path):
    # keras' import (daskfeed train's thread) waits for it: the scheduler's own imports no longer
    # share the interpreter's lock with it while the workers wait for the scheduler
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["before"] is False  # (a fresh interpreter: imported by the start, not before it)
    assert report["seen"] == [{"dashboard": True, "workers": 0}]
    assert report["ok"] and report["workers"] == 2


def test_a_taken_dashboard_port_moves_to_one_the_os_picks_without_a_warning():
    import socket
    import warnings

    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # distributed's "Port ... is already in use" is ours to hide
            client = start_local_cluster(Budget.split("3GB", nworkers=1),
                                         dashboard_address=f"127.0.0.1:{port}")
        try:
            # (others may come on a loaded machine, e.g. "Creating scratch directories is taking
            # a surprisingly long time": not this test's business)
            said = [str(w.message) for w in caught]
            assert not [m for m in said if "already in use" in m], said
            link = client.dashboard_link
            assert link.startswith("http://127.0.0.1:") and f":{port}/" not in link, link
        finally:
            close_client(client)


def test_a_result_behind_workers_paused_for_good_is_a_budget_error_not_a_hang():
    """Memory no task holds (here a held buffer, in predict a loaded model) keeps a worker paused:
    result_unless_paused says so after its patience instead of waiting forever."""
    import pytest
    from distributed import Client, LocalCluster
    from helpers import wait_for

    from daskfeed.cluster._futures import result_unless_paused as result
    from daskfeed.core._exceptions import BudgetError

    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        # ~750 MB written (not just reserved) and kept by the worker process: 80 % < RSS < 95 %
        hold = client.submit(lambda: __import__("builtins").__dict__.setdefault(
            "_daskfeed_test_hold", b"\x01" * 750_000_000) and None, pure=False)
        assert result(hold) is None

        def paused() -> bool:
            workers = client.scheduler_info(n_workers=-1)["workers"].values()
            return all(w.get("status") == "paused" for w in workers)

        wait_for(paused, 60, "the worker to pause at 80 % of its memory limit")
        stuck = client.submit(sum, [1, 2], pure=False)
        with pytest.raises(BudgetError) as err:
            result(stuck, patience=1, what="the sum")
        text = str(err.value)
        assert "Expected the workers to run the sum" in text
        assert "paused for 1s" in text and "(0.93 GiB)" in text and "--memory-limit" in text


def _thread_nice() -> tuple[int, int]:
    """(this thread's nice, the worker process's main thread's) — run as a task on a worker."""
    import os

    return os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, os.getpid())


def test_the_local_workers_run_below_the_trainer_every_thread():
    import os

    import dask.config

    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for nice in (10, 0):
        with dask.config.set({"daskfeed.worker-nice": nice}):  # what the workers are started with
            client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
        try:
            task_thread, main_thread = client.submit(_thread_nice, pure=False).result()
            assert task_thread == main_thread == min(mine + nice, 19), (nice, mine, task_thread,
                                                                       main_thread)
        finally:
            close_client(client)


def test_a_bad_worker_nice_is_refused_before_any_worker_starts():
    import dask.config
    import pytest

    from daskfeed import DaskfeedError
    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import start_local_cluster

    for bad in ("high", -1, 25, 2.5):
        with dask.config.set({"daskfeed.worker-nice": bad}), \
                pytest.raises(DaskfeedError, match=r"whole number from 0 to 19[\s\S]*Received"):
            start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")


def test_local_workers_allocate_arrow_memory_with_the_system_allocator():
    """What a worker frees goes back to the system: pyarrow's mimalloc kept 160 MiB of freed
    pages in a worker's RSS, and a worker of a 2GB budget stayed paused for good."""
    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
    try:
        pools = client.run(lambda: __import__("pyarrow").default_memory_pool().backend_name)
    finally:
        close_client(client)
    assert list(pools.values()) == ["system"]


def test_a_cluster_of_workers_in_this_process_starts_on_loopback():
    """processes=False (predict's and ClusterSpec's option): distributed inferred inproc://,
    which refused the host, so no cluster started. Its scheduler speaks TLS like any other."""
    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    client = start_local_cluster(Budget.split("3GB", nworkers=1), processes=False,
                                 dashboard_address="")
    try:
        assert client.scheduler.address.startswith("tls://127.0.0.1:"), client.scheduler.address
        assert client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
        # they measure this whole process (the caller's memory too): their limit is the budget's
        limits = {w["memory_limit"] for w in client.scheduler_info()["workers"].values()}
        assert limits == {Budget.split("3GB", nworkers=1).total}, limits
    finally:
        close_client(client)


def test_a_spec_parses_its_memory_limit_once_as_it_is_made():
    """``ClusterSpec.total``: the budget in bytes, parsed where the spec is made (train, predict,
    scan and the CLI read it there), made again by ``replace``, never a keyword of ``train``."""
    import dataclasses

    import pytest

    from daskfeed.cluster import ClusterSpec, default_memory_limit
    from daskfeed.core import BudgetError
    from daskfeed.training import TrainOptions

    spec = ClusterSpec.resolve(memory_limit="3GB")
    assert (spec.memory_limit, spec.total) == ("3GB", 3_000_000_000)
    assert dataclasses.replace(spec, memory_limit="2GiB").total == 2 * 2**30
    assert ClusterSpec.resolve().total == default_memory_limit()
    with pytest.raises(BudgetError, match="Expected a memory size such as '14GB'"):
        ClusterSpec.resolve(memory_limit="14GX")
    assert TrainOptions.resolve(label="y", memory_limit="3GB").cluster.total == 3_000_000_000
    with pytest.raises(TypeError, match="total"):
        TrainOptions.resolve(label="y", total=5)



def _heap_setting() -> tuple[bool, int, int]:
    """(whether the worker's preload set malloc's mmap threshold, to what, the limit it keeps
    the heap under) — a task."""
    from daskfeed.cluster import _heap

    return _heap.HEAP_SET, _heap.MMAP_THRESHOLD, _heap._LIMIT


def _touch_and_free(nbytes: int) -> int:
    """Fill ``nbytes`` and free them, ending as a scan task ends; the page faults it took."""
    import resource

    from daskfeed.cluster import trim_heap

    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    filled = b"\x01" * nbytes  # (malloc, then every page written; numpy asks for huge pages)
    del filled
    trim_heap()
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def _trim_above_half() -> bool:
    """Whether a task's end trims the heap where the worker is above half its limit (a task)."""
    from daskfeed.cluster import _heap

    limit = _heap._LIMIT
    _heap._LIMIT = 1  # (every worker is above half of one byte)
    try:
        return _heap.trim_heap()
    finally:
        _heap._LIMIT = limit


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not hasattr(__import__("resource"),
                                                                     "RUSAGE_THREAD"),
                    reason="glibc's malloc; a thread's page faults (Linux)")
def test_the_local_workers_keep_a_tasks_heap_for_the_next_task():
    """The workers' preload sets glibc's mmap threshold (the nanny's MALLOC_TRIM_THRESHOLD_
    alone fixes it at 128 KiB: every column of a parsed block mapped and faulted in anew) and
    keeps what a task freed for the next one while the worker is below half its limit: the
    second task of the same size takes its pages without faulting them in again. Above half
    its limit, a task's end gives the heap back."""
    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
    try:
        limit = next(iter(client.run(lambda dask_worker: dask_worker.memory_manager.memory_limit)
                          .values()))
        assert client.submit(_heap_setting, pure=False).result() == (True, 256 * 2**20, limit)
        pages = 64 * 2**20 // resource_page()
        client.submit(_touch_and_free, 64 * 2**20, pure=False).result()
        again = client.submit(_touch_and_free, 64 * 2**20, pure=False).result()
        assert again < pages // 4, f"{again} page faults for {pages} pages kept from the last task"
        assert client.submit(_trim_above_half, pure=False).result() is True
        trimmed = client.submit(_touch_and_free, 64 * 2**20, pure=False).result()
        assert trimmed > pages // 2, f"{trimmed} page faults for {pages} pages given back"
    finally:
        close_client(client)


def _arenas_after_threads() -> tuple[str | None, int]:
    """(the worker's MALLOC_ARENA_MAX, how many malloc arenas it has once four threads have
    each allocated and ended) — a task. glibc's ``malloc_info`` writes one ``<heap>`` per arena."""
    import ctypes
    import os
    import tempfile
    import threading

    def allocate() -> None:
        held = [bytes(200_000) for _ in range(20)]
        del held

    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "info.xml")
        stream = libc.fopen(path.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        with open(path) as f:
            info = f.read()
    return os.environ.get("MALLOC_ARENA_MAX"), info.count("<heap nr=")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_info")
@pytest.mark.parametrize("configured, expected", [(None, ("1", 1)), ("2", ("2", 2))])
def test_the_local_workers_start_with_one_malloc_arena(configured, expected):
    """The nanny's pre-spawn environment gives the workers one arena from their start (the
    preload's mallopt came after a worker thread's own arena, which a task thread then took:
    every 64 MiB task mapped anew; CI's flake). The trainer's environment stays its own; a
    value the user's config gives stays too (the preload does not set one of its own)."""
    import os

    import dask

    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    before = os.environ.get("MALLOC_ARENA_MAX")
    settings = {} if configured is None else {
        "distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX": configured}
    with dask.config.set(settings):
        client = start_local_cluster(Budget.split("2GB", nworkers=1), dashboard_address="")
    try:
        assert os.environ.get("MALLOC_ARENA_MAX") == before
        assert client.submit(_arenas_after_threads, pure=False).result() == expected
    finally:
        close_client(client)


def _profile_every(dask_worker) -> float:
    """The worker's profile sampling interval, in ms (``client.run``)."""
    return dask_worker.periodic_callbacks["profile"].callback_time


@pytest.mark.parametrize("configured, expected", [(None, 100.0), ("50ms", 50.0)])
def test_the_local_workers_sample_their_profile_every_100ms_unless_configured(configured, expected):
    """distributed samples each worker's stacks every 10 ms (an idle worker's CPU halved at
    100 ms); the dashboard's Profile page keeps its data. A user's interval stays."""
    import dask

    from daskfeed.cluster._budget import Budget
    from daskfeed.cluster._start import close_client, start_local_cluster

    settings = {} if configured is None else {"distributed.worker.profile.interval": configured}
    with dask.config.set(settings):
        client = start_local_cluster(Budget.split("2GB", nworkers=1), dashboard_address="")
        try:
            assert set(client.run(_profile_every).values()) == {expected}
        finally:
            close_client(client)
        assert dask.config.get("distributed.worker.profile.interval") == (configured or "10ms")


def resource_page() -> int:
    """The size of a memory page."""
    import os

    return os.sysconf("SC_PAGE_SIZE")
