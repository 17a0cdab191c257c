"""``daskfeed rows`` / ``daskfeed.batch_rows``: a step's rows recomputed from the run's order.

The ground truth is the real run's own log: the kill/resume harness's recording model writes the
row ids of every batch it trains (``tests/killresume.py``). Each row's file and line are checked
against the file itself (its ``row_id`` field on that line), not against daskfeed's reading.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers import RECORDED_FEATURES as FEATURES
from killresume import KillResume

import daskfeed
from daskfeed.batches import GlobalOrder, kept_before
from daskfeed.batches._order import Lanes
from daskfeed.batches._plan import make_order_plan
from daskfeed.core import DaskfeedError, SettingError
from daskfeed.training._order_record import epoch_segments, lane_batches, order_batch, was_skipped

BATCH = 200  # id_data: 13,300 rows -> 67 batches per epoch, the last one of 100 rows


@cache
def _lines(path: str) -> list[dict[str, str]]:
    """Each line of a CSV file as an editor numbers it (index 1 = line 1): its row's fields."""
    text = Path(path).read_text().splitlines()
    header = next(csv.reader([text[0]]))
    return [{}, {}, *({**dict(zip(header, next(csv.reader([t])), strict=True))} if t else {}
                      for t in text[1:])]


def _check_steps(out: Path, steps, per_epoch: int) -> int:
    """Every logged step's rows, in order, are ``batch_rows`` of its epoch and step; each row's
    file and line hold its id. Returns the rows checked."""
    checked = 0
    for s in steps:
        g = s.iteration - s.epoch * per_epoch  # one trainer: the step's batch of the epoch's order
        frame = daskfeed.batch_rows(out, epoch=s.epoch + 1, step=g + 1, show=True)
        assert frame["row_id"].astype("int64").tolist() == s.ids.tolist(), (s.epoch, g)
        for path, line, rid in zip(frame["file"], frame["line"], s.ids, strict=True):
            assert int(_lines(path)[int(line)]["row_id"]) == rid, (path, line, rid)
        assert frame.attrs["batch"] == g + 1 and frame.attrs["world"] == 1
        checked += len(frame)
    return checked


