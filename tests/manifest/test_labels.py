"""Labels as users have them: a price in the thousands (regression in the label's units), text
class labels, and the files they come in (TSV, ';', a row-number column)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed.adapters._keras import keras


@pytest.fixture(scope="module")
def prices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """price = 3000 + 1500·x1 − 800·x2 + noise (sd 100): 4 training files and 1 held out."""
    root = tmp_path_factory.mktemp("prices")
    rng = np.random.default_rng(11)
    paths = {}
    for name, files in (("train", 4), ("test", 1)):
        for i in range(files):
            n = 2000
            x1, x2 = rng.normal(size=n), rng.normal(size=n)
            price = np.round(3000 + 1500 * x1 - 800 * x2 + rng.normal(0, 100, n), 2)
            pd.DataFrame({"x1": x1, "x2": x2, "price": price}).to_csv(
                root / f"{name}_{i}.csv", index=False)
        paths[name] = str(root / f"{name}_*.csv")
    return paths


def test_regression_learns_prices_in_their_units(prices: dict[str, str], client) -> None:
    keras.utils.set_random_seed(0)
    with daskfeed.DaskSequence(prices["train"], label="price", batch_size=128, client=client,
                               cache=False) as train, \
            daskfeed.DaskSequence(prices["test"], label="price", batch_size=1000, client=client,
                                  shuffle=False, reference=train.manifest, cache=False) as test:
        model = daskfeed.default_model(train)
        assert not model.get_layer("label_units").weights  # a fixed rescale, nothing to train
        model.fit(train, epochs=4, shuffle=False, verbose=0)
        x, y = _all_batches(test)
        pred = model.predict(x, verbose=0)[:, 0]
    baseline = np.abs(y - train.manifest.columns["price"].mean).mean()
    mae = np.abs(pred - y).mean()
    assert mae < 0.3 * baseline, (mae, baseline)
    # saved and read back, the model still predicts prices (the rescale is part of it)
    reloaded = keras.saving.load_model(_saved(model))
    np.testing.assert_allclose(reloaded.predict(x, verbose=0)[:, 0], pred, rtol=1e-5, atol=1e-3)


@pytest.fixture(scope="module")
def medals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A text label (bronze / silver / gold from x1 + x2/2); a validation file with 'platinum'."""
    root = tmp_path_factory.mktemp("medals")
    rng = np.random.default_rng(5)

    def rows(n: int) -> pd.DataFrame:
        x1, x2 = rng.normal(size=n), rng.normal(size=n)
        z = x1 + 0.5 * x2 + rng.normal(0, 0.3, n)
        medal = np.where(z > 0.7, "gold", np.where(z > -0.5, "silver", "bronze"))
        return pd.DataFrame({"x1": x1, "x2": x2, "team": rng.choice(["red", "blue"], n),
                             "medal": medal})

    for i in range(3):
        rows(2000).to_csv(root / f"train_{i}.csv", index=False)
    rows(1000).to_csv(root / "valid.csv", index=False)
    bad = rows(500)
    bad.loc[137, "medal"] = "platinum"
    bad.to_csv(root / "valid_bad.csv", index=False)
    return {"train": str(root / "train_*.csv"), "valid": str(root / "valid.csv"),
            "bad": str(root / "valid_bad.csv")}


def test_text_label_trains_on_class_codes(medals: dict[str, str], client) -> None:
    keras.utils.set_random_seed(0)
    with daskfeed.DaskSequence(medals["train"], label="medal", batch_size=256, client=client,
                               cache=False, shuffle=False) as train:
        m = train.manifest
        assert (m.task, m.classes) == ("multiclass", ["bronze", "gold", "silver"])
        truth = pd.concat(pd.read_csv(medals["train"].replace("*", str(i))) for i in range(3))
        assert m.label_counts == truth["medal"].value_counts().sort_index().to_dict()
        # every row's code is its class: rows matched by x1 (float32 in the batches)
        x, y = _all_batches(train)
        got = np.asarray(m.classes)[y][np.argsort(x["x1"], kind="stable")]
        want = truth.assign(x1=truth["x1"].astype("float32")).sort_values("x1", kind="stable")
        assert (got == want["medal"].to_numpy()).all()
        # class weights by class name; balanced from the exact counts
        assert m.class_weights({"gold": 3}) == {0: 1.0, 1: 3.0, 2: 1.0}
        with pytest.raises(daskfeed.SchemaError, match="platinum"):
            m.class_weights({"platinum": 2})
        balanced = m.class_weights("balanced")
        assert balanced[1] == pytest.approx(len(truth) / (3 * (truth["medal"] == "gold").sum()))
        with daskfeed.DaskSequence(medals["valid"], label="medal", batch_size=1000, client=client,
                                   reference=m, shuffle=False, cache=False) as valid:
            model = daskfeed.default_model(train)
            assert model.output_shape == (None, 3)
            hist = model.fit(train, validation_data=valid, epochs=4, shuffle=False, verbose=0,
                             class_weight=balanced)
        assert hist.history["val_accuracy"][-1] > 0.75, hist.history
        with pytest.raises(daskfeed.DataError, match=r"(?s)'platinum'.*valid_bad.csv line 139"):
            daskfeed.DaskSequence(medals["bad"], label="medal", client=client, reference=m,
                                  cache=False)


