"""What a Keras user meets first from Python and with their own model (issue: day two, item 8).

A validation sequence made from the training sequence keeps its features, ``train(quiet=True)``
is quiet, and a ``--model`` builder is handed the features chosen; a builder whose inputs are
not among them is refused before ``fit`` with one clear message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

import daskfeed


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """4 files: a row id, two features, a 0/1 label that depends on them."""
    root = tmp_path_factory.mktemp("route")
    rng = np.random.default_rng(9)
    for f in range(4):
        n = 500
        x1, x2 = rng.normal(size=n).round(4), rng.normal(size=n).round(4)
        y = (x1 + x2 + rng.logistic(0, 0.3, n) > 0).astype(int)
        pd.DataFrame({"row_id": np.arange(f * n, (f + 1) * n), "x1": x1, "x2": x2, "y": y}).to_csv(
            root / f"part_{f}.csv", index=False)
    return root


def test_a_validation_sequence_of_the_training_sequence_keeps_its_features(logs, client):
    glob = str(logs / "*.csv")
    with daskfeed.DaskSequence(glob, label="y", exclude=["row_id"], client=client,
                               batch_size=128) as train, \
            daskfeed.DaskSequence(glob, label="y", reference=train, client=client, batch_size=128,
                                  shuffle=False) as val:
        assert train.features == ["x1", "x2"] and val.features == train.features
        assert val.reference is train.manifest  # the training statistics encode it
        assert sorted(val[0][0]) == ["x1", "x2"]
        model = daskfeed.default_model(train, hidden=(4,))
        hist = model.fit(train, validation_data=val, epochs=1, shuffle=False, verbose=0)
        assert np.isfinite(hist.history["val_loss"][0])
        chosen = daskfeed.DaskSequence(glob, label="y", reference=train, features=["x1"],
                                       client=client, batch_size=128, shuffle=False)
        with chosen:  # features given: those
            assert chosen.features == ["x1"]


def test_train_quiet_prints_nothing(logs, tmp_path, capsys):
    result = daskfeed.train(str(logs / "*.csv"), label="y", exclude=["row_id"], epochs=1,
                            memory_limit="2GB", nworkers=1, dashboard_address="", cache=False,
                            output=str(tmp_path / "out"), quiet=True)
    assert capsys.readouterr().out == ""
    assert len(result.history) == 1 and (tmp_path / "out" / "model.keras").exists()


BUILDERS = textwrap.dedent('''
    import keras


    def build(manifest, features):
        """Inputs for the features chosen only."""
        inputs = {f: keras.Input(shape=(1,), name=f) for f in features}
        h = keras.layers.Concatenate()(list(inputs.values()))
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(4, activation="relu")(h))
        return keras.Model(inputs, out)


    def build_keyed(manifest, features):
        """Inputs matched by dict key, their tensors named otherwise (Keras allows it)."""
        inputs = {f: keras.Input(shape=(1,), name=f"in_{i}") for i, f in enumerate(features)}
        h = keras.layers.Concatenate()(list(inputs.values()))
        return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))


    def build_all(manifest):
        """Inputs for every column but the label, whatever was chosen."""
        names = [c for c in manifest.columns if c != manifest.label]
        inputs = {f: keras.Input(shape=(1,), name=f) for f in names}
        h = keras.layers.Concatenate()(list(inputs.values()))
        return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
''')


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_a_builder_is_handed_the_features_chosen_and_a_mismatch_is_refused(logs, tmp_path):
    (tmp_path / "mymodels.py").write_text(BUILDERS, encoding="utf-8")
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [exe, "train", str(logs / "*.csv"), "--label", "y", "--exclude", "row_id",
            "--epochs", "1", "--memory-limit", "2GB", "--dashboard-address", "", "--no-cache",
            "--verbose", "0"]
    ok = subprocess.run([*args, "--model", f"{tmp_path / 'mymodels.py'}:build", "--output",
                         str(tmp_path / "ok")], capture_output=True, text=True, env=env,
                        timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "features (2): x1, x2" in ok.stdout and "final: loss" in ok.stdout
    keyed = subprocess.run([*args, "--model", f"{tmp_path / 'mymodels.py'}:build_keyed",
                            "--output", str(tmp_path / "keyed")], capture_output=True, text=True,
                           env=env, timeout=300, cwd=tmp_path)
    assert keyed.returncode == 0, keyed.stderr[-3000:]
    bad = subprocess.run([*args, "--model", f"{tmp_path / 'mymodels.py'}:build_all", "--output",
                          str(tmp_path / "bad")], capture_output=True, text=True, env=env,
                         timeout=300, cwd=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    text = " ".join(bad.stderr.split())
    assert "to be features the batches carry: x1, x2. Received: input(s) 'row_id' that are " \
           "not" in text
    assert "def build(manifest, features)" in text


def test_a_binary_label_reports_auc_precision_and_recall(logs, tmp_path):
    lines: list[str] = []
    result = daskfeed.train(str(logs / "*.csv"), label="y", exclude=["row_id"], epochs=3,
                            batch_size=64, validation_split=0.25, memory_limit="2GB", nworkers=1,
                            dashboard_address="", cache=False, output=str(tmp_path / "out"),
                            echo=lines.append, verbose=0, seed=2)
    rec = result.history[-1]
    for name in ("accuracy", "auc", "precision", "recall"):
        assert 0.0 <= rec[name] <= 1.0 and 0.0 <= rec[f"val_{name}"] <= 1.0, rec
    assert rec["val_auc"] > 0.75  # the label follows x1 + x2: the model ranks rows well
    final = next(line for line in lines if line.startswith("final: "))
    assert all(f"{n} " in final for n in ("auc", "precision", "recall", "val_auc"))
