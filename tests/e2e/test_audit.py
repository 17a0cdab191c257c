"""Every batch traceable, at length: over 100,000 steps of a real run, killed and resumed under
another budget, each committed step's rows are what ``daskfeed rows`` recomputes (the
kill/resume harness's audit: the ids read from the data files at the lines it names).

In the slow tier (``make test-slow``): 6 min 8 s on 2 busy cores (Keras' steps in groups of 32:
~3 ms a step, half the time of one by one; the audit 0.8 ms a step, tracing a trainer's lanes
once per epoch), measured with 103,075 steps audited, 0 mismatches."""

from __future__ import annotations

import json

import pytest
from helpers import RECORDED_FEATURES as FEATURES
from killresume import KillResume

BATCH = 4  # id_data: 13,300 rows -> 3,325 steps an epoch
EPOCHS = 31  # 103,075 steps


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~6 min on 2 busy cores: a hang fails here, within CI's hour
def test_a_hundred_thousand_steps_killed_and_resumed_are_each_traced(id_data, tmp_path):
    per_epoch = -(-id_data.train_rows // BATCH)
    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", str(EPOCHS),
            "--batch-size", str(BATCH), "--seed", "9", "--checkpoint-every", "500",
            "--memory-limit", "3GB", "--nworkers", "1", "--dashboard-address", "", "--verbose", "0"]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1},
                     steps_per_execution=32)  # (Keras' calls in groups: half the time a step)
    run.start()
    ckpt = run.kill_at(EPOCHS // 2, 1000, timeout=600)
    first = run.steps()
    run.resume(run.relayout(memory_limit="2GB"), timeout=600)
    audited = run.audit()
    assert audited == len(run.committed()) == EPOCHS * per_epoch >= 100_000
    again = [s for s in first if s.iteration >= ckpt.iterations]
    cert = json.loads((run.output / "history.json").read_text())["resume_certificate"]
    # (the mark is rewritten as each group of 32 steps ends: the log may hold a group's steps more)
    logged = sum(len(s.ids) for s in again)
    assert logged - 32 * BATCH <= cert["again"] <= logged and cert["again"] % BATCH == 0
    assert cert["lost"] == 0 and cert["before"] == ckpt.cursor.batch * BATCH
    print(f"\n{audited:,} steps audited against daskfeed rows, 0 mismatches; killed in epoch "
          f"{EPOCHS // 2 + 1} at batch {len(first) - EPOCHS // 2 * per_epoch:,} (checkpoint at "
          f"{ckpt.cursor.batch:,}); certificate {cert}")
