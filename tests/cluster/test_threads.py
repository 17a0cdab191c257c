"""The cores a model in the trainer computes on beside its own LocalCluster's workers."""

from __future__ import annotations

import os

import pytest

SPAWN = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_")


def _worker_env(client) -> set[tuple[str | None, ...]]:
    return set(client.run(lambda: tuple(os.environ.get(n) for n in SPAWN)).values())


def test_the_trainer_keeps_its_environment_and_computes_on_the_cores_the_workers_leave(
        monkeypatch) -> None:
    """distributed's nannies set OMP_NUM_THREADS=1 (and the rest of their pre-spawn environment)
    in the process that starts them: torch imported after the cluster took one thread, before
    it every core. The workers keep theirs; the trainer gets its own back."""
    from dask.system import CPU_COUNT

    from daskfeed.cluster import Budget, close_client, start_local_cluster, trainer_threads

    for name in SPAWN:
        monkeypatch.delenv(name, raising=False)
    client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
    try:
        assert {n: os.environ.get(n) for n in SPAWN} == dict.fromkeys(SPAWN)
        (omp, mkl, blas, trim), = _worker_env(client)
        assert (omp, mkl, blas) == ("1", "1", "1") and trim  # the workers' own, as distributed sets
        threads, why = trainer_threads(client)
        assert threads == max(1, CPU_COUNT - 1)
        assert f"the {CPU_COUNT} core(s) the local cluster's 1 worker thread(s) leave" in why
    finally:
        close_client(client)


def test_omp_num_threads_set_by_the_user_is_the_trainers_and_the_workers(monkeypatch) -> None:
    from daskfeed.cluster import Budget, close_client, start_local_cluster, trainer_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
    try:
        assert os.environ["OMP_NUM_THREADS"] == "3"
        assert {env[0] for env in _worker_env(client)} == {"3"}
        assert trainer_threads(client) == (3, "OMP_NUM_THREADS=3")
    finally:
        close_client(client)


@pytest.mark.parametrize("value", ["0", "two", ""])
def test_an_omp_num_threads_that_is_no_count_leaves_the_rule_to_the_cores(monkeypatch,
                                                                          value) -> None:
    from dask.system import CPU_COUNT

    from daskfeed.cluster import Budget, close_client, start_local_cluster, trainer_threads

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    client = start_local_cluster(Budget.split("3GB", nworkers=1), processes=False,
                                 dashboard_address="")
    try:
        assert os.environ["OMP_NUM_THREADS"] == value
        assert trainer_threads(client)[0] == max(1, CPU_COUNT - 1)
    finally:
        close_client(client)


def test_a_cluster_not_started_by_daskfeed_leaves_the_threads_to_its_owner() -> None:
    from distributed import Client, LocalCluster

    from daskfeed.cluster import trainer_threads

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert trainer_threads(client) is None
