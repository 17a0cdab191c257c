"""Spikes to rows: each step's loss recovered from Keras' running mean, kept, flagged, traced.

The loss recovery against Keras' own float32 running mean (a property), the rule on series
whose spikes are known, the callback in a real Keras ``fit`` whose batch losses are known (a
learning rate of 0: every batch's loss is the model's loss on it), and a real ``daskfeed train``
on data with a few corrupted labels, whose flagged steps' ``daskfeed rows`` name those rows.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from killresume import KillResume

import daskfeed
from daskfeed.core import DataNotFoundError
from daskfeed.training._loss_series import RECORD, SpikeDetector, SpikeRule, rows_command, step_losses
from daskfeed.training._spikes import StepLosses


def keras_running_means(losses, rows) -> list[float]:
    """The running means Keras reports: its ``Mean`` metric's float32 total and count."""
    total, count, out = np.float32(0), np.float32(0), []
    for loss, n in zip(losses, rows, strict=True):
        total = np.float32(total + np.float32(loss) * np.float32(n))
        count = np.float32(count + np.float32(n))
        out.append(float(np.float32(total / count)))
    return out


def test_each_steps_loss_comes_back_from_the_running_means():
    losses, rows = [0.7, 0.6, 5.0, 0.5, 0.4], [32, 32, 32, 32, 8]  # the last batch short
    got = step_losses(keras_running_means(losses, rows), rows)
    assert np.allclose(got, losses, rtol=0, atol=1e-5), got


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 50.0), st.integers(1, 1024)), min_size=1, max_size=400))
def test_the_recovered_loss_is_within_the_documented_precision(steps):
    """About ``1e-7 * loss * i`` (the float32 total's rounding over one batch's rows): bounded
    here by the float32 epsilon of the running sum at step i over the batch's rows, times 4."""
    losses, rows = zip(*steps, strict=True)
    got = step_losses(keras_running_means(losses, rows), rows)
    sums = np.cumsum(np.float64(losses) * np.float64(rows))
    bound = 4 * np.finfo(np.float32).eps * np.maximum(sums, np.roll(sums, 1)) / np.float64(rows) + 1e-6
    assert np.all(np.abs(got - np.float64(np.float32(losses))) <= bound)


def test_no_step_is_flagged_before_the_neighbourhood_is_there():
    rule = SpikeRule()
    quiet = list(0.6 + 0.02 * np.sin(np.arange(40)))
    series = [*quiet[:5], 40.0, *quiet[5:]]  # a spike at step 6: no neighbourhood yet
    assert not rule.flags(series).any()
    series = [*quiet[:30], 40.0, *quiet[30:]]
    assert np.flatnonzero(rule.flags(series)).tolist() == [30]


def test_a_spike_is_flagged_and_its_aftermath_is_not():
    rng = np.random.default_rng(0)
    base = 0.01 * np.exp(rng.normal(0, 0.3, 200))
    series = base.copy()
    series[100] = 15.0  # a corrupted row's batch
    series[101:110] *= 4  # the update that spike made lifts the next steps' loss
    series[150] = series[151] = 14.0  # two spikes of a like size, side by side: both
    flagged = np.flatnonzero(SpikeRule().flags(series)).tolist()
    assert flagged == [100, 150, 151]
    # without the aftermath rule the lifted steps would be flagged too (they are far above)
    assert len(np.flatnonzero(SpikeRule(after=0).flags(series))) > 3


def test_a_flat_loss_is_not_flagged_at_every_wobble_and_the_first_nan_is():
    series = [1.0] * 40 + [1.01, 1.0, 1.1, float("nan"), float("nan"), 1.0]
    flagged = np.flatnonzero(SpikeRule().flags(series)).tolist()
    assert flagged == [43]  # the floor (2 % of the median) keeps 1.01 and 1.1 quiet


def test_a_detector_seeded_with_a_resumed_series_flags_at_once():
    detector = SpikeDetector(SpikeRule(), before=[0.5, 0.52, 0.49, 0.51] * 8)
    assert detector.check(0.5) is None
    med, limit = detector.check(9.0)
    assert med == pytest.approx(0.505, abs=0.01) and 0.5 < limit < 9.0


