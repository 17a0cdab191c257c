"""Elastic, exact resume: killed and resumed many times under another budget, worker count and
number of trainers, every epoch still delivers every row exactly once (audited by row id)."""

from __future__ import annotations

import json

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


LAYOUTS = [("3GB", "1"), ("2GB", "2"), ("4GB", "2"), ("2GB", "1"), ("3GB", "2")]


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~4 min on 2 cores: a hang fails here, within CI's hour
def test_twenty_sigkills_of_the_cli_at_random_points_each_resumed_in_another_layout(id_data,
                                                                                   tmp_path):
    """Real processes: ``daskfeed train`` SIGKILLed (trainer, cluster and workers at once) 20
    times at random points — at start-up, once the data are scanned, at a new checkpoint, steps
    past one — and each time resumed under another ``--memory-limit`` and ``--nworkers``; every
    row of every epoch trained exactly once by the steps whose updates stand (audited by row id).
    One trainer: no tail is left out (the short last batch is trained)."""
    from helpers import RECORDED_FEATURES
    from killresume import KillResume

    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2", "--batch-size",
            str(BATCH), "--seed", "3", "--checkpoint-every", "5", "--memory-limit", "3GB",
            "--nworkers", "1", "--dashboard-address", "", "--verbose", "0"]
    run = KillResume(tmp_path, args, features=RECORDED_FEATURES, ids={"row_id": 1}, delay=0.02)
    steps = -(-id_data.train_rows // BATCH)  # per epoch
    rng = np.random.default_rng(20)
    layout, kinds = 0, []
    run.start()
    for _ in range(20):
        left = 2 * steps - (run.cuts[-1] if run.cuts else 0)  # steps this run would train
        kind = str(rng.choice(["start-up", "scanned", "checkpoint", "steps"],
                              p=[0.15, 0.15, 0.2, 0.5] if left > 30 else [0.5, 0.5, 0, 0]))
        n = len(run.runs)
        print(f"kill {len(kinds) + 1}: {kind} (run {n}, {len(run.steps())} steps logged)", flush=True)
        if kind == "start-up":  # its first line: the budget, before any cluster or scan
            run.kill_when(lambda n=n: "memory limit:" in run.text(n - 1), "the first line")
        elif kind == "scanned":  # the data's line: cluster up, data scanned (or the scan reused)
            run.kill_when(lambda n=n: "train data:" in run.text(n - 1), "the data's line")
        else:
            want = 0 if kind == "checkpoint" else min(int(rng.integers(20, 100)), left - 15)
            run.kill_when(lambda want=want: run.past_a_new_checkpoint(want),
                          lambda want=want: f"a new checkpoint and {want} steps trained "
                          f"({run.store().names()[-3:]}, {run.trained()} steps)")
        kinds.append(kind)
        layout = (layout + 1 + int(rng.integers(0, len(LAYOUTS) - 1))) % len(LAYOUTS)
        memory, workers = LAYOUTS[layout]
        again = [*run.relayout(memory_limit=memory, nworkers=workers), "--resume"]
        if len(kinds) < 20:
            run.start(again)
    text = run.resume(again[:-1], timeout=600)
    assert f"memory limit: {memory} = " in text and f"{workers} worker" in text, text[:300]
    counts = run.epochs(id_data.train_rows, steps, 2)
    print(f"\n20 SIGKILLs ({', '.join(f'{k}: {kinds.count(k)}' for k in sorted(set(kinds)))}); "
          f"resumed at iterations {run.cuts}; per epoch (lost, duplicated): {counts}")
    assert len(run.committed()) == 2 * steps
    assert counts == [(0, 0), (0, 0)]
    assert len(set(run.cuts)) >= 8 and max(run.cuts) > steps  # spread over both epochs


@pytest.mark.slow
@pytest.mark.timeout(1000)  # ~5 min on 2 cores
def test_sigkilled_ranks_resumed_by_another_number_of_trainers_train_each_row_once(
        id_data, tmp_path, stop_process_groups):
    """Real `dask scheduler`/`dask worker` processes and `daskfeed train` ranks: the whole job
    SIGKILLed 10 times at random points (at start-up, once the data are scanned, steps past a new
    checkpoint) and each time resumed by another number of trainers (1, 2 or 3) than the job
    before and than rank 0's checkpoint (every rank goes on from it), under another
    ``--memory-limit``; every row of every epoch trained once by the steps whose updates stand,
    audited by row id, but the batches ``--skip-batches`` names, which every job and rank leaves
    out alike. The tail policy: a job of several trainers trains full batches only,
    dealt evenly, and leaves out fewer than its number of them (and the short batch); a single
    trainer leaves out nothing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers import RECORDED_FEATURES, compose_commands, wait_for_scheduler_file
    from killresume import ENV, KillResume

    bin_dir = Path(sys.executable).parent
    sf = str(tmp_path / "scheduler.json")
    sched_cmd, worker_cmd, tls = compose_commands(sf)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": ENV,
             "start_new_session": True}
    procs = [subprocess.Popen([str(bin_dir / "dask"), *sched_cmd[1:]], **quiet)]
    run = None
    try:
        wait_for_scheduler_file(sf, procs[0])
        procs += [subprocess.Popen([str(bin_dir / "dask"), *worker_cmd[1:]], **quiet)
                  for _ in range(2)]
        args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2",
                "--batch-size", str(BATCH), "--seed", "5", "--checkpoint-every", "5",
                "--memory-limit", "2GB", "--scheduler-file", sf, *tls,
                "--cache", str(tmp_path / "cache"), "--verbose", "0",
                "--skip-batches", "1:7-9,2:30"]  # left out by every job and rank alike
        skipped = [3 * BATCH, BATCH]  # rows of each epoch's skipped batches
        work = tmp_path / "job"
        os.makedirs(work)
        run = KillResume(work, args, features=RECORDED_FEATURES, ids={"row_id": 1}, delay=0.03)
        rows, full = id_data.train_rows, id_data.train_rows // BATCH
        rng = np.random.default_rng(8)
        world, kinds, worlds, at = 2, [], [2], []
        run.start(world=world)
        for k in range(10):
            ckpt = run.checkpoint
            done = (ckpt.cursor.epoch * full + (ckpt.cursor.position or 0)) if ckpt else 0
            left = (2 * full - done) // world  # batches each rank of this job would train
            kind = str(rng.choice(["start-up", "scanned", "steps"],
                                  p=[0.15, 0.15, 0.7] if left > 40 else [0.5, 0.5, 0]))
            n = len(run.runs)
            print(f"kill {k + 1}: {kind} ({world} trainer(s), {left} batches each left)", flush=True)
            if kind == "start-up":  # connected to the scheduler: the trainer's budget
                run.kill_when(lambda n=n: "memory limit of this trainer" in run.text(n - 1),
                              "the budget's line")
            elif kind == "scanned":
                run.kill_when(lambda n=n: "train data:" in run.text(n - 1), "the data's line")
            else:
                want = int(rng.integers(10, min(60, left - 10)))
                run.kill_when(lambda want=want: run.past_a_new_checkpoint(want),
                              lambda want=want: f"rank 0 past a new checkpoint and {want} steps "
                              f"({run.store().names()[-3:]}, {run.trained()} steps)")
            kinds.append(kind)
            at.append(run.checkpoint.cursor.epoch if run.checkpoint else 0)
            # another number of trainers than the job before and than the checkpoint's (with
            # the checkpoint's, each rank would go on from its own: another audit); the last
            # job of several trainers if it can be (an epoch's end with a tail left out)
            written = run.checkpoint.cursor.shard[1] if run.checkpoint else None
            choices = [w for w in (1, 2, 3) if w not in (world, written)]
            world = int(rng.choice([w for w in choices if w > 1] if k == 9 and max(choices) > 1
                                   else choices))
            worlds.append(world)
            memory = str(rng.choice(["2GB", "3GB"]))
            again = [*run.relayout(memory_limit=memory), "--resume"]
            if k < 9:
                run.start(again, world=world)
        text = run.resume(again[:-1], timeout=900, world=world)
        assert f"memory limit of this trainer process {memory}" in text, text[:600]
        # the last job's certificate: the interrupted epoch's rows, each counted once, none lost
        cert = json.loads((run.output / "history.json").read_text())["resume_certificate"]
        if cert is not None:  # (None: the job resumed at the run's end, nothing to train)
            assert cert["lost"] == 0 and cert["rows"] == rows, cert
            assert cert["before"] + cert["left"] + cert["tail"] + cert["skipped"] == rows, cert
            assert cert["skipped"] == skipped[cert["epoch"] - 1], cert
        counts = run.by_epoch(rows, 2)
        audited = run.audit()  # each rank's steps, recomputed by `daskfeed rows --rank`
        print(f"\n{audited} committed steps audited against daskfeed rows")
        print(f"\n10 SIGKILLs ({', '.join(f'{k}: {kinds.count(k)}' for k in sorted(set(kinds)))}); "
              f"trainers per job {worlds}; resumed at iterations {run.cuts} (epochs {at}); per "
              f"epoch (lost, duplicated, trainers at its end): {counts}")
        assert {1, 2, 3} <= set(worlds) and kinds.count("steps") >= 4 and 1 in at
        assert any(trainers > 1 for _, _, trainers in counts)  # (the tail policy of several met)
        for (lost, duplicated, trainers), left_out in zip(counts, skipped, strict=True):
            assert duplicated == 0
            lost -= left_out  # (the audit: no step trained a skipped batch's rows)
            if trainers == 1:
                assert lost == 0
            else:  # full batches only, fewer than `trainers` of them left out, and the short one
                assert (rows - lost) % BATCH == 0 and lost <= (trainers - 1) * BATCH + rows % BATCH
    finally:
        stop_process_groups(procs + (run.procs if run is not None else []))
