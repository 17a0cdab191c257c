"""serving/: the SavedModel train writes takes raw column values and scores as predict does."""

from __future__ import annotations

import glob
import os

import numpy as np
import pandas as pd
import pytest
from helpers import in_process_budget, write_rows


def test_serving_takes_raw_columns_and_matches_predict(tmp_path) -> None:
    import tensorflow as tf

    from daskfeed.inference._predict import predict
    from daskfeed.training._train import train

    write_rows(str(tmp_path / "train"), n=2000, files=2, seed=0)
    write_rows(str(tmp_path / "held"), n=400, files=2, seed=1, unseen=True)  # unseen colors
    out = str(tmp_path / "out")
    train(str(tmp_path / "train" / "*.csv"), label="cleared", exclude=["row_id"], epochs=1,
          memory_limit="3GB", nworkers=1, output=out, cache=False, verbose=0,
          echo=lambda _line: None)
    assert os.path.isfile(os.path.join(out, "serving", "saved_model.pb"))

    held = pd.concat([pd.read_csv(p, dtype=str, keep_default_na=False)
                      for p in sorted(glob.glob(str(tmp_path / "held" / "*.csv")))])
    assert (held["color"] == "").any() and (held["size"] == "").any()  # blanks: missing
    assert set(held["color"]) - {"red", "green", "blue", "teal", ""}  # out of the vocabulary
    raw = {"color": tf.constant(held["color"].tolist()),
           "size": tf.constant(pd.to_numeric(held["size"]).to_numpy(dtype=np.float64)),
           "count": tf.constant(pd.to_numeric(held["count"]).to_numpy(dtype=np.float64)),
           "day": tf.constant(held["day"].tolist())}
    loaded = tf.saved_model.load(os.path.join(out, "serving"))  # kept: serve uses its variables
    served = loaded.serve(raw)

    scored = predict(out, str(tmp_path / "held" / "*.csv"), memory_limit=in_process_budget(),
                     nworkers=1, quiet=True)
    probs = served["probabilities"].numpy()
    assert probs.shape == (400, 2)
    assert np.abs(probs[:, 1] - scored["probability_1"].to_numpy()).max() <= 1e-5
    assert np.abs(probs[:, 0] - scored["probability_0"].to_numpy()).max() <= 1e-5
    names = [n.decode() for n in served["class_name"].numpy()]
    assert names == [str(v) for v in scored["prediction"]]


def test_export_refuses_a_directory_without_a_run(tmp_path) -> None:
    from daskfeed.core._exceptions import DataNotFoundError
    from daskfeed.inference._serving import export

    with pytest.raises(DataNotFoundError, match="manifest"):
        export(tmp_path)


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
@pytest.mark.parametrize("label", ["medal", "price"])
def test_text_classes_by_name_and_regression_in_label_units(tmp_path, label) -> None:
    import tensorflow as tf

    from daskfeed.inference._predict import predict
    from daskfeed.training._train import train

    rng = np.random.default_rng(0)
    x, c = rng.normal(size=600), rng.choice(["a", "b"], 600)
    data = str(tmp_path / "d.csv")
    pd.DataFrame({"x": x, "c": c, "medal": np.where(x > 0.5, "gold", np.where(
        x > -0.5, "silver", "bronze")), "price": 3000 + 1500 * x}).to_csv(data, index=False)
    out = str(tmp_path / "out")
    train(data, label=label, exclude=["price" if label == "medal" else "medal"], epochs=1,
          memory_limit="3GB", nworkers=1, output=out, cache=False, verbose=0,
          echo=lambda _line: None)
    scored = predict(out, data, memory_limit=in_process_budget(), nworkers=1, quiet=True)
    loaded = tf.saved_model.load(os.path.join(out, "serving"))
    served = loaded.serve({"x": tf.constant(x, tf.float64), "c": tf.constant(c.tolist())})
    if label == "medal":
        assert list(scored.columns) == ["prediction", "probability_bronze", "probability_gold",
                                        "probability_silver"]
        assert [n.decode() for n in served["class_name"].numpy()] == scored["prediction"].tolist()
        assert np.abs(served["probabilities"].numpy()
                      - scored.iloc[:, 1:].to_numpy()).max() <= 1e-5
    else:
        assert abs(scored["prediction"].mean() - 3000) < 1500  # the label's units
        assert np.abs(served["prediction"].numpy() - scored["prediction"].to_numpy()).max() <= 1e-2


def test_a_model_with_a_lookup_table_of_its_own_is_exported_with_it(tmp_path) -> None:
    """A user's model may hold resources beside its variables: an IntegerLookup's table, a table
    of the model itself."""
    import keras
    import tensorflow as tf

    from daskfeed.inference._serving import export
    from daskfeed.training._train import train

    write_rows(str(tmp_path / "train"), n=600, files=1, seed=0)
    out = str(tmp_path / "out")
    train(str(tmp_path / "train" / "*.csv"), label="cleared", exclude=["row_id"], epochs=1,
          memory_limit="3GB", nworkers=1, output=out, cache=False, verbose=0,
          echo=lambda _line: None)
    net = keras.saving.load_model(os.path.join(out, "model.keras"), compile=False)
    color = net.input["color"]
    seen = keras.layers.IntegerLookup(vocabulary=[2, 3, 4, 5, 6], output_mode="int")(color)  # seen: 2..
    known = keras.layers.Reshape((1,))(keras.ops.cast(keras.ops.greater(seen, 0), "float32"))
    mine = keras.Model(net.input, keras.layers.Multiply()([net.output, known]))
    export(out, model=mine, echo=lambda _line: None)
    loaded = tf.saved_model.load(os.path.join(out, "serving"))
    served = loaded.serve_text({"color": tf.constant(["red", "mauve"]),
                                "size": tf.constant(["1.5", "2"]), "count": tf.constant(["3", "4"]),
                                "day": tf.constant(["2024-01-01", "2024-01-02"])})
    probs = served["probabilities"].numpy()
    assert probs[1, 1] == 0.0 and probs[0, 1] > 0.0  # an unseen colour: out of the lookup's table

    class Halved(keras.Model):  # a table held by the model itself, not by one of its layers
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant([1], tf.int64), tf.constant([0.5])), 0.0)

        def call(self, x):
            return self.inner(x) * self.table.lookup(tf.constant(1, tf.int64))

    rows = {"color": tf.constant(["red", "blue"]), "size": tf.constant(["1.5", "2"]),
            "count": tf.constant(["3", "4"]), "day": tf.constant(["2024-01-01", "2024-01-02"])}
    scores = []
    for model in (net, Halved(net)):
        export(out, model=model, echo=lambda _line: None)
        loaded = tf.saved_model.load(os.path.join(out, "serving"))  # (kept while it serves)
        scores.append(loaded.serve_text(rows)["probabilities"].numpy()[:, 1])
    assert np.allclose(scores[1], 0.5 * scores[0], atol=1e-6) and scores[0].min() > 0