_LOSS = st.one_of(st.floats(0.0, 1.0), st.floats(0.0, 60.0),
                  st.sampled_from([float("nan"), float("inf"), float("-inf")]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_LOSS, max_size=100), st.lists(_LOSS, max_size=300),
       st.lists(st.integers(1, 80), min_size=1, max_size=20),
       st.sampled_from([(64, 16), (16, 16), (4, 16), (8, 1)]), st.integers(0, 16))
def test_checking_a_run_of_steps_at_once_is_checking_them_one_by_one(before, losses, runs,
                                                                     window_warmup, after):
    # the callback checks its steps in runs (check_many): the same flags, medians and
    # thresholds, bit for bit, and the same state after, whatever the runs
    window, warmup = window_warmup
    rule = SpikeRule(window=window, warmup=warmup, after=after)
    one, many = SpikeDetector(rule, before), SpikeDetector(rule, before)
    expected = [one.check(x) for x in losses]
    got, at, k = [], 0, 0
    while at < len(losses):
        n = runs[k % len(runs)]
        got += many.check_many(losses[at : at + n])
        at, k = at + n, k + 1
    assert got == expected
    assert list(many.near) == list(one.near)
    assert (many._since, many._finite, many._excess) == (one._since, one._finite, one._excess)


def test_the_command_names_the_run_epoch_and_steps_from_one():
    assert rows_command("out dir", 1, [4]) == "daskfeed rows 'out dir' --epoch 2 --step 5"
    assert rows_command("run", 0, [4, 5, 6]) == "daskfeed rows run --epoch 1 --step 5-7"
    assert rows_command("run", 0, [4, 8]) == "daskfeed rows run --epoch 1 --step 5"


# -- the callback in a real Keras fit -------------------------------------------------------
class _Plan:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes, self.num_batches = sizes, len(sizes)

    def batch_rows(self, i: int) -> int:
        return self.sizes[i]


class _Stream:
    def __init__(self, global_order: bool, plan: _Plan) -> None:
        self.global_order, self.plan = global_order, plan

    def plan_of(self, epoch: int) -> _Plan:
        return self.plan  # (every epoch the same batches)

    def order_batch(self, batch: int, epoch: int | None = None) -> int | None:
        return 1000 + batch if self.global_order else None  # an order unlike the trainer's own


def _batches(global_order: bool = True, start: int = 0):
    """A keras PyDataset of known batches, with what StepLosses reads of a DaskSequence."""
    from daskfeed.adapters import keras

    rng = np.random.default_rng(1)
    sizes = [16] * 39 + [5]
    xs = [rng.normal(size=(n, 3)).astype("float32") for n in sizes]
    ys = [x @ np.array([[1.0], [-2.0], [0.5]], dtype="float32") for x in xs]
    ys[30] = ys[30] + 100.0  # one batch of corrupted labels

    class Batches(keras.utils.PyDataset):
        def __len__(self) -> int:
            return len(sizes) - self.start

        def __getitem__(self, i: int):
            return xs[self.start + i], ys[self.start + i]

    seq = Batches()
    seq.plan, seq.start = _Plan(sizes), start
    seq.stream = _Stream(global_order, seq.plan)
    return seq, xs, ys


def _model():
    from daskfeed.adapters import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")  # weights fixed
    return model


def _truth(model, xs, ys) -> list[float]:
    """Each batch's mean squared error under the model's (fixed) weights."""
    w, b = model.get_weights()
    return [float(np.mean((x.astype("float64") @ w + b - y) ** 2)) for x, y in zip(xs, ys, strict=True)]


def _close(got, truth, sizes) -> bool:
    """Within the recovery's precision: the float32 rounding of the epoch's running sum over a
    batch's rows (a spike's sum makes the steps after it less exact)."""
    sums = np.cumsum(np.float64(truth) * np.float64(sizes))
    bound = 4 * np.finfo(np.float32).eps * sums / np.float64(sizes) + 1e-5
    return bool(np.all(np.abs(np.float64(got) - truth) <= bound))


