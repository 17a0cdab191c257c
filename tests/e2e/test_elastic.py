"""Elastic, exact resume: killed and resumed many times under another budget, worker count and
number of trainers, every epoch still delivers every row exactly once (audited by row id)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import wait_for

import daskfeed

BATCH = 64


@pytest.fixture
def scalable_client():
    """A LocalCluster of its own (its worker count changes between resumes)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def _ids(batch) -> np.ndarray:
    return np.asarray(batch[0]["row_id"], dtype=np.int64)


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_twenty_kills_and_resumes_in_new_layouts_deliver_each_row_once_per_epoch(
        id_data, scalable_client, tmp_path):
    client = scalable_client
    kw = {"label": "cleared", "batch_size": BATCH, "seed": 11, "features": ["row_id"],
          "cache": tmp_path / "cache", "client": client}
    with daskfeed.DaskSequence(id_data.train_glob, window_rows=2000, **kw) as one:
        manifest = one.manifest
        assert one.global_order

        def reference(epoch):  # the epoch's global order, read by one trainer in one go
            one.set_epoch(epoch)
            return [_ids(one[i]) for i in range(len(one))]

        rng = np.random.default_rng(5)
        epoch, position, resumes = 0, 0, 0
        order = reference(0)
        trained: dict[int, np.ndarray] = {}  # global batch -> its rows, as the trainers got them
        audited = 0
        layouts: set[tuple[int, int, int]] = set()  # (world, workers, window rows) resumed under

        def audit() -> None:  # the epoch's end: every row exactly once, a tail left out
            every = np.concatenate([trained[g] for g in sorted(trained)])
            assert sorted(trained) == list(range(position))
            assert len(every) == len(np.unique(every))
            assert set(every.tolist()) == set(np.concatenate(order[:position]).tolist())
            assert len(order) - position <= 3  # < world full batches and the short one

        while resumes < 20 or audited < 2:
            world = int(rng.integers(1, 4))
            workers = int(rng.integers(1, 4))
            window_rows = int(rng.choice([300, 1000, 4000]))  # budgets of several sizes
            layouts.add((world, workers, window_rows))
            client.cluster.scale(workers)
            wait_for(lambda n=workers: len(client.scheduler_info()["workers"]) == n, 60,
                     f"{workers} workers after scaling")
            ranks = [daskfeed.DaskSequence(id_data.train_glob, window_rows=window_rows,
                                           shard=(r, world), manifest=manifest, **kw)
                     for r in range(world)]
            try:
                for s in ranks:
                    s.set_position(epoch, position)
                if ranks[0].epoch != epoch:  # nothing of the epoch left for this many trainers
                    audit()
                    audited += 1
                    epoch, position, trained = epoch + 1, 0, {}
                    order = reference(epoch)
                assert {s.epoch for s in ranks} == {epoch}
                assert len({len(s) for s in ranks}) == 1  # the ranks step together
                left = len(ranks[0])
                steps = int(rng.integers(1, min(left, 12) + 1))  # killed after a random batch
                for j in range(steps):
                    for r, s in enumerate(ranks):
                        g = position + r + j * world
                        assert g not in trained, (epoch, g)  # never twice
                        trained[g] = _ids(s[j])
                        assert np.array_equal(trained[g], order[g]), (epoch, g, world, window_rows)
                # read on past the checkpoint: trained, then lost with the kill (not counted)
                for s in ranks:
                    if steps < len(s):
                        s[steps]
                new_position = ranks[0].position(ranks[0].start + steps, epoch)
                assert all(s.position(s.start + steps, epoch) == new_position for s in ranks)
                finished = steps == left
            finally:
                for s in ranks:
                    s.close()  # the kill
            resumes += 1
            position = new_position
            if finished:
                audit()
                audited += 1
                epoch, position, trained = epoch + 1, 0, {}
                order = reference(epoch)
        assert resumes >= 20 and audited >= 2
        assert len({w for w, _, _ in layouts}) == 3 and len({n for _, n, _ in layouts}) == 3
        assert len({r for _, _, r in layouts}) == 3 and len(layouts) >= 10