def test_every_step_of_a_run_is_the_rows_it_trained(tmp_path, id_data):
    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2", "--batch-size",
            str(BATCH), "--seed", "3", "--memory-limit", "2GB", "--nworkers", "1",
            "--dashboard-address", "", "--verbose", "0"]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1})
    assert run.start().wait(600) == 0, run.text()[-3000:]
    steps = run.steps()
    per_epoch = -(-id_data.train_rows // BATCH)
    assert len(steps) == 2 * per_epoch
    assert _check_steps(run.output, steps, per_epoch) == 2 * id_data.train_rows
    record = json.loads((run.output / "order.json").read_text())
    stretches = [(s["epoch"], s["position"], s["world"], s["epochs"]) for s in record["stretches"]]
    assert stretches == [(0, 0, 1, 2)]

    # the command: the same rows, as csv and json; a table that names the batch
    cmd = [*KillResume.command(), "rows", str(run.output), "--epoch", "2", "--step", "5"]
    frame = daskfeed.batch_rows(run.output, epoch=2, step=5)
    as_csv = subprocess.run([*cmd, "--format", "csv"], capture_output=True, text=True, check=True)
    assert as_csv.stdout == frame.to_csv(index=False)  # (printed without pandas: the same text)
    rows = list(csv.DictReader(as_csv.stdout.splitlines()))
    assert [(r["file"], int(r["line"])) for r in rows] == list(zip(frame["file"], frame["line"], strict=True))
    plain = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, check=True)
    assert [json.loads(line) for line in plain.stdout.splitlines()] == \
        [json.loads(line) for line in frame.to_json(orient="records", lines=True).splitlines()]
    loaded = subprocess.run(  # from the shell it loads numpy, not pandas, pyarrow, fsspec or dask
        [sys.executable, "-c", "import sys\nfrom daskfeed.cli import main\nsys.argv = ['daskfeed', "
         f"'rows', {str(run.output)!r}, '--epoch', '2', '--step', '5']\ntry:\n    main()\nexcept "
         "SystemExit:\n    pass\nprint([m for m in ('pandas', 'pyarrow', 'fsspec', 'dask', 'keras') "
         "if m in sys.modules])"], capture_output=True, text=True, check=True)
    assert loaded.stdout.splitlines()[-1] == "[]", loaded.stdout[-2000:] + loaded.stderr[-2000:]
    as_json = subprocess.run([*cmd, "--format", "json", "--show"], capture_output=True, text=True, check=True)
    ids = [json.loads(line)["row_id"] for line in as_json.stdout.splitlines()]
    assert ids == steps[per_epoch + 4].ids.tolist()
    several = subprocess.run([*cmd[:-1], "5-6", "--format", "csv"], capture_output=True, text=True,
                             check=True)
    rows = list(csv.DictReader(several.stdout.splitlines()))
    assert [int(r["step"]) for r in rows] == [5] * BATCH + [6] * BATCH
    assert [int(r["line"]) for r in rows[:BATCH]] == frame["line"].tolist()
    table = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert table.startswith(f"epoch 2, batch 5 of the epoch's order ({BATCH} rows; trained by 1 trainer(s)):")

    # the last, short batch; steps the run does not have are refused, naming the range
    assert len(daskfeed.batch_rows(run.output, epoch=1, step=per_epoch)) == id_data.train_rows % BATCH
    trained = rf"Expected a step the run trained in this epoch \(1\.\.{per_epoch}\)"
    with pytest.raises(SettingError, match=trained):
        daskfeed.batch_rows(run.output, epoch=1, step=per_epoch + 1)
    with pytest.raises(SettingError, match=r"Expected an epoch the run trained\. Received: epoch=3"):
        daskfeed.batch_rows(run.output, epoch=3, step=1)
    bad = subprocess.run([*KillResume.command(), "rows", str(tmp_path), "--epoch", "1", "--step", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "Expected a run's order record" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_run_killed_and_resumed_on_another_budget_is_certified_and_every_step_traced(tmp_path, id_data):
    """SIGKILLed mid-epoch (real processes), resumed under another budget: the resume's
    certificate counts the rows trained before the checkpoint and again after it as the run's own
    log does, none lost; every committed step (1,664) is what ``batch_rows`` recomputes."""
    batch = 16  # 832 batches per epoch
    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2", "--batch-size",
            str(batch), "--seed", "4", "--checkpoint-every", "25", "--memory-limit", "3GB",
            "--nworkers", "1", "--dashboard-address", "", "--verbose", "0"]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1}, delay=0.01)
    run.start()
    ckpt = run.kill_at(1, 50)
    first = run.steps()
    k = ckpt.cursor.batch
    text = run.resume(run.relayout(memory_limit="2GB"), timeout=600)
    again = [s for s in first if s.iteration >= ckpt.iterations]  # trained after the checkpoint
    rows = id_data.train_rows
    cert = json.loads((run.output / "history.json").read_text())["resume_certificate"]
    # (the log writes a step before its update: the last one may not have been trained)
    assert cert["again"] in (sum(len(s.ids) for s in again), sum(len(s.ids) for s in again[:-1]))
    assert cert == {"epoch": 2, "rows": rows, "before": k * batch, "again": cert["again"],
                    "left": rows - k * batch, "tail": 0, "skipped": 0, "lost": 0}
    assert (f"resume certificate, epoch 2: of its {rows:,} rows, {k * batch:,} trained before the "
            f"checkpoint, {cert['again']:,} trained again") in text
    assert run.audit() == len(run.committed()) == 2 * -(-rows // batch)
    record = json.loads((run.output / "order.json").read_text())
    assert [(s["epoch"], s["position"], s["world"]) for s in record["stretches"]] == [(0, 0, 1), (1, k, 1)]


def test_skipped_batches_are_left_out_on_every_run_kept_across_a_kill_and_counted(tmp_path, id_data):
    """``--skip-batches`` (real processes): the batches named are never trained, every other row
    once per epoch; a SIGKILLed run resumed on another budget keeps skipping them and adds the
    resume's own (one before its checkpoint: trained already, said, not skipped); every committed
    step is what ``batch_rows`` recomputes; history, summary and certificate count them."""
    batch = 50  # 266 batches per epoch, the last one of 50 rows
    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2", "--batch-size",
            str(batch), "--seed", "5", "--checkpoint-every", "25", "--memory-limit", "3GB",
            "--nworkers", "1", "--dashboard-address", "", "--verbose", "0",
            "--skip-batches", "1:3-5"]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1}, delay=0.01)
    run.start()
    ckpt = run.kill_at(0, 50)
    assert ckpt.cursor.skips == ((0, 2, 4),)  # the resume state keeps them
    later = run.relayout(memory_limit="2GB", skip_batches="1:40,1:200-201,2:100")
    text = run.resume(later, timeout=600)
    assert "--skip-batches 1:40: trained before the checkpoint" in text
    rows = id_data.train_rows
    assert run.audit() == len(run.committed()) == (266 - 5) + (266 - 1)
    assert run.by_epoch(rows, 2) == [(5 * batch, 0, 1), (batch, 0, 1)]  # the skipped rows only
    for epoch, steps in ((1, (3, 4, 5, 200, 201)), (2, (100,))):
        trained = {int(i) for s in run.committed() if s.epoch == epoch - 1 for i in s.ids}
        left_out = daskfeed.batch_rows(run.output, epoch=epoch, step=steps, show=True)
        assert left_out.attrs["skipped_steps"] == list(steps)
        assert not trained & set(left_out["row_id"].astype("int64"))
    history = json.loads((run.output / "history.json").read_text())
    assert history["skip_batches"] == "1:3-5,1:200-201,2:100"
    assert [(e.get("skipped_batches"), e.get("skipped_rows")) for e in history["epochs"]] == \
        [(5, 5 * batch), (1, batch)]
    cert = history["resume_certificate"]
    assert (cert["skipped"], cert["lost"], cert["tail"]) == (5 * batch, 0, 0)
    assert cert["before"] + cert["left"] + cert["skipped"] == rows
    assert (f"skipped (--skip-batches): 5 batches ({5 * batch:,} rows) of epoch 1, 1 batch "
            f"({batch} rows) of epoch 2") in text
    shown = subprocess.run([*KillResume.command(), "rows", str(run.output), "--epoch", "1", "--step",
                            "4"], capture_output=True, text=True, check=True).stdout
    assert "skipped (--skip-batches), never trained: step 4" in shown