def test_every_step_is_kept_and_the_corrupted_batch_flagged_in_a_real_fit(tmp_path):
    seq, xs, ys = _batches()
    model = _model()
    steps = StepLosses(str(tmp_path), seq, fresh=True, chunk=7)
    model.fit(seq, epochs=2, shuffle=False, verbose=0, callbacks=[steps])
    truth = _truth(model, xs, ys)
    frame = daskfeed.loss_steps(tmp_path)
    assert frame.attrs["numbering"] == "order" and frame.attrs["rule"]["k"] == 8.0
    assert len(frame) == 2 * len(xs) and frame["epoch"].tolist() == [1] * 40 + [2] * 40
    assert frame["step"].tolist() == [1001 + b for b in range(40)] * 2  # the order's batches, from 1
    assert _close(frame["loss"][:40], truth, seq.plan.sizes)
    assert _close(frame["loss"][40:], truth, seq.plan.sizes)
    flagged = frame[frame["flagged"]]
    assert [(e, s) for e, s in zip(flagged["epoch"], flagged["step"], strict=True)] == [(1, 1031), (2, 1031)]
    assert steps.flagged[0]["command"] == f"daskfeed rows {tmp_path} --epoch 1 --step 1031"
    assert steps.flagged[0]["batch"] == 31  # the trainer's own batch: the chart's axis
    assert [m["step"] for m in steps.take_marks(1)] == [1031] and len(steps.take_marks()) == 1
    assert steps.take_marks() == []
    lines = steps.summary_lines()
    assert "2 steps far above" in lines[0] and lines[1].endswith("--epoch 1 --step 1031")
    assert (tmp_path / "steps.bin").stat().st_size == 16 + 80 * RECORD.size  # 12 bytes a step


def test_the_steps_reach_the_file_within_flush_seconds_however_slow_the_steps(tmp_path):
    # the dashboard's reports work the waiting steps out every few seconds: a slow run's steps
    # must still be written on time (a kill keeps them), not only at epoch ends
    from daskfeed.adapters import keras

    seq, xs, _ = _batches()
    steps = StepLosses(str(tmp_path), seq, fresh=True, flush_seconds=0.0)
    sizes = []

    class Size(keras.callbacks.Callback):  # after StepLosses: what the file holds at each step
        def on_train_batch_end(self, batch, logs=None):
            sizes.append((tmp_path / "steps.bin").stat().st_size)
            steps.take_marks()  # (as the dashboard's report does)

    _model().fit(seq, epochs=1, shuffle=False, verbose=0, callbacks=[steps, Size()])
    assert sizes == [16 + (k + 1) * RECORD.size for k in range(len(xs))]


def test_a_resume_appends_and_the_steps_trained_again_read_as_their_last_record(tmp_path):
    seq, xs, _ = _batches()
    first = StepLosses(str(tmp_path), seq, fresh=True)
    _model().fit(seq, epochs=1, shuffle=False, verbose=0, callbacks=[first])
    again, _, _ = _batches(start=20)  # resumed at batch 20 of epoch 1: its running mean anew
    with open(tmp_path / "steps.bin", "ab") as f:  # a kill mid-write left a record cut short
        f.write(RECORD.pack(0, 99, 1.0)[:5])
    second = StepLosses(str(tmp_path), again, fresh=False)  # (cut off: the records after it read right)
    assert len(second.detector.near) == 40  # seeded with the series' last steps
    model = _model()
    model.fit(again, epochs=1, shuffle=False, verbose=0, callbacks=[second])
    frame = daskfeed.loss_steps(tmp_path)
    assert len(frame) == 40 and (tmp_path / "steps.bin").stat().st_size == 16 + 60 * RECORD.size
    truth = _truth(model, xs, _batches()[2])
    assert _close(frame["loss"][:20], truth[:20], seq.plan.sizes[:20])
    assert _close(frame["loss"][20:], truth[20:], seq.plan.sizes[20:])  # the mean begun afresh
    assert frame["flagged"].sum() == 1  # the corrupted batch, flagged again: one mark
    assert len(json.loads((tmp_path / "spikes.json").read_text())["flagged"]) == 1


