"""predict scores what training fed, exactly (issue 32, silently wrong items).

- Inputs keep their dtype: Keras' ``model.predict`` narrowed float64 inputs to float32, so a 2013
  date (about 1.38e9 s) moved by up to 64 s and a wide number lost its last digits before the
  model's float64 normalization; predict now equals the model applied to the feed's encoding,
  and ``serving/`` equals predict.
- A block pyarrow reads as text (zoned and naive times mixed, a value that is no date) scores as
  its rows do in blocks of timestamps; a value that is no date or number gets the training mean
  and is counted (the DataFrame's ``attrs["unparsed"]``, the closing line), as serving counts it.

The runs are real: ``train`` on CSV files, ``predict`` and the CLI on a LocalCluster, the
SavedModel loaded with ``tf.saved_model.load``.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest
from helpers import in_process_budget

START = pd.Timestamp("2013-09-20", tz="UTC")
# rows that are no date / no number, appended to the mixed file: (when, gold)
ODD = [("yesterday", "51.5"), ("2013-02-30", "48.0"), ("20130923", "12x"), ("", "50.0")]


def _when(rng: np.random.Generator, zoned: bool) -> str:
    """A time in the four days from 2013-09-20 in one of the ISO 8601 forms pyarrow reads."""
    t = START + pd.Timedelta(seconds=int(rng.integers(0, 4 * 86400)))
    sep = "T" if rng.random() < 0.5 else " "
    frac = f".{int(rng.integers(0, 1000)):03d}" if rng.random() < 0.3 else ""
    if zoned:
        zone = str(rng.choice(["Z", "+02:00", "-05:30", "+0530", "+02"]))
        hours = {"Z": 0, "+02:00": 2, "-05:30": -5.5, "+0530": 5.5, "+02": 2}[zone]
        local = t + pd.Timedelta(hours=hours)
        return f"{local:%Y-%m-%d}{sep}{local:%H:%M:%S}{frac}{zone}"
    if rng.random() < 0.2:
        return f"{t:%Y-%m-%d}"
    return f"{t:%Y-%m-%d}{sep}{t:%H:%M:%S}{frac}"


def _frame(rows: int, seed: int, zoned: bool) -> pd.DataFrame:
    """Rows whose label moves with the date and with the last digits of a wide whole number."""
    rng = np.random.default_rng(seed)
    when = [_when(rng, zoned) for _ in range(rows)]
    utc = pd.to_datetime(pd.Series(when), format="ISO8601", utc=True)
    days = ((utc - START) / pd.Timedelta(days=1)).to_numpy()
    big = rng.integers(10**9, 10**9 + 10**6, rows)
    gold = rng.normal(50, 10, rows)
    hero = rng.choice(["a", "b", "c"], rows)
    score = days + (big - 10**9) / 1e6 + gold / 10 + (hero == "a") + rng.normal(0, 0.05, rows)
    return pd.DataFrame({"when": when, "big": big, "gold": np.round(gold, 3), "hero": hero,
                         "score": np.round(score, 4)})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A regression over a date, a wide whole number, a number and a text column, and held files:
    zoned.csv and naive.csv (dates to pyarrow), mixed.csv (their rows interleaved, with ODD: text)."""
    from daskfeed.training._train import train

    root = tmp_path_factory.mktemp("predict-precision")
    for name, seed in (("train", 0), ("held", 1)):
        os.makedirs(root / name)
        for zoned in (True, False):
            _frame(300, seed + 10 * zoned, zoned).to_csv(
                root / name / f"{'zoned' if zoned else 'naive'}.csv", index=False)
    out = str(root / "out")
    with pytest.warns(UserWarning, match="Column 'big' holds values up to"):  # carried as int64
        train(str(root / "train" / "*.csv"), label="score", epochs=4, memory_limit="3GB",
              nworkers=1, output=out, cache=False, verbose=0, echo=lambda _line: None)
    typed = [str(root / "held" / "zoned.csv"), str(root / "held" / "naive.csv")]
    held = pd.concat([pd.read_csv(p, dtype=str, keep_default_na=False) for p in typed],
                     ignore_index=True)
    order = np.random.default_rng(2).permutation(len(held))  # zoned and naive interleaved
    odd = pd.DataFrame([{"when": w, "big": "1000500000", "gold": g, "hero": "b", "score": "1"}
                        for w, g in ODD])
    mixed = pd.concat([held.iloc[order], odd], ignore_index=True)
    mixed.to_csv(root / "held" / "mixed.csv", index=False)
    return {"out": out, "typed": typed, "mixed": str(root / "held" / "mixed.csv"), "held": held,
            "order": order, "rows": mixed, "root": root}


