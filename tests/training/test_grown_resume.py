"""--resume on data that grew: the run goes on with the files it started with; changed ones are refused."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from daskfeed.core import CheckpointError
from daskfeed.training._train import train


def _copy(id_data, dest) -> list[str]:
    os.makedirs(dest, exist_ok=True)
    out = []
    for f in sorted(glob.glob(id_data.train_glob, recursive=True)):
        out.append(shutil.copy(f, os.path.join(dest, os.path.basename(f))))
    return out


def _interrupted(id_data, tmp_path, client):
    """A run of 2 epochs, its last checkpoint removed: resuming starts at epoch 2, batch 30."""
    files = _copy(id_data, tmp_path / "data" / "day1")
    out = tmp_path / "out"
    kw = dict(label="cleared", exclude=["row_id"], batch_size=400, checkpoint_every=10, epochs=2,
              output=out, verbose=0, cache=tmp_path / "cache", scheduler=client.scheduler.address)
    train(str(tmp_path / "data" / "**" / "*.csv"), echo=lambda s: None, **kw)
    shutil.rmtree(out / "checkpoints" / "ckpt-000002-000000000")
    return files, out, kw


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_a_resume_goes_on_with_the_files_it_started_with_and_new_ones_wait(id_data, tmp_path,
                                                                          client):
    files, out, kw = _interrupted(id_data, tmp_path, client)
    started = json.loads((out / "files.json").read_text())["files"]
    assert [row[0] for row in started] == files
    new = str(shutil.copy(files[0], tmp_path / "data" / "day2.csv"))  # a new file since
    lines: list[str] = []
    train(str(tmp_path / "data" / "**" / "*.csv"), echo=lines.append, resume=True, **kw)
    assert (f"resuming on the {len(files)} files the run started with; 1 new file(s) matching "
            "the data join at the next run (without --resume)") in lines, lines
    resumed = json.loads((out / "history.json").read_text())["epochs"][1]
    assert (resumed["resumed_at_batch"], resumed["epoch_rows"]) == (30, 13_300)  # not 14,000
    lines.clear()
    again = {**kw, "epochs": 1, "output": tmp_path / "next"}
    train(str(tmp_path / "data" / "**" / "*.csv"), echo=lines.append, **again)  # the next run
    assert any(x.startswith("scan: 1 new file (") and x.endswith(
        f", 0 changed, 0 gone; {len(files)} unchanged reused") for x in lines), lines
    assert json.loads((tmp_path / "next" / "history.json").read_text())["epochs"][0][
        "epoch_rows"] == 13_300 + 700
    assert [row[0] for row in json.loads((tmp_path / "next" / "files.json").read_text())[
        "files"]][-1] == new


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_a_resume_refuses_files_that_changed_or_went_naming_them(id_data, tmp_path, client):
    files, _, kw = _interrupted(id_data, tmp_path, client)
    with open(files[2], "a", encoding="utf-8") as f:
        f.write(open(files[2], encoding="utf-8").read().splitlines()[1] + "\n")
    os.remove(files[4])
    with pytest.raises(CheckpointError) as err:
        train(str(tmp_path / "data" / "**" / "*.csv"), echo=lambda s: None, resume=True, **kw)
    msg = str(err.value)
    assert f"Expected the {len(files)} files the run started with, unchanged" in msg
    assert f"changed: {files[2]}; gone: {files[4]}." in msg and "Hint:" in msg
