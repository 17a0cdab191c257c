"""Training as Keras users do (issue 17): sample weights, class weights, a validation split,
early stopping that survives a resume, and the default model's knobs.

Every part is checked with a real ``fit`` on a real LocalCluster: weighted losses against Keras'
own in-memory ``fit`` with the same weights, the split's parts row by row, early stopping's stop
and restore against an uninterrupted run.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed.core._exceptions import (
    CheckpointError,
    DataError,
    ManifestMismatchError,
    SchemaError,
    SettingError,
)

BATCH = 128
N_FILES = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """8 CSV files of unequal size: row_id, x1 (its mean moves from file to file), x2, a weight
    column w, an imbalanced 0/1 label y; the same rows without w in another directory."""
    root = tmp_path_factory.mktemp("fit-options")
    rng = np.random.default_rng(17)
    frames, start = [], 0
    for f in range(N_FILES):
        n = 400 + 25 * f
        x1 = rng.normal(0.4 * f, 1.0, n).round(4)
        x2 = rng.normal(0.0, 1.0, n).round(4)
        y = (x1 - 0.4 * f + x2 + rng.logistic(0.0, 0.5, n) > 0.9).astype(int)
        w = rng.choice([0.5, 1.0, 2.0, 4.0], n)
        df = pd.DataFrame({"row_id": np.arange(start, start + n), "x1": x1, "x2": x2, "w": w, "y": y})
        start += n
        (root / "weighted").mkdir(exist_ok=True)
        df.to_csv(root / "weighted" / f"part_{f:02d}.csv", index=False)
        (root / "plain").mkdir(exist_ok=True)
        df.drop(columns="w").to_csv(root / "plain" / f"part_{f:02d}.csv", index=False)
        frames.append(df)
    files = sorted(glob.glob(str(root / "weighted" / "*.csv")))
    frame = pd.concat([pd.read_csv(p) for p in files], ignore_index=True)  # as the files read
    return SimpleNamespace(glob=str(root / "weighted" / "*.csv"), files=files, frame=frame,
                           plain_glob=str(root / "plain" / "*.csv"), root=root)


def _seq(data, client, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("cache", False)
    path = kw.pop("path") if "path" in kw else data.glob
    return daskfeed.DaskSequence(path, label="y", client=client, **kw)


def _epoch(seq):
    """Every batch of the sequence's current epoch, then the move to the next epoch."""
    batches = [seq[i] for i in range(len(seq))]
    seq.on_epoch_end()
    return batches


def _in_memory(frame):
    x = frame[["x1", "x2"]].to_numpy(dtype="float32")
    return x, frame["y"].to_numpy(dtype="float32"), frame["w"].to_numpy(dtype="float32")


def _twin(seq, **kw):
    """Two default models with the same initial weights."""
    from daskfeed.adapters._keras import keras

    keras.utils.set_random_seed(3)
    a = daskfeed.default_model(seq, hidden=(8,), **kw)
    b = daskfeed.default_model(seq, hidden=(8,), **kw)
    b.set_weights(a.get_weights())
    return a, b


# -- 1. sample weights ------------------------------------------------------------------
def test_weight_column_makes_x_y_w_batches_of_each_row_once_and_is_not_a_feature(data, client):
    by_id = data.frame.set_index("row_id")["w"]
    with _seq(data, client, weight="w", window_rows=700) as seq:
        assert seq.features == ["row_id", "x1", "x2"]  # not w
        for _ in range(2):  # two epochs: each row once with its own weight
            seen = []
            for x, y, w in _epoch(seq):
                assert w.dtype == np.float32 and len(w) == len(y)
                ids = x["row_id"].astype(np.int64)
                np.testing.assert_array_equal(w, by_id.loc[ids].to_numpy(dtype="float32"))
                seen += ids.tolist()
            assert sorted(seen) == data.frame["row_id"].tolist()
    with pytest.raises(SchemaError, match=r"cannot also be a feature.*weight='w'"):
        _seq(data, client, weight="w", features=["x1", "w"])
    with pytest.raises(SchemaError, match=r"(?s)weight='ww'.*did you mean 'w'"):
        _seq(data, client, weight="ww")
    with pytest.raises(SchemaError, match="cannot also be the label"):
        _seq(data, client, weight="y")


