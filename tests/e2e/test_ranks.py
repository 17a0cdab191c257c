"""Several trainers: rank resolution, equal shards, one scan, 3 trainer processes on one cluster."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import daskfeed
from daskfeed.batches._plan import equal_shard_batches, make_plan, shard_rows
from daskfeed.core._exceptions import SettingError
from daskfeed.training._ranks import Rank, resolve_rank, shard_line

BIN = pathlib.Path(sys.executable).parent


# ------------------------------------------------------------------ where the rank comes from
def test_rank_from_flags_then_tf_config_then_rank_world_size():
    tf_config = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]},
                            "task": {"type": "worker", "index": 1}})
    env = {"TF_CONFIG": tf_config, "RANK": "0", "WORLD_SIZE": "5"}
    assert resolve_rank(1, 2, env) == Rank(1, 2, "--rank/--world-size")
    assert resolve_rank(None, None, env) == Rank(2, 3, "TF_CONFIG")  # chief 0, workers 1, 2
    no_chief = json.dumps({"cluster": {"worker": ["b:1", "c:1"]}, "task": {"type": "worker",
                                                                           "index": 0}})
    assert resolve_rank(None, None, {"TF_CONFIG": no_chief}) == Rank(0, 2, "TF_CONFIG")
    assert resolve_rank(None, None, {"RANK": "3", "WORLD_SIZE": "4"}) == Rank(3, 4, "RANK/WORLD_SIZE")
    assert resolve_rank(None, None, {}) == Rank(0, 1, "default")
    assert not Rank().several and Rank(0, 2).shard == (0, 2)


@pytest.mark.parametrize("args, env, message", [
    ((1, None), {}, r"Expected both a rank and a world size.*Received: rank=1, world_size=None"),
    ((3, 3), {}, r"Expected 0 <= rank < world_size. Received: rank=3, world_size=3"),
    ((None, None), {"TF_CONFIG": "{not json"}, r"Expected TF_CONFIG as tf.distribute writes it"),
    ((None, None), {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a"], "ps": ["b"]},
                                             "task": {"type": "ps", "index": 0}})},
     r"Expected a TF_CONFIG task of type 'chief' or 'worker'.*Received: task type 'ps'"),
    ((None, None), {"RANK": "one", "WORLD_SIZE": "2"}, r"Expected integers in RANK and WORLD_SIZE"),
])
def test_rank_errors_say_what_and_how(args, env, message):
    with pytest.raises(SettingError, match=message) as err:
        resolve_rank(*args, env)
    assert "\nHint: " in str(err.value)


# ------------------------------------------------------------------ the plan of each rank
@pytest.mark.parametrize("seed", range(5))
def test_equal_batches_disjoint_shards_union_is_the_epoch(seed):
    rng = np.random.default_rng(seed)
    counts = [int(c) for c in rng.integers(0, 900, size=int(rng.integers(6, 40)))]
    world, batch = int(rng.integers(2, 5)), int(rng.integers(16, 200))
    equal = equal_shard_batches(counts, batch_size=batch, nshards=world)
    assert equal == min(r // batch for r in shard_rows(counts, world))
    seen: set[int] = set()
    dropped = 0
    for epoch in range(2):
        seen, dropped = set(), 0
        for r in range(world):
            plan = make_plan(counts, batch_size=batch, epoch=epoch, seed=seed, shard=(r, world),
                             window_rows=500, max_batches=equal)
            assert plan.num_batches == equal and plan.rows == equal * batch
            assert all(plan.batch_rows(i) == batch for i in range(plan.num_batches))
            parts = {p for w in plan.windows for p in w.blocks}
            assert not parts & seen  # disjoint shards
            seen |= parts
            assert plan.rows + plan.dropped == shard_rows(counts, world)[r]
            dropped += plan.dropped
        assert dropped == sum(counts) - world * equal * batch
    # the windows left out are planned for no batch (their rows are counted, not read)
    assert seen <= {p for p, n in enumerate(counts) if n > 0}


def test_sequences_of_three_ranks_serve_disjoint_rows(id_data, client):
    """Real DaskSequences without the parse cache: shards of blocks, every row at most once."""
    base = daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client, batch_size=256,
                                 window_rows=1500, seed=3, shard=(0, 3), cache=False)
    seqs = [base] + [daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client,
                                           batch_size=256, window_rows=1500, seed=3, shard=(r, 3),
                                           manifest=base.manifest, cache=False) for r in (1, 2)]
    try:
        assert len({len(s) for s in seqs}) == 1  # 4,900 / 4,200 / 4,200 rows → 16 batches each
        assert len(seqs[0]) == 4200 // 256
        for epoch in range(2):
            ids = []
            for s in seqs:
                s.set_epoch(epoch)
                ids.append(np.concatenate([s[i][0]["row_id"].astype(np.int64)
                                           for i in range(len(s))]))
            every = np.concatenate(ids)
            assert len(every) == len(np.unique(every)) == 3 * len(seqs[0]) * 256
            dropped = sum(s.plan.dropped for s in seqs)
            assert len(every) + dropped == id_data.train_rows
            assert [s.epoch_stats()["dropped_rows"] for s in seqs] == [4900 - 4096, 104, 104]
            shard_of = (every // 700) % 3  # files of 700 rows, one partition each
            owner = np.repeat(np.arange(3), [len(i) for i in ids])
            assert np.array_equal(shard_of, owner)
            if epoch == 0:
                first = set(every.tolist())
        assert set(every.tolist()) != first  # another epoch leaves other rows out
        line = shard_line(Rank(1, 3, "--rank/--world-size"), seqs[1])
        assert line.startswith("rank 1 of 3 (from --rank/--world-size): blocks b % 3 == 1, "
                               "4,200 rows; 16 batches of 256 per epoch on every rank"), line
        assert "104 rows of this shard left out per epoch" in line, line
    finally:
        for s in seqs:
            s.close()


# ------------------------------------------------------------------ 3 trainers, one cluster
@pytest.fixture(scope="module")
def rank_data(tmp_path_factory):
    from daskfeed.cli._demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("ranks"), rows=12_000, validate_rows=2000)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "RANK", "WORLD_SIZE")}
    return {**env, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


@pytest.mark.slow  # four processes, three trainers; test_sequences_of_three_ranks_... stays fast
@pytest.mark.timeout(900)
def test_ranks_in_the_global_order_take_every_world_th_batch_and_resume_under_another_world(
        id_data, client):
    """With the parse cache: rank r's batch j is the single trainer's batch r + j * world, and a
    position reached by 3 ranks is continued by 2 ranks: each row exactly once per epoch."""
    kw = {"label": "cleared", "client": client, "batch_size": 256, "seed": 3, "features": ["row_id"]}
    with daskfeed.DaskSequence(id_data.train_glob, window_rows=3000, **kw) as one:
        assert one.global_order
        alone = [one[i][0]["row_id"].astype(np.int64) for i in range(len(one))]
        manifest = one.manifest

    def ranks(world, window_rows):
        return [daskfeed.DaskSequence(id_data.train_glob, window_rows=window_rows, shard=(r, world),
                                      manifest=manifest, **kw) for r in range(world)]

    three = ranks(3, 1000)
    try:
        assert [len(s) for s in three] == [13300 // 256 // 3] * 3  # 51 full batches: 17 each
        for r, s in enumerate(three):
            for j in range(len(s)):
                assert np.array_equal(s[j][0]["row_id"], alone[r + 3 * j]), (r, j)
        assert all(s.plan.dropped == 13300 - 51 * 256 for s in three)
        line = shard_line(Rank(1, 3, "--rank/--world-size"), three[1])
        assert line.startswith("rank 1 of 3 (from --rank/--world-size): batches 1, 4, 7, ... of "
                               "each epoch's global order; 17 batches of 256"), line
        position = three[0].position(5)  # every rank trained 5 batches: 15 of the order
        assert position == 15
    finally:
        for s in three:
            s.close()
    two = ranks(2, 5000)  # another world size and window size
    try:
        trained = [alone[g] for g in range(15)]
        for r, s in enumerate(two):
            s.set_position(0, position)
            assert len(s) == (51 - 15) // 2
            for j in range(len(s)):
                assert np.array_equal(s[j][0]["row_id"], alone[position + r + 2 * j]), (r, j)
                trained.append(s[j][0]["row_id"])
        every = np.concatenate(trained)
        assert len(every) == len(np.unique(every)) == 51 * 256
        assert set(every.tolist()) == set(np.concatenate(alone[:51]).tolist())
    finally:
        for s in two:
            s.close()


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_three_trainers_one_scheduler_one_scan(rank_data, tmp_path, stop_process_groups):
    from helpers import compose_commands, wait_for_scheduler_file

    sf = str(tmp_path / "scheduler.json")
    sched_cmd, worker_cmd, tls = compose_commands(sf)
    dask = str(BIN / "dask")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([dask, *sched_cmd[1:]], env=_env(), start_new_session=True, **quiet)]
    try:
        wait_for_scheduler_file(sf, procs[0])
        procs += [subprocess.Popen([dask, *worker_cmd[1:]], env=_env(), start_new_session=True,
                                   **quiet) for _ in range(2)]
        out = tmp_path / "out"
        common = [str(BIN / "daskfeed"), "train", rank_data.train_glob, "--label", "cleared",
                  "--validation", rank_data.validate_glob, "--epochs", "1", "--batch-size", "256",
                  "--scheduler-file", sf, "--memory-limit", "2GB", "--output", str(out),
                  "--cache", str(tmp_path / "cache"), "--verbose", "0", *tls]
        tf_config = json.dumps({"cluster": {"worker": ["h0:1", "h1:1", "h2:1"]},
                                "task": {"type": "worker", "index": 1}})
        how = [(["--rank", "0", "--world-size", "3"], {}),  # the three ways to say the rank
               ([], {"TF_CONFIG": tf_config}),
               ([], {"RANK": "2", "WORLD_SIZE": "3"})]
        runs = [subprocess.Popen(common + flags, env=_env(**env), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
                for flags, env in how]
        procs += runs
        outputs = [r.communicate(timeout=800) for r in runs]
        for r, (stdout, stderr) in zip(runs, outputs, strict=True):
            assert r.returncode == 0, stdout[-2000:] + stderr[-3000:]
        texts = [o[0] for o in outputs]
        origins = ["--rank/--world-size", "TF_CONFIG", "RANK/WORLD_SIZE"]
        for rank, (text, origin) in enumerate(zip(texts, origins, strict=True)):
            assert f"trainer rank {rank} of 3 (from {origin})" in text, text
        scanned = [t for t in texts if re.search(r"train data: .*\(scanned in", t)]
        assert len(scanned) == 1, texts  # ONE scan for the three ranks
        assert sum("(manifest reused)" in t for t in texts) == 2

        dirs = [out, out / "rank-1", out / "rank-2"]
        hists = [json.loads((d / "history.json").read_text()) for d in dirs]
        ranks = [h["ranks"] for h in hists]
        assert [r["rank"] for r in ranks] == [0, 1, 2]
        batches = {r["batches_per_epoch"] for r in ranks}
        assert batches == {12_000 // 256 // 3}  # every 3rd of the global order's 46 full batches
        for h, r in zip(hists, ranks, strict=True):
            assert h["epochs"][0]["rows"] == r["rows_per_epoch"] == 15 * 256
            assert r["dropped_rows_per_epoch"] == 12_000 - 3 * 15 * 256 == 480  # by all ranks
            assert h["epochs"][0]["val_accuracy"] > 0.6
        fingerprints = {json.loads((d / "manifest.json").read_text())["fingerprint"] for d in dirs}
        assert len(fingerprints) == 1
        for text in texts:
            assert "of each epoch's global order" in text and "480 rows of the epoch left out" in text
    finally:
        stop_process_groups(procs)


@pytest.mark.slow
def test_three_trainers_killed_then_resumed_by_two_train_each_row_once(id_data, tmp_path,
                                                                        stop_process_groups):
    """Real `dask scheduler`/`dask worker` processes and `daskfeed train` ranks (the kill/resume
    harness): 3 trainers killed in epoch 1 once rank 0 checkpointed at its batch 8+ (it stands,
    the others train up to its checkpoint, then all die), resumed by 2 from rank 0's checkpoint;
    audited by row id."""
    from helpers import RECORDED_FEATURES, compose_commands, wait_for_scheduler_file
    from killresume import KillResume

    batch = 200
    sf = str(tmp_path / "scheduler.json")
    sched_cmd, worker_cmd, tls = compose_commands(sf)
    dask = str(BIN / "dask")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([dask, *sched_cmd[1:]], env=_env(), start_new_session=True, **quiet)]
    run = None
    try:
        wait_for_scheduler_file(sf, procs[0])
        procs += [subprocess.Popen([dask, *worker_cmd[1:]], env=_env(), start_new_session=True,
                                   **quiet) for _ in range(2)]
        args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2",
                "--batch-size", str(batch), "--seed", "4", "--checkpoint-every", "4",
                "--scheduler-file", sf, "--memory-limit", "2GB", "--cache", str(tmp_path / "cache"),
                "--verbose", "0", *tls]
        (tmp_path / "job").mkdir()
        run = KillResume(tmp_path / "job", args, features=RECORDED_FEATURES, ids={"row_id": 1},
                         delay=0.3)
        run.start(world=3)

        def checkpointed() -> bool:  # rank 0 checkpointed at its batch 8+ of epoch 0
            latest = run.newest()
            return latest is not None and latest.cursor.epoch == 0 and latest.cursor.batch >= 8

        ckpt = run.kill_when(checkpointed, lambda: f"rank 0 checkpointed at batch 8+ of epoch 1 "
                             f"({run.store().names()}, {len(run.steps())} steps logged)", 400)
        position, k = ckpt.cursor.position, ckpt.cursor.batch
        assert ckpt.cursor.shard == (0, 3) and position == 3 * k
        run.resume(timeout=400, world=2)
        for r in range(2):
            text = (run.workdir / f"run2-r{r}.txt").read_text()
            assert (f"the run had 3 trainer(s), now 2: every rank resumes from rank 0's checkpoint "
                    f"{ckpt.path}, at batch {position + 1} of epoch 1's global order") in text, \
                text[-2000:]
        rows = id_data.train_rows
        full, short = rows // batch, rows % batch  # 66 full batches and a short one
        counts = run.by_epoch(rows, 2)
        # the 2 trainers deal the rest of each epoch's full batches evenly: < 2 and the short
        # one left out
        assert counts == [(((full - position) % 2) * batch + short, 0, 2),
                          ((full % 2) * batch + short, 0, 2)], counts
    finally:
        stop_process_groups(procs + (run.procs if run is not None else []))


def test_several_trainers_need_a_shared_scheduler(tmp_path, rank_data):
    from daskfeed.training._train import train

    with pytest.raises(SettingError, match=r"Expected one Dask cluster shared by the trainers.*"
                                          r"Received: rank 1 of 2 \(from --rank/--world-size\)"):
        train(rank_data.train_glob, label="cleared", rank=1, world_size=2, output=tmp_path)
