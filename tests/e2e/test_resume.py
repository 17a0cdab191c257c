"""Exact resume: the DaskSequence start offset, checkpoints (atomic, fallback, refusal), and a
``daskfeed train`` SIGKILLed mid-epoch then resumed with ``--resume`` (real processes).

Rows are tagged with a unique ``row_id`` (conftest ``id_data``); a recording model writes the
optimizer's iteration and the row ids of every batch it trains, so "consumed" means trained.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import RECORDED_FEATURES as FEATURES
from killresume import KillResume

BATCH = 200  # id_data: 13,300 rows -> 67 batches per epoch, the last one of 100 rows


def _seq(id_data, client, **kw):
    import daskfeed

    kw.setdefault("batch_size", BATCH)
    kw.setdefault("seed", 7)
    kw.setdefault("window_rows", 2000)  # ~7 windows, so a resumed epoch skips whole windows
    return daskfeed.DaskSequence(id_data.train_glob, label="cleared", client=client, **kw)


def _ids(batch) -> list[int]:
    x, _ = batch
    return np.asarray(x["row_id"]).reshape(-1).astype(np.int64).tolist()


# -- the sequence offset ----------------------------------------------------------------
def test_sequence_start_offset_serves_the_rest_of_the_epoch_exactly_once(id_data, client):
    with _seq(id_data, client) as full:
        n = len(full)
        reference = [_ids(full[i]) for i in range(n)]
    k = 23
    with _seq(id_data, client, manifest=full.manifest) as seq:
        seq.set_epoch(0, k)
        assert (seq.epoch, seq.start, len(seq)) == (0, k, n - k)
        # Keras' fit-start on_epoch_end (after peeking at batches 0 and 1) changes nothing
        assert _ids(seq[0]) == reference[k] and _ids(seq[1]) == reference[k + 1]
        seq.on_epoch_end()
        assert (seq.epoch, seq.start, len(seq)) == (0, k, n - k)
        got = [_ids(seq[i]) for i in range(len(seq))]
        assert got == reference[k:]  # same order as the uninterrupted epoch
        assert _ids(seq[-1]) == reference[-1]
        with pytest.raises(IndexError):
            seq[n - k]
        stats = seq.epoch_stats()
        assert stats["rows"] == id_data.train_rows - k * BATCH and stats["start_batch"] == k
        # windows wholly before batch k are never computed
        before = sum(1 for w in seq.plan.windows if max(seq.plan.batches_of(w.index)) < k)
        assert before >= 1 and stats["windows_computed"] <= len(seq.plan.windows) - before
        committed = [r for b in reference[:k] for r in b]
        resumed = [r for b in got for r in b]
        both = committed + resumed
        assert len(both) == len(set(both)) == id_data.train_rows  # one epoch, no duplicate
        seq.on_epoch_end()  # complete: the next epoch starts at batch 0
        assert (seq.epoch, seq.start, len(seq)) == (1, 0, n)
        assert sorted(r for i in range(n) for r in _ids(seq[i])) == sorted(both)
    with pytest.raises(ValueError, match="start"):
        seq.set_epoch(0, n)
    # unshuffled: every epoch has the same windows (same keys); resuming epoch 2 at batch k
    # right after construction keeps the windows in flight instead of cancelling them
    with _seq(id_data, client, manifest=full.manifest, shuffle=False) as plain:
        expected = [_ids(plain[i]) for i in (k, n - 1)]
        plain.set_epoch(2, k)
        assert [_ids(plain[0]), _ids(plain[n - k - 1])] == expected
        plain.set_epoch(2, 0)
        assert len(plain) == n and _ids(plain[k]) == expected[0]


# -- checkpoints on disk ----------------------------------------------------------------
def _tiny_model(seed: int = 0):
    from daskfeed.adapters._keras import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((3,))
    m = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Dense(4)(inp)))
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return m


def _cursor(epoch: int, batch: int, **kw):
    from daskfeed.batches import StreamState

    d = dict(epoch=epoch, batch=batch, seed=0, batch_size=8, fingerprint="f" * 32, num_batches=8,
             rows=64, window_rows=64, blocksize=2**20, shuffle=True, drop_remainder=False,
             label="y", features=("a", "b", "c"))
    d.update(kw)
    return StreamState(**d)


def test_checkpoints_atomic_keep_two_and_truncated_newest_falls_back(tmp_path):
    from daskfeed.checkpoint._store import CheckpointStore
    from daskfeed.core._exceptions import CheckpointError

    x = np.random.default_rng(0).random((64, 3)).astype("float32")
    y = x.sum(1)
    m = _tiny_model()
    store = CheckpointStore(tmp_path / "out" / "checkpoints")
    assert store.latest() is None
    saved = {}
    for b in (2, 4, 6):
        m.fit(x[: 8 * 2], y[: 8 * 2], batch_size=8, epochs=1, verbose=0, shuffle=False)
        saved[b] = ([w.copy() for w in m.get_weights()], int(m.optimizer.iterations.numpy()))
        store.save(m, _cursor(0, b), history=[{"epoch": -1, "loss": 1.0}])
    assert oct(os.stat(store.directory).st_mode & 0o777) == "0o700"
    assert store.names() == ["ckpt-000000-000000004", "ckpt-000000-000000006"]  # the last two
    assert not [e for e in os.listdir(store.directory) if e.startswith(".")]  # no temp leftovers
    newest = store.latest()
    assert newest is not None and (newest.cursor.epoch, newest.cursor.batch) == (0, 6)
    assert newest.iterations == saved[6][1] == 6 and newest.history == [{"epoch": -1, "loss": 1.0}]

    # truncate the newest checkpoint's weights: the previous good one is used, with a warning
    # (a damaged copy of the same name from an earlier crash is already there: replaced)
    os.makedirs(newest.path + ".corrupt")
    open(os.path.join(newest.path + ".corrupt", "old"), "w").close()
    with open(newest.weights, "r+b") as f:
        f.truncate(os.path.getsize(newest.weights) // 2)
    said = []
    with pytest.warns(UserWarning, match=r"truncated.*previous good checkpoint .*ckpt-000000-000000004"):
        ckpt = store.latest(warn=said.append)
    assert ckpt is not None and (ckpt.cursor.epoch, ckpt.cursor.batch) == (0, 4)
    assert said and "ckpt-000000-000000006" in said[0]
    assert os.path.isdir(newest.path + ".corrupt") and store.names() == ["ckpt-000000-000000004"]
    fresh = _tiny_model(seed=1)
    ckpt.restore(fresh)
    assert int(fresh.optimizer.iterations.numpy()) == saved[4][1] == 4  # optimizer state back
    for a, b in zip(fresh.get_weights(), saved[4][0], strict=True):
        np.testing.assert_array_equal(a, b)

    # a corrupt state.json too: nothing readable left is a clear error
    with open(os.path.join(ckpt.path, "state.json"), "w") as f:
        f.write('{"version": 1, "curs')
    with warnings.catch_warnings(), pytest.raises(CheckpointError, match="No readable checkpoint"):
        store.latest()
    assert store.clear() == 0 and os.listdir(store.directory) == []


def test_cursor_check_refuses_other_data_batch_size_seed():
    from daskfeed.core._exceptions import CheckpointError, DaskfeedError

    ck = _cursor(1, 5)
    ck.check(_cursor(1, 5), where="c")  # same batches: fine
    for change, pattern in [
        ({"fingerprint": "0" * 32}, r"other data: expected data with fingerprint f{32}.*"
                                    r"Received: fingerprint 0{32}"),
        ({"batch_size": 16}, r"batch_size=8.*Received: batch_size=16.*Hint: resume with --batch-size 8"),
        ({"seed": 3}, r"seed=0.*Received: seed=3.*Hint: resume with --seed 0"),
        ({"features": ("a", "b")}, r"Received: features=\('a', 'b'\).*--features/--exclude a,b,c"),
        # another --memory-limit makes other windows, so other batches: refused, not misread
        ({"window_rows": 128}, r"window_rows=64.*Received: window_rows=128.*same --memory-limit"),
    ]:
        with pytest.raises(CheckpointError, match="(?s)" + pattern) as info:
            ck.check(_cursor(1, 5, **change), where="c")
        assert isinstance(info.value, DaskfeedError) and "\nHint:" in str(info.value)


def test_weights_that_do_not_fit_the_model_are_a_clear_error(tmp_path):
    from daskfeed.adapters._keras import keras
    from daskfeed.checkpoint._store import CheckpointStore
    from daskfeed.core._exceptions import CheckpointError

    store = CheckpointStore(tmp_path / "c")
    store.save(_tiny_model(), _cursor(0, 1))
    inp = keras.Input((3,))
    other = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Dense(5)(inp)))
    other.compile(optimizer="adam", loss="mse")
    ckpt = store.latest()
    assert ckpt is not None
    with pytest.raises(CheckpointError, match=r"(?s)does not fit this model: A total of 2.*"
                                                r"Hint: resume with the same model"):
        ckpt.restore(other)


# -- resume inside one process: the same batches, the same weights ---------------------
def _recording_model(manifest, sink: list, weights=None):
    import tensorflow as tf

    import daskfeed
    from daskfeed.adapters._keras import keras

    def record(iteration, ids):
        sink.append((int(iteration.numpy()), ids.numpy().reshape(-1).astype(np.int64).tolist()))
        return 0

    class Recording(keras.Model):
        """Records (optimizer iteration, row ids) of every batch it trains, before the update."""

        def train_step(self, data):
            token = tf.py_function(record, [self.optimizer.iterations, data[0][:, 0]], tf.int32)
            with tf.control_dependencies([token]):
                return super().train_step(data)

    base = daskfeed.default_model(manifest, features=FEATURES, as_matrix=True, hidden=(8,))
    m = Recording(base.inputs, base.outputs)
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
    if weights is not None:  # the same start (seeding alone races with distributed's threads)
        m.set_weights(weights)
    return m


class _Crash(Exception):
    pass


@pytest.mark.parametrize("handoff", ["tf-data", "pydataset"])
def test_fit_interrupted_then_resumed_equals_an_uninterrupted_fit(id_data, client, tmp_path, handoff):
    from daskfeed.adapters._keras import keras
    from daskfeed.checkpoint._store import CheckpointStore
    from daskfeed.training._callbacks import Checkpointer, fit_from

    epochs, every = 3, 5
    kw = dict(batch_size=400, features=FEATURES, as_matrix=True)  # 34 batches per epoch
    ref_log: list = []
    with _seq(id_data, client, **kw) as seq:
        manifest, n = seq.manifest, len(seq)
        ref = _recording_model(manifest, ref_log)
        initial = ref.get_weights()
        fit_from(ref, seq, epochs=epochs, handoff=handoff, shuffle=False, verbose=0)
    assert [it for it, _ in ref_log] == list(range(epochs * n))

    class CrashAt(keras.callbacks.Callback):  # the process "dies" after 12 batches of epoch 1
        def on_train_batch_end(self, batch, logs=None):
            if self.model.optimizer.iterations.numpy() == n + 12:
                raise _Crash

    store = CheckpointStore(tmp_path / "checkpoints")
    log1: list = []
    with _seq(id_data, client, **kw, manifest=manifest) as seq:
        m1 = _recording_model(manifest, log1, initial)
        cb = Checkpointer(store, seq, every=every)
        with pytest.raises(_Crash):
            fit_from(m1, seq, epochs=epochs, handoff=handoff, shuffle=False, verbose=0,
                     callbacks=[cb, CrashAt()])
    ckpt = store.latest()
    assert ckpt is not None and (ckpt.cursor.epoch, ckpt.cursor.batch) == (1, 10)
    assert ckpt.iterations == n + 10 and len(ckpt.history) == 1  # epoch 0 recorded

    log2: list = []
    with _seq(id_data, client, **kw, manifest=manifest,
              window_rows=ckpt.cursor.window_rows) as seq:
        m2 = _recording_model(manifest, log2)
        ckpt.restore(m2)
        cb2 = Checkpointer(store, seq, every=every, history=ckpt.history)
        fits = fit_from(m2, seq, epochs=epochs, epoch=1, batch=10, handoff=handoff, shuffle=False, verbose=0,
                        callbacks=[cb2])
    assert len(fits) == 2  # the rest of epoch 1, then epoch 2
    committed = [b for it, b in log1 if it < ckpt.iterations]
    redone = [b for it, b in log1 if it >= ckpt.iterations]
    assert len(redone) == 2  # batches 10-11 of epoch 1 were trained but never committed
    # the resumed run starts at the checkpoint's next batch, in the uninterrupted order ...
    assert log2[0][0] == n + 10 and [b for _, b in log2[:2]] == redone
    # ... and committed + resumed batches are exactly the uninterrupted run's
    assert committed + [b for _, b in log2] == [b for _, b in ref_log]
    epoch1 = [r for b in committed[n:] + [b for it, b in log2 if it < 2 * n] for r in b]
    assert len(epoch1) == len(set(epoch1)) == id_data.train_rows
    for a, b in zip(m2.get_weights(), ref.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [h["epoch"] for h in cb2.history] == [0, 1, 2]
    assert cb2.history[1]["resumed_at_batch"] == 10 and "resumed_at_batch" not in cb2.history[2]
    assert (store.latest().cursor.epoch, store.latest().cursor.batch) == (3, 0)


# -- the command line: SIGKILL mid-epoch, then --resume --------------------------------


ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.slow
@pytest.mark.parametrize(("kill_epoch", "relayout"), [(0, False), (1, True)],
                         ids=["same-layout", "new-budget-workers-windows"])
def test_cli_sigkill_mid_epoch_then_resume_trains_every_row_exactly_once(id_data, tmp_path, kill_epoch,
                                                                          relayout):
    """Killed mid-epoch, resumed exactly; with ``relayout`` under another budget, worker count
    and window size (the global order does not depend on them). The kill/resume harness."""
    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "2", "--batch-size",
            str(BATCH), "--seed", "5", "--checkpoint-every", "10", "--memory-limit", "3GB",
            "--nworkers", "1", "--dashboard-address", "", "--verbose", "0"]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1}, delay=0.04)
    n = -(-id_data.train_rows // BATCH)
    run.start()
    ckpt = run.kill_at(kill_epoch, 30)
    first = run.steps()
    k = ckpt.cursor.batch
    assert k % 10 == 0 and ckpt.iterations == kill_epoch * n + k  # optimizer state of batch k
    assert len(first) > ckpt.iterations  # some batches were trained after the checkpoint
    again = run.relayout(memory_limit="2GB", nworkers="2") if relayout else None
    text = run.resume(again, timeout=300)
    assert "rows in one global order per epoch" in text
    if relayout:
        assert text.startswith("memory limit: 2GB = 2.00 GB") and "2 workers ×" in text, text[:300]
    assert f"resuming from {ckpt.path}: epoch {kill_epoch + 1}/2 at batch {k + 1}/{n}" in text
    committed = run.committed()
    uncommitted = [s.ids.tolist() for s in first if s.iteration >= ckpt.iterations]
    after = committed[ckpt.iterations:]
    assert [s.ids.tolist() for s in after[:len(uncommitted)]] == uncommitted  # same order, again
    assert run.audit() == len(committed)  # each step's rows, recomputed by `daskfeed rows`
    for epoch, (lost, duplicated) in enumerate(run.epochs(id_data.train_rows, n, 2)):
        print(f"\nepoch {epoch}: killed after {len(first)} batches, checkpoint at epoch "
              f"{kill_epoch} batch {k}, {len(uncommitted)} uncommitted batches retrained; "
              f"lost {lost}, duplicated {duplicated}")
        assert lost == duplicated == 0
    hist = json.loads((run.output / "history.json").read_text())
    assert [e["epoch"] for e in hist["epochs"]] == [1, 2]  # numbered as the screen shows them
    assert hist["epochs"][kill_epoch]["resumed_at_batch"] == k
    assert hist["epochs"][kill_epoch]["rows"] == id_data.train_rows - k * BATCH
    assert hist["resumed_from"]["batch"] == hist["resumed_from"]["position"] == k  # one trainer
    assert hist["resumed_from"]["world_size"] == 1
    if kill_epoch:
        return
    # resuming onto another batch size is refused (exit 1, clear message, no traceback)
    other = [a if a != str(BATCH) else "100" for a in run.args]
    refused = subprocess.run([*_daskfeed_cmd(), *other, "--resume"], capture_output=True,
                             text=True, env=ENV, timeout=300)
    assert refused.returncode == 1
    assert "batch_size=200" in refused.stderr and "Received: batch_size=100" in refused.stderr
    assert "Hint: resume with --batch-size 200" in refused.stderr and "Traceback" not in refused.stderr


def _daskfeed_cmd() -> list[str]:
    return [shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"]


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_train_resume_continues_and_refuses_changed_data(tmp_path):
    """train(resume=True): continues after the last epoch; on changed data: CheckpointError."""
    from daskfeed import write_demo_data
    from daskfeed.core._exceptions import CheckpointError
    from daskfeed.training._train import train

    data = write_demo_data(tmp_path / "d", rows=3000, validate_rows=1000, rows_per_file=1000,
                           row_ids=True)
    kw = dict(label="cleared", epochs=1, batch_size=256, memory_limit="2GB", nworkers=1,
              dashboard_address="", output=tmp_path / "out", echo=lambda s: None, verbose=0)
    first = train(data.train_glob, **kw)
    # the run finished epoch 0; --resume with more epochs continues at epoch 1, batch 0
    said: list[str] = []
    more = train(data.train_glob, resume=True, **{**kw, "epochs": 2, "echo": said.append})
    assert any("epoch 2/2 at batch 1/12 (optimizer iteration 12)" in line for line in said), said
    assert more.history[0] == first.history[0] and [h["epoch"] for h in more.history] == [1, 2]
    assert int(more.model.optimizer.iterations.numpy()) == 24
    names = sorted(os.listdir(tmp_path / "out" / "checkpoints"))
    assert names == ["ckpt-000001-000000000", "ckpt-000002-000000000"]
    files = sorted(p for p in (tmp_path / "d").rglob("*.csv") if "validate" not in str(p))
    with open(files[-1], "a") as f:  # one more row in the last file
        f.write(open(files[-1]).read().splitlines()[-1] + "\n")
    with pytest.raises(CheckpointError, match=rf"(?s)Expected the {len(files)} files the run "
                                                rf"started with, unchanged.*Received: changed: "
                                                rf"{re.escape(str(files[-1]))}\..*Hint:"):
        train(data.train_glob, resume=True, **{**kw, "epochs": 3})
    assert sorted(os.listdir(tmp_path / "out" / "checkpoints")) == names  # left as it was


def test_a_resumed_epoch_shows_its_real_number_in_keras_bar(id_data, client, capfd):
    from daskfeed.training._callbacks import fit_from
    from daskfeed.training._model import default_model

    with _seq(id_data, client, batch_size=400, features=FEATURES, as_matrix=True) as seq:
        model = default_model(seq)
        fits = fit_from(model, seq, epochs=3, epoch=1, batch=30, shuffle=False, verbose=2)
    out = capfd.readouterr().out
    assert "Epoch 2/3" in out and "Epoch 3/3" in out, out  # not "Epoch 2/2" for epoch 2 of 3
    assert "Epoch 2/2" not in out and "Epoch 1/3" not in out, out
    assert [len(f.epoch) for f in fits] == [1, 1]  # the resumed epoch alone, then epoch 3


@pytest.mark.slow
def test_a_rerun_killed_midway_leaves_the_finished_runs_model_and_manifest_together(id_data,
                                                                                  tmp_path):
    """A finished run, then a fresh run into the same --output (another seed: other batches),
    SIGKILLed mid-epoch: model.keras, manifest.json and run.json are still the finished run's
    (the rerun's manifest waits as manifest.running.json), predict's loader accepts them, and
    the directory's lock died with the killed run. The kill/resume harness."""
    import hashlib

    from daskfeed.inference._scoring import TrainedRun
    from daskfeed.training._outputs import OutputLock

    args = ["train", id_data.train_glob, "--label", "cleared", "--epochs", "1", "--batch-size",
            str(BATCH), "--seed", "5", "--checkpoint-every", "10", "--memory-limit", "3GB",
            "--nworkers", "1", "--dashboard-address", "", "--verbose", "0"]
    run = KillResume(tmp_path, args, features=FEATURES, ids={"row_id": 1}, delay=0.04)
    assert run.start().wait(600) == 0, run.text()[-3000:]
    out = run.output

    def digests() -> dict[str, str]:
        return {n: hashlib.sha256((out / n).read_bytes()).hexdigest()
                for n in ("model.keras", "manifest.json", "run.json")}

    finished = digests()
    record = json.loads((out / "run.json").read_text())
    assert record["files"]["manifest.json"] == finished["manifest.json"]
    assert json.loads((out / "history.json").read_text())["run_id"] == record["run_id"]
    os.remove(run.log)
    rerun = [a if a != "5" else "6" for a in run.args]  # a fresh rerun: --seed 6
    run.start(rerun)
    run.kill_at(0, 20)
    assert (out / "manifest.running.json").exists()
    assert digests() == finished  # nothing of the finished run was touched
    TrainedRun.open(str(out), FEATURES)  # predict's loader: the run's own model and manifest
    OutputLock(str(out)).release()  # the killed run's lock went with its process
    text = run.resume(rerun)
    assert "resuming from" in text
    again = json.loads((out / "run.json").read_text())
    assert again["run_id"] != record["run_id"] and not (out / "manifest.running.json").exists()
    assert again["files"]["manifest.json"] == digests()["manifest.json"]
    TrainedRun.open(str(out), FEATURES)
