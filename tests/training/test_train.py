"""Model + training: accuracy against in-memory fit, train() outputs, user model builders."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed.manifest._encoding import Encoding, encode_frame

EPOCHS = 4
BATCH = 512


def _in_memory(pattern, manifest, features):
    df = pd.concat([pd.read_csv(p) for p in sorted(glob.glob(pattern, recursive=True))],
                   ignore_index=True)
    data = encode_frame(df, Encoding.from_manifest(manifest, features))
    return data.x, data.y


def test_fit_matches_in_memory_accuracy(demo_data, client):
    from daskfeed.adapters._keras import keras

    with daskfeed.DaskSequence(demo_data.train_glob, label="cleared", client=client,
                               batch_size=BATCH, seed=1) as train, \
            daskfeed.DaskSequence(demo_data.validate_glob, label="cleared", client=client,
                                  batch_size=BATCH, shuffle=False, reference=train.manifest) as val:
        keras.utils.set_random_seed(1)
        model = daskfeed.default_model(train.manifest)
        model.fit(train, validation_data=val, epochs=EPOCHS, shuffle=False, verbose=0)
        dask_acc = model.evaluate(val, verbose=0, return_dict=True)["accuracy"]

        x, y = _in_memory(demo_data.train_glob, train.manifest, train.features)
        vx, vy = _in_memory(demo_data.validate_glob, train.manifest, train.features)
        keras.utils.set_random_seed(1)
        ref = daskfeed.default_model(train.manifest)
        ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=True, verbose=0)
        mem_acc = ref.evaluate(vx, vy, verbose=0, return_dict=True)["accuracy"]
    print(f"validation accuracy: daskfeed {dask_acc:.4f}, in-memory {mem_acc:.4f}")
    assert mem_acc > 0.7, "the demo label should be learnable"
    assert abs(dask_acc - mem_acc) <= 0.015


def test_train_writes_model_manifest_history(demo_data, tmp_path):
    import psutil

    from daskfeed.adapters._keras import keras
    from daskfeed.training._train import train

    lines: list[str] = []
    out = tmp_path / "out"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = train(demo_data.train_glob, label="cleared", validation=demo_data.validate_glob,
                   epochs=2, batch_size=1024, memory_limit="3GB", nworkers=2,
                   dashboard_address="127.0.0.1:0", output=out, verbose=0, echo=lines.append,
                   tensorboard=tmp_path / "tb")
    # its cluster closed while the outputs were written, and gone when train returns
    left = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, left
    text = "\n".join(lines)
    assert "3GB = 3.00 GB (2.79 GiB): trainer" in text and "2 workers ×" in text
    assert "dashboard: http://127.0.0.1:" in text
    assert re.search(r"daskfeed page: http://127\.0\.0\.1:\d+/daskfeed \(charts: "
                     r"http://127\.0\.0\.1:\d+/daskfeed-charts, Prometheus: "
                     r"http://127\.0\.0\.1:\d+/metrics\)", text), text
    # the closing summary, history.png, TensorBoard's logs
    assert re.search(r"summary: 2 epochs, 80,000 rows trained in [\dhm .]+s wall time", text), text
    assert re.search(r"peak memory of the process tree: [\d.]+ GiB of the 2.79 GiB budget", text), text
    assert (out / "history.png").stat().st_size > 10_000
    assert any((tmp_path / "tb" / "train").iterdir())
    assert "val accuracy:" in text
    model = keras.models.load_model(out / "model.keras")
    assert model.count_params() > 0
    m = daskfeed.Manifest.from_json(out / "manifest.json")
    assert m.rows == demo_data.train_rows
    hist = json.loads((out / "history.json").read_text())
    assert len(hist["epochs"]) == 2
    for rec in hist["epochs"]:
        for key in ("loss", "accuracy", "val_loss", "val_accuracy", "rows", "seconds",
                    "rows_per_s", "data_wait_fraction", "peak_rss_bytes"):
            assert key in rec, key
        assert rec["rows"] == demo_data.train_rows
        assert rec["rows_per_s"] == pytest.approx(rec["rows"] / rec["seconds"], rel=1e-3)
        assert 0 < rec["peak_rss_bytes"] <= 3e9  # trainer + workers inside --memory-limit
    assert result.final["val_accuracy"] == hist["epochs"][-1]["val_accuracy"]
    # second run on the same data reuses the manifest instead of rescanning
    lines.clear()
    train(demo_data.train_glob, label="cleared", epochs=1, memory_limit="3GB", nworkers=1,
          dashboard_address="127.0.0.1:0", output=out, verbose=0, echo=lines.append)
    assert any("manifest reused" in line for line in lines)


def test_epochs_are_numbered_from_1_in_final_history_and_on_screen(id_data, tmp_path, capsys):
    from daskfeed.training._train import train

    out = tmp_path / "out"
    result = train(id_data.train_glob, label="cleared", exclude=["row_id"], epochs=2,
                   batch_size=2048, memory_limit="2GB", nworkers=1, dashboard_address="",
                   output=out, verbose=2, echo=print)
    screen = capsys.readouterr().out
    assert re.findall(r"^Epoch (\d+)/2$", screen, re.M) == ["1", "2"], screen  # Keras' own lines
    hist = json.loads((out / "history.json").read_text())
    assert [r["epoch"] for r in hist["epochs"]] == [1, 2]
    assert result.history == hist["epochs"]  # the same records, numbered the same way
    assert result.final["epoch"] == 2 and result.final == hist["epochs"][-1]


def test_routine_rescans_are_said_as_information_and_nothing_scanned_as_such(tmp_path):
    import shutil

    from daskfeed import write_demo_data
    from daskfeed.training._train import train

    data = write_demo_data(tmp_path / "d", rows=4000, validate_rows=1000, rows_per_file=1000)
    kw = dict(label="cleared", epochs=1, batch_size=1024, memory_limit="2GB", nworkers=1,
              dashboard_address="", cache=tmp_path / "cache", verbose=0)

    def run(output: str) -> list[str]:
        lines: list[str] = []
        train(data.train_glob, output=tmp_path / output, echo=lines.append, **kw)
        return lines

    first = run("out")
    assert any(re.search(r"^train data: .*\(scanned in \d+\.\ds\)$", line) for line in first), first
    files = sorted(glob.glob(data.train_glob, recursive=True))
    shutil.copy(files[0], files[0].replace(".csv", "-late.csv"))  # a new day's file
    again = run("out")  # a routine retrain: the data changed
    [said] = [line for line in again if line.startswith("rescanning: ")]
    assert said == "rescanning: the data changed since the last scan: 1 new file", again
    assert "Expected" not in said and "Received" not in said and "fingerprint" not in said
    assert any(line.startswith("scan: 1 new file") for line in again), again
    elsewhere = run("out2")  # the same files, another output: the last scan's manifest as it was
    assert any(line.startswith("scan: 5 files unchanged") for line in elsewhere), elsewhere
    [data_line] = [line for line in elsewhere if line.startswith("train data: ")]
    assert "(nothing scanned: every part as the last scan found it, in " in data_line, data_line
    assert "scanned in" not in data_line


def test_the_scan_line_has_no_eta_until_it_means_something():
    from daskfeed.training._outputs import scan_bar

    lines: list[str] = []
    show = scan_bar(lines.append)
    show(0, 1_000, 10**9, 30.0, False)  # 0 %: an empty file done, the rest opening
    show(50_000, 3 * 10**8, 10**9, 30.0, False)  # 30 % in 30 s: 70 s left
    show(60_000, 10**9, 10**9, 90.0, False)  # all done: nothing left to estimate
    assert lines == ["scan: 0% of 0.93 GiB, 0 rows, 0 rows/s",
                     "scan: 30% of 0.93 GiB, 50,000 rows, 1,667 rows/s, ETA 70s",
                     "scan: 100% of 0.93 GiB, 60,000 rows, 667 rows/s"], lines
    from daskfeed.core import eta_seconds  # the one rule, the dashboard's too

    assert eta_seconds(4, 100, 60.0) is None and eta_seconds(50, 100, 1.0) is None
    assert eta_seconds(50, 100, 10.0) == 10.0


def test_a_wrong_label_is_said_before_keras_is_imported(demo_data, tmp_path):
    """The cluster, the checks and the scan need no keras: a mistake there costs no TensorFlow load."""
    script = (
        "import sys\n"
        "from daskfeed import SchemaError\n"
        "from daskfeed.training._train import train\n"
        "try:\n"
        f"    train({demo_data.train_glob!r}, label='nope', memory_limit='2GB', nworkers=1,\n"
        f"          dashboard_address='127.0.0.1:0', output={str(tmp_path / 'o')!r}, echo=print)\n"
        "except SchemaError as err:\n"
        "    print('refused:', str(err).splitlines()[0])\n"
        "print('imported:', sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: Expected a label column 'nope' in the data." in proc.stdout, proc.stdout
    assert "memory limit: 2GB" in proc.stdout  # the cluster was started: the check ran after it
    assert "imported: []" in proc.stdout, proc.stdout


def test_user_model_builder_is_called_with_the_manifest(demo_data, tmp_path):
    from daskfeed.training._train import train

    (tmp_path / "mymodels.py").write_text(
        "from daskfeed.adapters._keras import keras\n"
        "calls = []\n"
        "def build(manifest):\n"
        "    calls.append(manifest.rows)\n"
        "    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation='sigmoid')])\n",
        encoding="utf-8")
    result = train(demo_data.train_glob, label="cleared", features=["level", "deaths", "hour"],
                   as_matrix=True, epochs=1, memory_limit="3GB", nworkers=1,
                   dashboard_address="", model=f"{tmp_path / 'mymodels.py'}:build",
                   output=tmp_path / "o", verbose=0, echo=lambda s: None)
    assert "loss" in result.final and "accuracy" in result.final  # compiled for a binary label
    with pytest.raises(daskfeed.SettingError, match="module:function"):
        train(demo_data.train_glob, label="cleared", model="nocolon", output=tmp_path / "p",
              memory_limit="3GB", echo=lambda s: None)


def test_default_model_normalizes_from_the_manifest_without_adapt(demo_data, client):
    m = daskfeed.scan(demo_data.train_glob, label="cleared", client=client)
    model = daskfeed.default_model(m)
    for name in ("level", "gold_spent"):
        layer = model.get_layer(f"norm_{name}")
        assert float(np.ravel(layer.mean)[0]) == pytest.approx(m.columns[name].mean, rel=1e-6)
        assert float(np.ravel(layer.variance)[0]) == pytest.approx(m.columns[name].var, rel=1e-6)
    emb = model.get_layer("embed_region")
    assert emb.input_dim == len(m.columns["region"].vocabulary) + 2  # + missing + OOV
    assert model.output_shape == (None, 1) and model.get_layer("output").activation.__name__ == "sigmoid"


def test_default_model_multiclass_softmax(tmp_path, client):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 2))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "k": np.where(y > 1, "hi", "lo"), "y": y}).to_csv(
        tmp_path / "m.csv", index=False)
    with daskfeed.DaskSequence(str(tmp_path / "m.csv"), label="y", client=client,
                               batch_size=256) as seq:
        assert seq.manifest.task == "multiclass" and seq.manifest.num_classes == 3
        from daskfeed.adapters._keras import keras

        keras.utils.set_random_seed(0)  # the same initial weights every run
        model = daskfeed.default_model(seq.manifest)
        assert model.output_shape == (None, 3)
        hist = model.fit(seq, epochs=5, shuffle=False, verbose=0)
        assert hist.history["accuracy"][-1] > 0.8
        assert seq[0][1].dtype == np.int32


def test_default_model_names_are_unique_whatever_the_column_names(tmp_path, client):
    """Columns whose layer names would collide (``a b``/``a_b``, ``a-b``/``a.b``, a column
    named ``features`` or ``in_a_b``): the model builds, trains, and each column has its input."""
    rng = np.random.default_rng(0)
    n = 600
    cols = {"a b": rng.normal(size=n), "a_b": rng.normal(size=n), "a-b": rng.normal(size=n),
            "a.b": rng.normal(size=n), "features": rng.normal(size=n), "in_a_b": rng.normal(size=n),
            "t x": rng.choice(["p", "q"], size=n), "t_x": rng.choice(["r", "s"], size=n)}
    frame = pd.DataFrame(cols)
    frame["y"] = (frame["a b"] + frame["features"] > 0).astype(int)
    frame.to_csv(tmp_path / "names.csv", index=False)
    with daskfeed.DaskSequence(str(tmp_path / "names.csv"), label="y", client=client,
                               batch_size=100) as seq:
        model = daskfeed.default_model(seq.manifest)
        names = [layer.name for layer in model.layers]
        assert len(names) == len(set(names)), names
        assert sorted(model.input) == sorted(cols)  # one input per column, keyed by its name
        hist = model.fit(seq, epochs=2, shuffle=False, verbose=0)
        assert np.isfinite(hist.history["loss"][-1])


def test_budget_split_and_refusal():
    from daskfeed.cluster._budget import Budget

    b = Budget.split("14GB", nworkers=2)
    assert b.total == 14 * 10**9
    assert b.trainer + 2 * b.worker <= b.total
    assert "14GB = 14.00 GB (13.04 GiB)" in b.describe("14GB")
    assert Budget.split("14GiB", nworkers=2).total == 14 * 2**30
    with pytest.raises(daskfeed.BudgetError, match="at least"):
        Budget.split("1GB", nworkers=4)
    for bad in ["", "-1GB", "abc", "0"]:
        with pytest.raises(daskfeed.BudgetError):
            Budget.split(bad)
    with pytest.raises(daskfeed.BudgetError, match="RAM"):
        Budget.split("100TB")
    assert os.cpu_count()


def test_workers_not_asked_for_are_fewer_when_each_would_have_no_room(monkeypatch):
    """As many workers as cores, while each gets ROOMY_WORKER (640 MiB): at 2GB one worker of
    ~0.69 GiB, not two of 384 MiB that pause for good; asked for, two are two."""
    import daskfeed.cluster._budget as budget

    monkeypatch.setattr(budget, "default_nworkers", lambda: 2)
    two_gb = budget.Budget.split("2GB")
    assert two_gb.nworkers == 1 and two_gb.worker >= budget.ROOMY_WORKER
    assert budget.Budget.split("2GB", nworkers=2).nworkers == 2
    four_gb = budget.Budget.split("4GB")
    assert four_gb.nworkers == 2 and four_gb.worker >= budget.ROOMY_WORKER
