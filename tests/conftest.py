"""Shared fixtures: data written by the project's own generator, real LocalClusters."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the parse cache (and anything else under XDG_CACHE_HOME) of this test session, removed at the
# end; subprocesses (the CLI, dask workers) inherit it
_CACHE_HOME = tempfile.mkdtemp(prefix="daskfeed-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME

import pytest  # noqa: E402  (after the environment is set)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_CACHE_HOME, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-slow / make bench)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def buckets_on_disk():
    """The suite's own data are small: the trainer would hold their buckets in memory. In this
    process they are dealt to bucket files, as a data set larger than the trainer's share is;
    tests/batches/test_memory_buckets.py sets it back, and the CLI's tests (subprocesses) run
    the default."""
    import dask.config

    with dask.config.set({"daskfeed.buckets-in-memory": False}):
        yield


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory):
    """Quest logs in the old 1000-row layout (late blanks in gold_spent)."""
    from daskfeed.cli._demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("demo"), rows=40_000, validate_rows=15_000)


@pytest.fixture(scope="session")
def id_data(tmp_path_factory: pytest.TempPathFactory):
    """Small quest logs with a row_id column (files of 700 rows, last one short)."""
    from daskfeed.cli._demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("ids"), rows=13_300, validate_rows=2_000,
                           rows_per_file=700, row_ids=True)


@pytest.fixture(scope="session")
def client():
    """A real LocalCluster with two worker processes on loopback."""
    import dask.config
    from distributed import Client, LocalCluster

    # it idles through most of the session beside the tests that run: no sampling profiler in
    # its workers, no 20 ms event-loop ticks (idle cost 13 % -> 4 % of a core, measured)
    quiet = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "500ms",
             "distributed.admin.system-monitor.interval": "2s"}
    with dask.config.set(quiet):  # read when the cluster starts (workers get it from it)
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0", memory_limit="2GiB")
    with cluster, Client(cluster) as c:
        yield c


def _stop_process_groups(procs) -> None:
    """SIGTERM each process group (last started first), SIGKILL what outlives 20 s."""
    import signal

    for p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def stop_process_groups():
    """``stop_process_groups(procs)``: end real ``dask scheduler`` / ``dask worker`` processes
    started with ``start_new_session=True``, and everything they started."""
    return _stop_process_groups


@pytest.fixture()
def write_csv(tmp_path):
    """Write text files into tmp_path: write_csv("a.csv", "x,y\\n1,2\\n") → path."""

    def write(name: str, text: str | bytes) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, str):
            path.write_text(text, encoding="utf-8")
        else:
            path.write_bytes(text)
        return str(path)

    return write
