"""Shared fixtures: data written by the project's own generator, real LocalClusters."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-slow / make bench)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory):
    """Quest logs in the old 1000-row layout (late blanks in gold_spent)."""
    from daskfeed.demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("demo"), rows=40_000, validate_rows=15_000)


@pytest.fixture(scope="session")
def id_data(tmp_path_factory: pytest.TempPathFactory):
    """Small quest logs with a row_id column (files of 700 rows, last one short)."""
    from daskfeed.demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("ids"), rows=13_300, validate_rows=2_000,
                           rows_per_file=700, row_ids=True)


@pytest.fixture(scope="session")
def client():
    """A real LocalCluster with two worker processes on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", memory_limit="2GiB") as cluster, \
            Client(cluster) as c:
        yield c


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