def test_without_the_global_order_steps_are_the_trainers_and_no_command_is_given(tmp_path):
    seq, _, _ = _batches(global_order=False)
    steps = StepLosses(str(tmp_path), seq, fresh=True)
    _model().fit(seq, epochs=1, shuffle=False, verbose=0, callbacks=[steps])
    frame = daskfeed.loss_steps(tmp_path)
    assert frame.attrs["numbering"] == "trainer" and frame["step"].tolist() == list(range(1, 41))
    assert [m["command"] for m in steps.flagged] == [None]
    assert "no global order" in steps.summary_lines()[1]
    assert "no_command" in json.loads((tmp_path / "spikes.json").read_text())


def test_a_directory_without_a_series_is_refused_with_a_hint(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"(?s)Expected a run's per-step losses.*Hint:"):
        daskfeed.loss_steps(tmp_path)


# -- a real run ---------------------------------------------------------------------------------
BAD = 1_000_000  # the corrupted label


def _spiky_data(root: Path, demo: Path) -> list[tuple[str, int]]:
    """Two demo files, the label ``duration_s`` of every 400th line set to 1,000,000 (a sensor
    glitch). Returns the corrupted rows' (file, line)."""
    bad = []
    root.mkdir()
    for i in range(2):
        lines = (demo / "log_quest" / "splited" / f"split_data_{i:05d}.csv").read_text().splitlines()
        header = next(csv.reader([lines[0]]))
        at = header.index("duration_s")
        out = [lines[0]]
        for n, text in enumerate(lines[1:], start=2):
            if n % 400 == 0:
                fields = next(csv.reader([text]))
                fields[at] = str(BAD)
                text = ",".join(f'"{f}"' if "," in f else f for f in fields)
                bad.append((str(root / f"quests_{i}.csv"), n))
            out.append(text)
        (root / f"quests_{i}.csv").write_text("\n".join(out) + "\n")
    return bad


def test_a_runs_spikes_are_the_steps_of_its_corrupted_rows(tmp_path, tmp_path_factory):
    from daskfeed.cli._demo import write_demo_data

    demo = write_demo_data(tmp_path_factory.mktemp("spiky-demo"), rows=2000, validate_rows=1000)
    bad = _spiky_data(tmp_path / "spiky", Path(demo.root))
    out = tmp_path / "spiky-run"
    run = subprocess.run([*KillResume.command(), "train", str(tmp_path / "spiky" / "*.csv"), "--label",
                          "duration_s", "--epochs", "2", "--batch-size", "32", "--output", str(out),
                          "--nworkers", "1", "--memory-limit", "2GB", "--dashboard-address", "",
                          "--verbose", "0"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out / "spikes.json").read_text())
    flagged = report["flagged"]
    assert flagged and all(m["loss"] > 100 * m["median"] for m in flagged), flagged
    for m in flagged:  # the closing summary names each with its command
        assert f"epoch {m['epoch']} step {m['step']}: " in run.stdout and m["command"] in run.stdout
    # every flagged step holds a corrupted row, and every corrupted row's step in epoch 2 (past the
    # first steps' warm-up) is flagged: the command lists its file and line
    traced: set[tuple[str, int]] = set()
    history = json.loads((out / "history.json").read_text())
    epoch_rows = history["rows_per_epoch"]
    for m in flagged:
        listed = subprocess.run([*KillResume.command(), *m["command"].split()[1:], "--format", "csv"],
                                capture_output=True, text=True, check=True, timeout=300)
        rows = {(r["file"], int(r["line"])) for r in csv.DictReader(listed.stdout.splitlines())}
        size = min(32, epoch_rows - (m["batch"] - 1) * 32)  # (an epoch's last batch: the rest)
        assert len(rows) == size and rows & set(bad), (m, size, sorted(rows)[:3])
        if m["epoch"] == 2:
            traced |= rows & set(bad)
    assert traced == set(bad)
    assert history["loss_spikes"]["count"] == len(flagged) and history["loss_spikes"]["rule"]["k"] == 8
    frame = daskfeed.loss_steps(out)
    assert len(frame) == 2 * 63 and frame["flagged"].sum() == len(flagged)