def test_weighted_fit_and_evaluate_match_keras_in_memory_with_the_same_weights(data, client):
    x, y, w = _in_memory(data.frame)
    with _seq(data, client, weight="w", features=["x1", "x2"], as_matrix=True,
              shuffle=False) as seq:
        model, ref = _twin(seq)
        initial = ref.get_weights()
        got = model.fit(seq, epochs=2, shuffle=False, verbose=0).history
        want = ref.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=2, shuffle=False,
                       verbose=0).history
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
        np.testing.assert_allclose(got["weighted_accuracy"], want["weighted_accuracy"], rtol=1e-5)
        for a, b in zip(model.get_weights(), ref.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        # validation data weigh their loss and metrics the same way
        val = model.evaluate(seq, verbose=0, return_dict=True)
        mem = model.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0, return_dict=True)
        assert val["loss"] == pytest.approx(mem["loss"], rel=1e-5)
        assert val["weighted_accuracy"] == pytest.approx(mem["weighted_accuracy"], rel=1e-5)
        # the weights matter: the same start without them gives another loss
        ref.set_weights(initial)
        plain = ref.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
        assert abs(plain["loss"][0] - want["loss"][0]) > 1e-3


def test_missing_and_negative_weights_are_an_error_naming_file_and_line(client, write_csv):
    ok = "".join(f"{i},n{i % 5},1.5,{i % 2}\n" for i in range(40))
    a = write_csv("bad/a.csv", "row_id,note,w,y\n" + ok + "40,n1,,\n")  # no label: no fault
    # a quoted line break (2 lines for one row) before the negative weight of row 4 (line 7)
    b = write_csv("bad/b.csv", 'row_id,note,w,y\n0,"n1",1,0\n1,"two\nlines",1,1\n2,n3,1,0\n'
                               "3,n3,1,1\n4,n5,-2,1\n5,n3,1,0\n")
    assert open(b).read().splitlines()[6].startswith("4,n5,-2")
    rows = [f"{i},n{i % 5},{'' if i == 170 else 0.5},{i % 2}\n" for i in range(200)]
    c = write_csv("bad/c.csv", "row_id,note,w,y\n" + "".join(rows))  # several byte ranges
    with pytest.raises(DataError) as err:
        _seq(None, client, path=[a, b, c], weight="w", blocksize=700)
    text = str(err.value)
    assert "Received: 1 row(s) with a missing weight and 1 with a negative one" in text
    assert f"the first (-2) at {b} line 7 (block 1" in text and "Hint:" in text
    with pytest.raises(DataError) as err:
        _seq(None, client, path=[a, c], weight="w", blocksize=700)
    assert f"the first (missing) at {c} line 172 (block " in str(err.value)
    assert "bytes" in str(err.value)  # a byte range of c.csv, not the whole file
    with _seq(None, client, path=[a], weight="w") as seq:  # the label-less row is no fault
        assert seq.rows == 40
    text_w = write_csv("bad/d.csv", "x,w,y\n1,heavy,0\n2,light,1\n")
    with pytest.raises(SchemaError, match=r"(?s)numeric weight column.*categorical"):
        _seq(None, client, path=[text_w], weight="w")


# -- 2. class weights --------------------------------------------------------------------
def test_balanced_class_weights_from_the_scan_match_keras_in_memory(data, client):
    x, y, _ = _in_memory(data.frame)
    counts = data.frame["y"].value_counts()
    with _seq(data, client, features=["x1", "x2"], as_matrix=True, shuffle=False) as seq:
        m = seq.manifest
        assert m.label_counts == {"0": int(counts[0]), "1": int(counts[1])}
        cw = m.class_weights("balanced")
        assert cw == pytest.approx({c: len(y) / (2 * counts[c]) for c in (0, 1)})
        assert cw[1] > 1.5 * cw[0]  # the label is imbalanced
        assert m.class_weights({"1": 9}) == {0: 1.0, 1: 9.0}
        assert m.class_weights({0: 1, 1: 2.5}) == {0: 1.0, 1: 2.5}
        model, ref = _twin(seq)
        initial = ref.get_weights()
        got = model.fit(seq, class_weight=cw, epochs=2, shuffle=False, verbose=0).history
        want = ref.fit(x, y, class_weight=cw, batch_size=BATCH, epochs=2, shuffle=False,
                       verbose=0).history
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
        ref.set_weights(initial)
        plain = ref.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
        assert abs(plain["loss"][0] - want["loss"][0]) > 1e-3
        with pytest.raises(SchemaError, match=r"(?s)classes of label 'y' \(0, 1\).*Received: class '2'"):
            m.class_weights({"2": 1})
        with pytest.raises(SettingError, match=r"(?s)number >= 0.*-1"):
            m.class_weights({"0": -1})
        with pytest.raises(SettingError, match="'balanced' or a mapping"):
            m.class_weights("median")
    with pytest.raises(SchemaError, match="regression label"):
        daskfeed.scan(data.glob, label="x2", client=client).class_weights("balanced")


