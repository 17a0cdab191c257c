"""serving/: the signature's inputs are named by column, mapped when TensorFlow refuses the name.

The run is real: ``daskfeed train`` and ``daskfeed export`` on a CSV file, ``predict`` on it, the
SavedModel loaded with ``tf.saved_model.load`` and called through its signatures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import in_process_budget


def test_inputs_are_named_by_column_and_mapped_when_tensorflow_refuses_the_name(tmp_path) -> None:
    import tensorflow as tf

    from daskfeed.inference._predict import predict

    rng = np.random.default_rng(3)
    n = 400
    x, y = rng.normal(size=n), rng.normal(size=n)
    frame = pd.DataFrame({"gold spent (€)": np.round(x, 4), "a.b-c/d": np.round(y, 4),
                          "_rank": rng.integers(0, 50, n), "東京": rng.choice(["a", "b"], n),
                          "class": rng.choice(["u", "v"], n)})
    frame["score"] = np.round(x + 2 * y + (frame["東京"] == "a"), 4)
    data = str(tmp_path / "d.csv")
    frame.to_csv(data, index=False)
    out = str(tmp_path / "out")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    cli = [shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"]
    subprocess.run([*cli, "train", data, "--label", "score", "--epochs", "1", "--output", out,
                    "--memory-limit", "3GB", "--nworkers", "1", "--no-cache", "--quiet"],
                   check=True, env=env, capture_output=True, timeout=300)
    export = subprocess.run([*cli, "export", out], check=True, env=env, capture_output=True,
                            text=True, timeout=300)
    assert "inputs.json" in export.stdout

    expected = {"gold spent (€)": "gold_spent____", "a.b-c/d": "a_b_c_d", "_rank": "col__rank",
                "東京": "col___", "class": "col_class"}
    with open(os.path.join(out, "serving", "inputs.json"), encoding="utf-8") as f:
        described = json.load(f)
    assert {i["column"]: i["input"] for i in described["inputs"]} == expected
    assert described["outputs"] == ["prediction"]
    loaded = tf.saved_model.load(os.path.join(out, "serving"))
    for name in ("serve", "serving_default"):
        _, spec = loaded.signatures[name].structured_input_signature
        assert set(spec) == set(expected.values()), name

    scored = predict(out, data, memory_limit=in_process_budget(), nworkers=1, quiet=True)
    text = pd.read_csv(data, dtype=str, keep_default_na=False)
    typed = {expected[c]: tf.constant(frame[c].to_numpy(dtype=np.float64)) if c not in
             ("東京", "class") else tf.constant(text[c].tolist()) for c in expected}
    served = loaded.signatures["serve"](**typed)
    np.testing.assert_allclose(served["prediction"].numpy(), scored["prediction"].to_numpy(),
                               rtol=0, atol=1e-4)
    by_column = loaded.serve({c: typed[expected[c]] for c in expected})  # Python: column names
    np.testing.assert_allclose(by_column["prediction"].numpy(), scored["prediction"].to_numpy(),
                               rtol=0, atol=1e-4)


@pytest.mark.parametrize(("columns", "names"), [
    (["gold spent (€)", "gold_spent____", "gold spent [€]"],
     ["gold_spent_____2", "gold_spent____", "gold_spent_____3"]),
    (["_id", "-x", "a.b", "", "9lives", "é", "class", "None", "match", "Ok_2"],
     ["col__id", "col__x", "a_b", "col_", "col_9lives", "col__", "col_class", "col_None", "match",
      "Ok_2"]),
    (["東京", "大阪", "col___"], ["col____2", "col____3", "col___"]),
])
def test_input_names_are_valid_distinct_and_deterministic(columns, names) -> None:
    from daskfeed.inference._serving import input_names

    assert input_names(columns) == names