def _model_on_feed(out: str, files: list[str]) -> np.ndarray:
    """The model called on the files as the feed encodes them (the reader, the feed's encoder)."""
    from daskfeed.adapters import keras
    from daskfeed.inference._scoring import TrainedRun
    from daskfeed.manifest import encode_features
    from daskfeed.reading import Block, ReadOptions, iter_tables

    trained = TrainedRun.open(out)
    net = keras.saving.load_model(trained.model_path, compile=False)
    return np.concatenate([
        net(encode_features(table, trained.encoding), training=False).numpy()[:, 0]
        for i, path in enumerate(files) for table in iter_tables(Block(path, 0, -1, i), ReadOptions())])


def _served(out: str, rows: pd.DataFrame) -> dict:
    import tensorflow as tf

    loaded = tf.saved_model.load(os.path.join(out, "serving"))
    served = loaded.signatures["serve_text"](**{k: tf.constant(rows[k].astype(str).tolist())
                                                for k in ("when", "big", "gold", "hero")})
    return {k: v.numpy() for k, v in served.items()}


def test_predict_equals_the_model_on_the_feeds_encoding_and_serving(run) -> None:
    from daskfeed.inference._predict import predict

    scored = predict(run["out"], run["typed"], memory_limit=in_process_budget(), nworkers=1,
                     quiet=True)
    got = scored["prediction"].to_numpy(dtype=np.float64)
    np.testing.assert_allclose(got, _model_on_feed(run["out"], run["typed"]), rtol=0, atol=1e-6)
    served = _served(run["out"], run["held"])
    np.testing.assert_allclose(served["prediction"], got, rtol=0, atol=1e-5)
    assert not served["unparsed"].any() and scored.attrs["unparsed"] == {}


def test_a_block_read_as_text_scores_as_its_rows_in_blocks_of_dates(run, tmp_path) -> None:
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli
    from daskfeed.reading import Block, ReadOptions, iter_tables

    (table,) = iter_tables(Block(run["mixed"], 0, -1, 0), ReadOptions())
    assert str(table.schema.field("when").type) == "string"  # zoned and naive mixed: text
    out = str(tmp_path / "mixed.csv")
    res = CliRunner().invoke(cli, ["predict", run["out"], run["mixed"], "--output", out,
                                   "--memory-limit", in_process_budget(), "--nworkers", "1",
                                   "--dashboard-address", ""])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    mixed = pd.read_csv(out)["prediction"].to_numpy(dtype=np.float64)
    typed = _model_on_feed(run["out"], run["typed"])
    n = len(run["order"])
    np.testing.assert_allclose(mixed[:n], typed[run["order"]], rtol=0, atol=1e-6)
    # the odd rows: the mean for what is no date or number, as serving reads them, and counted
    served = _served(run["out"], run["rows"])
    np.testing.assert_allclose(served["prediction"], mixed, rtol=0, atol=1e-5)
    assert served["unparsed"][n:].tolist() == [1, 1, 2, 0]
    line = next(ln for ln in res.output.splitlines() if "training mean" in ln)
    assert re.fullmatch(
        r"predict: 4 value\(s\) not missing but not a date or a number were scored with the "
        r"training mean, as missing values are: 'when' 3 \(first 'yesterday' in .*mixed\.csv.*\); "
        r"'gold' 1 \(first '12x' in .*mixed\.csv.*\) \(serving/ counts them in its 'unparsed' "
        r"output\)", line), line


def test_predicts_dataframe_counts_unparsed_values_by_column(run) -> None:
    from daskfeed.inference._predict import predict

    lines: list[str] = []
    scored = predict(run["out"], run["mixed"], memory_limit=in_process_budget(), nworkers=1,
                     echo=lines.append)
    assert scored.attrs["unparsed"] == {"when": 3, "gold": 1}
    assert sum("training mean" in ln for ln in lines) == 1