@pytest.mark.parametrize("sep", ["\t", ";"])
def test_a_one_column_header_suggests_the_delimiter(medals, sep, tmp_path, client) -> None:
    path = tmp_path / "medals.txt"
    pd.read_csv(medals["valid"]).to_csv(path, sep=sep, index=False)
    with pytest.raises(daskfeed.SchemaError, match=re.escape(f"--sep {sep!r}")):
        daskfeed.scan(str(path), label="medal", client=client)
    m = daskfeed.scan(str(path), label="medal", client=client, sep=sep)
    assert m.classes == ["bronze", "gold", "silver"] and m.rows == 1000


def test_columns_that_look_like_row_ids_are_named(tmp_path, client) -> None:
    rng = np.random.default_rng(2)
    n = 400
    frame = pd.DataFrame({"n": rng.permutation(n), "user_id": rng.integers(0, 50, n),
                          "token": [f"t{i:05d}" for i in rng.permutation(n)],
                          "city": rng.choice(["a", "b"], n), "x": rng.normal(size=n),
                          "y": rng.integers(0, 2, n)})
    frame.to_csv(tmp_path / "ids.csv")  # pandas writes its row numbers under an empty header
    with pytest.warns(UserWarning, match="look like row ids") as caught:
        seq = daskfeed.DaskSequence(str(tmp_path / "ids.csv"), label="y", client=client, cache=False)
    seq.close()
    flagged = [ln.split()[0] for ln in seq.manifest.column_lines() if "looks like a row id" in ln]
    assert flagged == ["numeric", "n", "user_id", "token"]  # the unnamed column's line starts blank
    msg = next(str(w.message) for w in caught if "row ids" in str(w.message))
    for name in ("''", "'n'", "'user_id'", "'token'"):
        assert name in msg, msg
    assert "'city'" not in msg and "'x'" not in msg
    assert "--exclude ,n,token,user_id" in msg
    with daskfeed.DaskSequence(str(tmp_path / "ids.csv"), label="y", client=client, cache=False,
                               exclude=["", "n", "token", "user_id"]) as seq:
        assert seq.features == ["city", "x"]


def test_cli_semicolons_text_label_and_an_unnamed_column(medals, tmp_path) -> None:
    data = tmp_path / "medals.csv"
    pd.read_csv(medals["valid"]).to_csv(data, sep=";")  # with pandas' unnamed row numbers
    out = tmp_path / "out"
    exe = os.path.join(os.path.dirname(sys.executable), "daskfeed")
    proc = subprocess.run(
        [exe, "train", str(data), "--label", "medal", "--sep", ";", "--exclude", "",
         "--class-weight", '{"gold": 2}', "--epochs", "1", "--nworkers", "1", "--memory-limit",
         "3GB", "--no-cache", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "row ids" not in proc.stdout + proc.stderr
    assert "features (3): x1, x2, team" in proc.stdout
    assert "): bronze: 1, gold: 2, silver: 1" in proc.stdout  # class weights echoed by name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["label_classes"] == ["bronze", "gold", "silver"]
    history = json.loads((out / "history.json").read_text())
    assert history["class_weight"] == {"0": 1.0, "1": 2.0, "2": 1.0}


def _all_batches(seq: daskfeed.DaskSequence) -> tuple[dict[str, np.ndarray], np.ndarray]:
    batches = [seq[i] for i in range(len(seq))]
    x = {k: np.concatenate([b[0][k] for b in batches]) for k in batches[0][0]}
    return x, np.concatenate([b[1] for b in batches])


def _saved(model: keras.Model) -> str:
    import tempfile

    path = tempfile.mkdtemp(prefix="daskfeed-labels-") + "/model.keras"
    model.save(path)
    return path
