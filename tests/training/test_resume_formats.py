"""A checkpoint written before the one resume state (its cursor without a version) still resumes."""

from __future__ import annotations

import json
import shutil

from daskfeed.batches import STATE_VERSION
from daskfeed.checkpoint import CheckpointStore
from daskfeed.training._train import train


def test_a_checkpoint_of_the_cursor_format_resumes_where_it_stood(id_data, tmp_path, client):
    out = tmp_path / "out"
    kw = dict(label="cleared", exclude=["row_id"], batch_size=400, checkpoint_every=10,
              output=out, verbose=0, cache=tmp_path / "cache", scheduler=client.scheduler.address)
    train(id_data.train_glob, echo=lambda s: None, epochs=1, **kw)
    store = CheckpointStore(str(out / "checkpoints"))
    shutil.rmtree(store.latest().path)  # the epoch's end: the one before stands at batch 30
    ckpt = store.latest()
    state_json = f"{ckpt.path}/state.json"
    state = json.loads(open(state_json).read())
    assert state["cursor"]["version"] == STATE_VERSION
    # as the daskfeed before wrote it: dataclasses.asdict of its Cursor, no version
    state["cursor"] = {k: v for k, v in state["cursor"].items() if k != "version"}
    with open(state_json, "w") as f:
        json.dump(state, f)
    assert store.latest().cursor == ckpt.cursor  # read back as the same state
    lines: list[str] = []
    train(id_data.train_glob, echo=lines.append, epochs=1, resume=True, **kw)
    assert any(x.startswith(f"resuming from {ckpt.path}: epoch 1/1 at batch 31/")
               for x in lines), lines
    epoch = json.loads((out / "history.json").read_text())["epochs"][0]
    assert (epoch["resumed_at_batch"], epoch["epoch_rows"]) == (30, id_data.train_rows)