def test_epochs_whose_skips_change_their_batches_each_train_all_of_theirs(tmp_path, id_data):
    """Keras fixes the steps per epoch when a fit starts: a run of 3 epochs, the first with 3
    batches skipped, trains 64, 67 and 67 steps (each epoch fitted with its own count), every
    row of epochs 2 and 3 once; an epoch left with no batch is refused before training."""
    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "3", "--batch-size",
            str(BATCH), "--seed", "2", "--memory-limit", "2GB", "--nworkers", "1",
            "--dashboard-address", "", "--verbose", "0", "--skip-batches", "1:2-4"]
    (tmp_path / "run").mkdir()
    run = KillResume(tmp_path / "run", args, features=FEATURES, ids={"row_id": 1})
    run.start().wait(600)
    assert run.procs[0].returncode == 0, run.text()[-3000:]
    per_epoch = -(-id_data.train_rows // BATCH)
    assert [len([s for s in run.steps() if s.epoch == e]) for e in range(3)] == \
        [per_epoch - 3, per_epoch, per_epoch]
    assert run.by_epoch(id_data.train_rows, 3) == [(3 * BATCH, 0, 1), (0, 0, 1), (0, 0, 1)]
    assert run.audit() == 3 * per_epoch - 3
    series = daskfeed.loss_steps(run.output)
    assert series.groupby("epoch").size().tolist() == [per_epoch - 3, per_epoch, per_epoch]
    assert sorted(set(range(1, per_epoch + 1)) - set(series[series["epoch"] == 1]["step"])) == [2, 3, 4]
    done = run.resume()  # at the end already: nothing trains, the skipped batches stay on record
    assert "nothing left to train" in done, done[-3000:]
    assert "skipping (--skip-batches, the checkpoint's and this run's): 1:2-4" in done, done[-3000:]
    assert json.loads((run.output / "history.json").read_text())["skip_batches"] == "1:2-4"

    empty = subprocess.run([*KillResume.command(), *args[:-1], f"2:1-{per_epoch}",
                            "--output", str(tmp_path / "empty")], capture_output=True, text=True)
    assert empty.returncode == 1 and "Expected every epoch to keep a batch" in empty.stderr
    assert "leaves epoch 2 with none" in empty.stderr and "Traceback" not in empty.stderr


def test_skipping_batches_needs_the_global_order(tmp_path, id_data):
    cmd = [*KillResume.command(), "train", id_data.train_glob, "--label", "cleared", "--epochs", "1",
           "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "",
           "--output", str(tmp_path / "out")]
    bad = subprocess.run([*cmd, "--skip-batches", "1:0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Expected epochs and steps from 1" in bad.stderr, bad.stderr
    off = subprocess.run([*cmd, "--skip-batches", "1:2", "--no-cache"], capture_output=True, text=True)
    assert off.returncode == 1 and "Expected batches to skip in the global order" in off.stderr
    assert "the parse cache is off" in off.stderr and "Traceback" not in off.stderr


@pytest.mark.parametrize("held", [False, True], ids=["bucket-files", "held-in-memory"])
def test_a_run_on_data_that_grew_and_the_run_before_it_stay_traceable(tmp_path, id_data,
                                                                      monkeypatch, held):
    """A run on 12 files, then the folder grows by 2 and a fresh run deals the new rows into the
    same 8 buckets (a new generation in the same cache): every step of both runs is traced.
    Also with the buckets held by the trainer (the default for data this small): the rows
    trained are the ones the order names."""
    import shutil

    import killresume

    monkeypatch.setitem(killresume.ENV, "DASK_DASKFEED__BUCKETS_IN_MEMORY", str(held).lower())

    files = sorted(Path(id_data.root).glob("log_quest/**/*.csv"))
    data = tmp_path / "data"
    data.mkdir()
    for f in files[:12]:  # 8,400 rows
        shutil.copy(f, data / f.name)

    def train(name: str) -> KillResume:
        args = ["train", str(data / "*.csv"), "--label", "cleared", "--epochs", "1", "--batch-size",
                "100", "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "",
                "--verbose", "0", "--cache", str(tmp_path / "cache")]
        (tmp_path / name).mkdir()
        run = KillResume(tmp_path / name, args, features=FEATURES, ids={"row_id": 1})
        assert run.start().wait(600) == 0, run.text()[-3000:]
        return run

    before = train("before")
    for f in files[12:14]:  # 9,800 rows: the same number of buckets
        shutil.copy(f, data / f.name)
    after = train("after")
    if held:
        assert "its buckets held in the trainer's memory" in after.text(), after.text()[-2000:]
    else:
        assert "dealt into the 1 generation(s) kept" in after.text(), after.text()[-2000:]
    assert after.audit() == len(after.steps()) == 98
    assert before.audit() == len(before.steps()) == 84


def test_a_changed_file_is_refused_not_guessed(tmp_path, id_data):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(Path(id_data.root) / "log_quest", data)
    args = ["train", str(data / "**" / "*.csv"), "--label", "cleared", "--epochs", "1", "--batch-size",
            str(BATCH), "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "",
            "--verbose", "0", "--cache", str(tmp_path / "cache")]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1})
    assert run.start().wait(600) == 0, run.text()[-3000:]
    frame = daskfeed.batch_rows(run.output, epoch=1, step=1)
    changed = Path(frame["file"][0])
    changed.write_text(changed.read_text() + "\n")
    with pytest.raises(DaskfeedError, match=r"Expected the files the run trained on, unchanged\. "
                                            rf"Received: changed or gone since: {changed}"):
        daskfeed.batch_rows(run.output, epoch=1, step=1)


def test_rows_without_a_label_gzip_files_and_quoted_line_breaks_are_traced(tmp_path):
    """Blocks whose rows are not all labelled (the cache says which), a gzip file (parsed in
    pieces: the cache keeps them), rows over several lines and blank lines (the scan kept their
    lines): every step's rows and lines, by the log of the real run."""
    import gzip

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    rid = 0
    for f in range(12):
        lines = ["row_id,x,note,cleared"]
        for _ in range(400):
            label = "" if rng.random() < 0.1 else str(int(rng.random() < 0.5))
            note = '"two\nlines"' if rng.random() < 0.05 else "plain"
            lines.append(f"{rid},{rng.normal():.4f},{note},{label}")
            if rng.random() < 0.02:
                lines.append("")
            rid += 1
        text = "\n".join(lines) + "\n"
        if f == 0:
            (data / "part-00.csv.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (data / f"part-{f:02d}.csv").write_text(text)
    args = ["train", str(data / "*.csv*"), "--label", "cleared", "--epochs", "1", "--batch-size",
            "64", "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "",
            "--verbose", "0", "--cache", str(tmp_path / "cache"), "--blocksize", "4KiB"]
    run = KillResume(tmp_path, args, features=["row_id", "x"], ids={"row_id": 1})
    assert run.start().wait(600) == 0, run.text()[-3000:]
    steps = run.steps()
    truth, labelled = {}, set()  # row id -> (file, line): a record's first line starts with its id
    for path in sorted(data.iterdir()):
        raw = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        physical = raw.split("\n")
        for n, text in enumerate(physical[1:], 2):
            if text[:1].isdigit():
                truth[int(text.split(",")[0])] = (str(path), n)
                record = text if '"two' not in text else text + physical[n]  # (its second line)
                if not record.endswith(","):
                    labelled.add(int(text.split(",")[0]))
    assert sorted(i for s in steps for i in s.ids.tolist()) == sorted(labelled)  # each once
    for s in steps:
        frame = daskfeed.batch_rows(run.output, epoch=1, step=s.iteration + 1)
        assert [(f, int(li)) for f, li in zip(frame["file"], frame["line"], strict=True)] == \
            [truth[i] for i in s.ids.tolist()], s.iteration


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("position", [0, 1, 5, 6, 7, 23])
def test_a_trainers_batches_of_a_stretch_are_its_lanes(world, position):
    order = GlobalOrder.of([37, 41, 29, 33], seed=1, epoch=0)  # 140 rows: 28 batches of 5
    full = order.rows // 5
    batches = max((full - position % world) // world - position // world, 0) if world > 1 else full - position
    for rank in range(world):
        lanes = Lanes(position % world, world, rank, (full - position % world) // world if world > 1
                      else full, 5)
        first = position // world
        expected = [lanes.global_batch(j) for j in range(first, lanes.batches)]
        assert lane_batches(position, full, world, rank, full) == expected
        assert len(expected) == batches


def test_stretches_of_an_epoch_end_where_the_next_began():
    stretches = [{"epoch": 0, "position": 0, "world": 1}, {"epoch": 1, "position": 30, "world": 2},
                 {"epoch": 1, "position": 20, "world": 3}, {"epoch": 3, "position": 0, "world": 1,
                                                             "epochs": 4}]
    assert epoch_segments(stretches, 0, 67) == [(0, 67, 1, ())]
    assert epoch_segments(stretches, 1, 67) == [(0, 20, 1, ()), (20, 67, 3, ())]  # 20..29 trained again
    assert epoch_segments(stretches, 2, 67) == [(0, 67, 3, ())]
    assert epoch_segments(stretches, 3, 67) == [(0, 67, 1, ())]
    assert epoch_segments(stretches, 4, 67) == []  # the run trained 4 epochs


def test_a_resume_whose_checkpoint_is_in_the_new_layouts_tail_leaves_those_batches_untrained():
    """103 full batches, 1 trainer, checkpoint at 101, resumed by 4: batches 101 and 102 are the
    4 trainers' tail (left out), not batches the first trainer trained."""
    stretches = [{"epoch": 0, "position": 0, "world": 1}, {"epoch": 0, "position": 101, "world": 4,
                                                           "epochs": 2}]
    segments = epoch_segments(stretches, 0, 103)
    assert segments == [(0, 101, 1, ()), (101, 103, 4, ())]
    assert order_batch(segments, 101, None, 103, 103) == (100, 1)
    with pytest.raises(SettingError, match=r"\(1\.\.101\)\. Received: step=102"):
        order_batch(segments, 102, None, 103, 103)
    assert epoch_segments(stretches, 1, 103) == [(0, 103, 4, ())]
    assert order_batch(epoch_segments(stretches, 1, 103), 4, 3, 103, 103) == (15, 4)  # lane 3: 3, 7, 11, 15


def test_the_last_stretch_ends_where_its_run_trained_to():
    """Early stopping, a kill never resumed, a run still training: its mark, not --epochs."""
    stretches = [{"epoch": 0, "position": 0, "world": 1, "epochs": 10}]
    assert epoch_segments(stretches, 2, 67, mark=(2, 50)) == [(0, 50, 1, ())]
    assert epoch_segments(stretches, 3, 67, mark=(2, 50)) == []
    assert epoch_segments(stretches, 9, 67) == [(0, 67, 1, ())]
    resumed = [{"epoch": 0, "position": 0, "world": 1}, {"epoch": 1, "position": 20, "world": 2,
                                                         "epochs": 10}]
    assert epoch_segments(resumed, 1, 67, mark=(1, 10)) == [(0, 20, 1, ()), (20, 67, 2, ())]  # a mark before
    assert epoch_segments(resumed, 5, 67, mark=(1, 10)) == [(0, 67, 2, ())]  # the last stretch: not its


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("position", [0, 4, 9])
def test_a_trainers_batches_leave_the_skipped_out_as_its_lanes_do(world, position):
    """``daskfeed rows --rank``'s lanes are the feed's (Lanes) with batches skipped too."""
    order = GlobalOrder.of([37, 41, 29, 33], seed=1, epoch=0)  # 140 rows: 28 batches of 5
    full, skips = order.rows // 5, ((3, 5), (11, 11), (26, 30))
    plans = [make_order_plan(order, batch_size=5, window_rows=10, shard=(r, world),
                             origin=int(kept_before(skips, position)) % world, skips=skips)
             for r in range(world)]
    first = int(kept_before(skips, position)) // world
    for rank, plan in enumerate(plans):
        expected = [plan.lanes.global_batch(j) for j in range(first, plan.num_batches)]
        assert lane_batches(position, full, world, rank, full, skips) == expected
        assert not {3, 4, 5, 11, 26, 27} & set(expected)
    segments = [(position, full, world, skips)]
    for g in (3, 11):  # a skipped batch is listed (no --rank), and said skipped
        if position <= g:
            assert order_batch(segments, g + 1, None, full, full) == (g, world)
            assert was_skipped(segments, g) and not was_skipped(segments, g + 3)
    assert epoch_segments([{"epoch": 0, "position": 0, "world": world, "epochs": 1,
                       "skips": [[0, 3, 5], [1, 7, 7]]}], 0, full) == [(0, full, world, ((3, 5),))]