# -- 3. the validation split ---------------------------------------------------------------
def _split_pair(data, client, seed=5, **kw):
    train = _seq(data, client, validation_split=0.25, subset="training", seed=seed,
                 features=["row_id", "x1", "x2"], **kw)
    val = _seq(data, client, validation_split=0.25, subset="validation", seed=seed,
               features=["row_id", "x1", "x2"], reference=train.manifest, shuffle=False, **kw)
    return train, val


def _ids(seq) -> list[int]:
    return [int(i) for x, _ in _epoch(seq) for i in x["row_id"]]


def test_split_holds_out_whole_partitions_disjoint_stable_and_scans_training_rows_only(data, client):
    from daskfeed.adapters._keras import keras

    runs = []
    for _ in range(2):  # two runs: new sequences, each part scanned again
        train, val = _split_pair(data, client)
        with train, val:
            held = val.manifest.split["validation_partitions"]
            epochs = [(_ids(train), _ids(val)) for _ in range(2)]
            runs.append((held, epochs, train.manifest))
    (held, epochs, manifest), (held2, epochs2, _) = runs
    assert held == held2 == manifest.split["validation_partitions"] and 1 <= len(held) < N_FILES
    val_frame = data.frame[data.frame["row_id"].isin(epochs[0][1])]
    train_frame = data.frame.drop(val_frame.index)
    for tr, va in epochs + epochs2:
        assert len(tr) == len(set(tr)) == len(train_frame)  # each row once per epoch
        assert sorted(va) == sorted(val_frame["row_id"])  # the same rows every epoch and run
        assert not set(tr) & set(va) and len(tr) + len(va) == len(data.frame)
    assert epochs[0][0] != epochs[1][0]  # training order changes per epoch
    held_files = {data.files[p] for p in held}
    file_of = np.repeat(np.arange(N_FILES), [400 + 25 * f for f in range(N_FILES)])
    assert {data.files[f] for f in file_of[val_frame["row_id"]]} == held_files  # whole files
    # statistics from the training rows alone, label counts too
    assert manifest.rows == len(train_frame)
    assert manifest.columns["x1"].mean == pytest.approx(train_frame["x1"].mean(), rel=1e-9)
    assert manifest.columns["x1"].var == pytest.approx(train_frame["x1"].var(ddof=0), rel=1e-9)
    assert manifest.columns["x1"].mean != pytest.approx(data.frame["x1"].mean(), rel=1e-6)
    assert manifest.label_counts == {str(k): int(n) for k, n in
                                     sorted(train_frame["y"].value_counts().items())}
    assert "the training part of validation_split=0.25, seed=5" in manifest.summary()
    # another seed draws other blocks; validation metrics as with separate data. The blocks'
    # keys hold this run's temporary paths: one other seed may draw the same few blocks by
    # chance (~1 in 28 here), six in a row practically never
    for seed in range(6, 12):
        train, val = _split_pair(data, client, seed=seed)
        if val.manifest.split["validation_partitions"] != held:
            break
        val.close()
        train.close()
    else:
        pytest.fail(f"seeds 6 to 11 all held out the blocks of seed 5: {held}")
    with train, val:
        keras.utils.set_random_seed(1)
        model = daskfeed.default_model(train)
        hist = model.fit(train, validation_data=val, epochs=1, shuffle=False, verbose=0).history
        assert np.isfinite(hist["val_loss"][0]) and "val_accuracy" in hist


def test_split_refuses_overlapping_parts_and_a_manifest_of_another_split(data, client):
    with _seq(data, client, validation_split=0.25, subset="training", seed=5) as train:
        with pytest.raises(SettingError, match=r"(?s)would serve some of its rows.*Hint: pass "
                                              r"validation_split=0.25, subset='validation', seed=5"):
            _seq(data, client, validation_split=0.25, subset="validation", seed=6,
                 reference=train.manifest)
        with pytest.raises(SettingError, match="would serve some of its rows"):
            _seq(data, client, reference=train.manifest)  # the whole data
        with pytest.raises(ManifestMismatchError, match=r"made with split=\{'validation_split'"):
            _seq(data, client, manifest=train.manifest)  # a whole-data run cannot reuse it
    with pytest.raises(ValueError, match=r"subset='training' or subset='validation'"):
        _seq(data, client, validation_split=0.25)
    with pytest.raises(ValueError, match=r"0 < validation_split < 1"):
        _seq(data, client, validation_split=1.5, subset="training")


def test_split_needs_two_blocks(client, write_csv):
    one = write_csv("one.csv", "x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(50)))
    with pytest.raises(ValueError, match=r"(?s)at least 2 blocks.*Received: 1.*--blocksize"):
        daskfeed.DaskSequence(one, label="y", client=client, validation_split=0.2,
                              subset="training", cache=False)


# -- 4. early stopping ---------------------------------------------------------------------
SCORES = [5.0, 3.0, 4.0, 4.5, 2.0, 1.0, 0.5, 0.2]  # best at epoch 1, then 2 worse: stop at 3


def _callbacks():
    from daskfeed.adapters._keras import keras

    class Score(keras.callbacks.Callback):  # a monitored value known in advance
        def on_epoch_end(self, epoch, logs=None):
            logs["score"] = SCORES[epoch]

    class Weights(keras.callbacks.Callback):  # the weights at the end of every epoch
        def __init__(self):
            super().__init__()
            self.at = {}

        def on_epoch_end(self, epoch, logs=None):
            self.at[epoch] = self.model.get_weights()

    return Score(), Weights()


def _stopper():
    from daskfeed.training._early_stopping import EarlyStopping

    return EarlyStopping(monitor="score", patience=2, mode="min", restore_best_weights=True)


def _close(a_list, b_list):
    for a, b in zip(a_list, b_list, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_early_stopping_stops_restores_best_weights_and_survives_a_mid_epoch_resume(
        data, client, tmp_path):
    from daskfeed.adapters._keras import keras
    from daskfeed.checkpoint._store import CheckpointStore
    from daskfeed.training._callbacks import Checkpointer, fit_from

    kw = dict(features=["x1", "x2"], as_matrix=True, window_rows=700, seed=2)
    with _seq(data, client, **kw) as seq:
        manifest, n = seq.manifest, len(seq)
        ref, _ = _twin(seq)
        initial = ref.get_weights()
        score, weights = _callbacks()
        es = _stopper()
        fits = fit_from(ref, seq, epochs=len(SCORES), shuffle=False, verbose=0,
                        callbacks=[score, es, weights])
    assert len(fits[0].history["loss"]) == 4 and es.stopped_epoch == 3 and es.best_epoch == 1
    _close(ref.get_weights(), weights.at[1])  # restored: the best epoch's weights
    assert not np.allclose(weights.at[3][0], weights.at[1][0])  # (which differ from the last)

    class Crash(Exception):
        pass

    class CrashAt(keras.callbacks.Callback):  # the process "dies" 5 batches into epoch 2
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 2 * n + 5:
                raise Crash

    store = CheckpointStore(tmp_path / "checkpoints")
    with _seq(data, client, manifest=manifest, **kw) as seq:
        m1, _ = _twin(seq)
        m1.set_weights(initial)
        score, _ = _callbacks()
        es1 = _stopper()
        with pytest.raises(Crash):
            fit_from(m1, seq, epochs=len(SCORES), shuffle=False, verbose=0,
                     callbacks=[score, es1, Checkpointer(store, seq, every=3, early_stopping=es1),
                                CrashAt()])
    ckpt = store.latest()
    assert (ckpt.cursor.epoch, ckpt.cursor.batch) == (2, 3)
    with open(os.path.join(ckpt.path, "state.json")) as f:
        state = json.load(f)["early_stopping"]
    assert state == {"monitor": "score", "patience": 2, "wait": 0, "stopped_epoch": 0,
                     "best_epoch": 1, "best": 3.0, "best_weights": True}
    _close(ckpt.best_weights(), weights.at[1])

    with _seq(data, client, manifest=manifest, **kw) as seq:
        m2, _ = _twin(seq)
        ckpt.restore(m2)
        score, weights2 = _callbacks()
        es2 = _stopper()
        es2.set_state(ckpt.early_stopping, ckpt.best_weights())
        fits = fit_from(m2, seq, epochs=len(SCORES), epoch=2, batch=3, shuffle=False, verbose=0,
                        callbacks=[score, es2, Checkpointer(store, seq, every=3, early_stopping=es2),
                                   weights2])
    # the rest of epoch 2, then epoch 3, where the patience carried over runs out
    assert [len(f.history["loss"]) for f in fits] == [1, 1]
    assert es2.stopped_epoch == 3 and es2.best_epoch == 1
    _close(weights2.at[3], weights.at[3])  # epoch 3 trained on, not from restored weights
    _close(m2.get_weights(), ref.get_weights())  # the same best weights restored at the end
    last = store.latest()
    assert (last.cursor.epoch, last.early_stopping["stopped_epoch"]) == (4, 3)
    with pytest.raises(CheckpointError, match="monitored 'score'"):
        from daskfeed.training._early_stopping import EarlyStopping

        EarlyStopping(monitor="val_loss").set_state(last.early_stopping)


# -- 5. default_model(seq) and the model knobs ----------------------------------------------
def test_default_model_takes_the_sequence_selection(data, client):
    with _seq(data, client, weight="w", exclude=["row_id"]) as seq:
        model = daskfeed.default_model(seq, hidden=(16, 4), dropout=0.25, learning_rate=0.01)
        assert sorted(model.input) == ["x1", "x2"]  # not row_id (excluded), not w (the weight)
        assert [model.get_layer(f"dense_{i}").units for i in (0, 1)] == [16, 4]
        assert model.get_layer("dropout_0").rate == 0.25
        assert float(model.optimizer.learning_rate) == pytest.approx(0.01)
        hist = model.fit(seq, epochs=1, shuffle=False, verbose=0).history
        assert np.isfinite(hist["loss"][0]) and "weighted_accuracy" in hist
        with pytest.raises(SettingError, match="feature selection from the DaskSequence alone"):
            daskfeed.default_model(seq, features=["x1"])
        legacy = daskfeed.default_model(seq.manifest, exclude=["row_id", "w"])  # still works
        assert sorted(legacy.input) == ["x1", "x2"]
        with pytest.raises(SettingError, match="0 <= dropout < 1"):
            daskfeed.default_model(seq, dropout=1.0)


# -- train() and the command line -------------------------------------------------------------
QUICK = dict(memory_limit="3GB", nworkers=1, dashboard_address="127.0.0.1:0", verbose=0,
             batch_size=256, cache=False)


def frozen(manifest):
    """A builder whose model never changes (learning rate 0): val_loss is the same every epoch."""
    return daskfeed.default_model(manifest, exclude=["w"], hidden=(4,), learning_rate=0.0)


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_train_weights_split_and_early_stopping_resume_with_patience_kept(data, tmp_path):
    from daskfeed.training._train import train

    out = tmp_path / "out"
    lines: list[str] = []
    first = train(data.glob, label="y", weight="w", validation_split=0.25, early_stopping=3,
                  epochs=2, model=frozen, output=out, echo=lines.append, **QUICK)
    text = "\n".join(lines)
    assert "sample weights: column 'w' (not a feature); loss and weighted_ metrics weighted, " \
           "validation too" in text
    assert "validation split 0.25 by whole blocks (seed 0): " in text
    assert "early stopping: val_loss, patience 3 epochs" in text
    assert "early stopping: did not stop (2 epochs trained)" in text
    hist = json.loads((out / "history.json").read_text())
    assert hist["sample_weight"] == "w" and hist["validation_split"]["by"] == "partition"
    assert hist["validation_split"]["training_rows"] + hist["validation_split"]["validation_rows"] \
        == len(data.frame)
    assert hist["early_stopping"]["wait"] == 1 and not hist["early_stopping"]["stopped"]
    assert "val_loss" in first.final
    lines.clear()
    train(data.glob, label="y", weight="w", validation_split=0.25, early_stopping=3, epochs=10,
          model=frozen, output=out, echo=lines.append, resume=True, **QUICK)
    text = "\n".join(lines)
    assert "early stopping resumed: 1 epoch(s) without improvement of val_loss so far" in text
    # uninterrupted, patience 3 stops after epoch 4 (0: best, then 1, 2, 3 worse or equal)
    assert "stopped after epoch 4 of 10" in text and "restored the weights of epoch 1" in text
    hist = json.loads((out / "history.json").read_text())
    assert [r["epoch"] for r in hist["epochs"]] == [1, 2, 3, 4]  # as the screen numbers them
    assert hist["early_stopping"]["stopped_epoch"] == 4 and hist["early_stopping"]["best_epoch"] == 1
    # the closing figures are the restored epoch's (the weights model.keras holds), named
    best = hist["epochs"][0]
    metric = next(k for k in ("val_weighted_accuracy", "val_accuracy") if k in best)
    assert (f"{metric.replace('_', ' ')}: {best[metric]:.4f} (epoch 1, whose weights early "
            "stopping restored)") in text
    assert f"final (epoch 1, the best, restored by early stopping: the weights model.keras " \
           f"holds): loss {best['loss']:.4f}" in text
    assert "last epoch (4), not kept: loss " in text and "\nfinal: " not in text
    lines.clear()
    with pytest.raises(CheckpointError, match=r"(?s)validation_split=0.25.*--validation-split"):
        train(data.glob, label="y", weight="w", validation_split=0.5, epochs=10, model=frozen,
              output=out, echo=lines.append, resume=True, **QUICK)


def test_train_weighs_validation_only_when_it_has_the_column(data, tmp_path):
    from daskfeed.training._train import train

    lines: list[str] = []
    result = train(data.glob, label="y", weight="w", validation=data.plain_glob, epochs=1,
                   output=tmp_path / "out", echo=lines.append, **QUICK)
    assert "validation unweighted (its data have no such column)" in "\n".join(lines)
    assert "weighted_accuracy" in result.final  # training: weighted
    # validation: no weights, so its weighted metric is the plain one
    assert result.final["val_weighted_accuracy"] == pytest.approx(result.final["val_accuracy"])


def _cli(*args, cwd=None):
    exe = os.path.join(os.path.dirname(sys.executable), "daskfeed")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=600,
                          cwd=cwd)


def test_cli_class_weights_split_early_stopping_and_model_knobs(data, tmp_path):
    from daskfeed.adapters._keras import keras

    out = tmp_path / "out"
    run = _cli("train", data.glob, "--label", "y", "--validation-split", "0.25",
               "--class-weight", "balanced", "--early-stopping", "1", "--hidden", "16,8",
               "--dropout", "0.1", "--learning-rate", "0.01", "--epochs", "2", "--batch-size", "256",
               "--memory-limit", "3GB", "--nworkers", "1", "--dashboard-address", "127.0.0.1:0",
               "--no-cache", "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    hist = json.loads((out / "history.json").read_text())
    manifest = daskfeed.Manifest.from_json(out / "manifest.json")
    want = manifest.class_weights("balanced")
    assert hist["class_weight"] == pytest.approx({str(k): v for k, v in want.items()})
    shown = ", ".join(f"{k}: {w:.4g}" for k, w in want.items())
    assert "class weights (balanced, from the label counts " in run.stdout
    assert f"): {shown}" in run.stdout
    assert "default model: hidden [16, 8], dropout 0.1, Adam(learning_rate=0.01)" in run.stdout
    assert "early stopping: val_loss, patience 1 epoch;" in run.stdout
    assert manifest.split["subset"] == "training" and hist["validation_split"]["fraction"] == 0.25
    assert hist["early_stopping"]["monitor"] == "val_loss"
    model = keras.models.load_model(out / "model.keras")
    assert [model.get_layer(f"dense_{i}").units for i in (0, 1)] == [16, 8]
    assert model.get_layer("dropout_1").rate == pytest.approx(0.1)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)


@pytest.mark.parametrize(("args", "message"), [
    (["--validation", "v.csv", "--validation-split", "0.1"], "validation data or a validation split"),
    (["--monitor", "loss"], "--monitor only with early stopping"),
    (["--early-stopping", "2", "--monitor", "val_auc"], "validation data to monitor 'val_auc'"),
    (["--model", "m:build", "--hidden", "8"], "only for the default model"),
    (["--class-weight", "{0: 1}"], "'balanced' or a JSON object"),
    (["--hidden", "8,x"], "layer sizes >= 1"),
    (["--validation-split", "1"], "--validation-split"),
    (["--dropout", "1"], "--dropout"),
])
def test_cli_flags_that_exclude_each_other_are_usage_errors(args, message, tmp_path):
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli

    out = CliRunner().invoke(cli, ["train", str(tmp_path / "nothing.csv"), "--label", "y", *args])
    assert out.exit_code == 2, out.output
    assert message in out.output and "Usage:" in out.output


def test_row_ids_are_warned_of_whether_or_not_a_validation_split_is_given(tmp_path):
    """``rownames`` (R's row numbers) is 1..n over the whole data: each part of a split holds only
    some of its values, so neither part alone is a permutation of consecutive numbers."""
    from daskfeed.training._train import train

    rng = np.random.default_rng(5)
    for f in range(8):
        n = 300
        pd.DataFrame({"rownames": np.arange(f * n + 1, (f + 1) * n + 1), "x": rng.normal(size=n),
                      "y": rng.integers(0, 2, n)}).to_csv(tmp_path / f"p{f}.csv", index=False)
    glob_ = str(tmp_path / "p*.csv")

    for split in (None, 0.25):
        with pytest.warns(UserWarning, match=r"look like row ids: 'rownames' \(whole numbers, one "
                                             r"per row\)") as caught:
            train(glob_, label="y", validation_split=split, epochs=1,
                  output=tmp_path / f"out-{split}", echo=lambda line: None, **QUICK)
        assert sum("look like row ids" in str(w.message) for w in caught) == 1  # said once
    with warnings.catch_warnings():  # the user chose the features: nothing to warn of
        warnings.simplefilter("error", UserWarning)
        train(glob_, label="y", validation_split=0.25, epochs=1, features=["x"],
              output=tmp_path / "chosen", echo=lambda line: None, **QUICK)


def test_class_weights_multiply_into_the_sample_weights(data, client, tmp_path):
    """Keras takes class_weight or sample weights: with both, each training row's weight is its
    weight column times its class's weight, batch after batch, the windows left as they were."""
    with _seq(data, client, weight="w", shuffle=False) as seq:
        plain = [seq[i] for i in range(len(seq))]
        seq.on_epoch_end()
        seq.stream.weigh_classes({1: 3.0})
        weighed = [seq[i] for i in range(len(seq))]
        for (_, y, w), (_, y2, w2) in zip(plain, weighed, strict=True):
            assert np.array_equal(y, y2)
            assert np.allclose(w2, w * np.where(y == 1, 3.0, 1.0))
        seq.stream.weigh_classes(None)
        seq.on_epoch_end()
        again = [seq[i] for i in range(len(seq))]
        assert all(np.array_equal(a[2], b[2]) for a, b in zip(plain, again, strict=True))
        with pytest.raises(SettingError, match=r"class ids 0\.\.1"):
            seq.stream.weigh_classes({2: 1.0})
    from daskfeed.training._train import train

    lines: list[str] = []
    result = train(data.glob, label="y", weight="w", class_weight={"1": 3}, epochs=1,
                   model=frozen, output=tmp_path / "out", echo=lines.append, **QUICK)
    assert any("class weights multiplied into the sample weights of 'w'" in line
               for line in lines), lines
    hist = json.loads((tmp_path / "out" / "history.json").read_text())
    assert hist["class_weight"] == {"0": 1.0, "1": 3.0} and hist["sample_weight"] == "w"
    assert len(result.history) == 1
