"""serving/ parses raw values as predict does: ISO 8601 dates in every form pyarrow reads (zones
converted to UTC), numbers as the reader reads them, unparsed values counted; inputs named by
column.

The runs are real: ``train`` on CSV files, ``predict`` on held-out files, the SavedModel loaded
with ``tf.saved_model.load`` and called through its signatures.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import in_process_budget

CLASSES = ("a", "b", "c")


def _when(rng: np.random.Generator, zoned: bool | None) -> str:
    """A time in the four days from 2013-09-20, in one of the ISO 8601 forms pyarrow reads.

    ``zoned`` None: zoned or not at random (pyarrow leaves a column mixing them as text; the
    reader reads it value by value, a time without a zone as UTC).
    """
    if zoned is None:
        zoned = bool(rng.random() < 0.5)
    day, hour, minute, second = (int(rng.integers(20, 24)), int(rng.integers(0, 24)),
                                 int(rng.integers(0, 60)), int(rng.integers(0, 60)))
    date = f"2013-09-{day:02d}"
    sep = "T" if rng.random() < 0.6 else " "
    frac = f".{int(rng.integers(0, 1000)):03d}" if rng.random() < 0.3 else ""
    if zoned:
        zone = rng.choice(["Z", "+02:00", "-05:30", "+0530", "+02", "-11:45"])
        return f"{date}{sep}{hour:02d}:{minute:02d}:{second:02d}{frac}{zone}"
    form = rng.integers(0, 4)
    if form == 0:
        return date
    if form == 1:
        return f"{date}{sep}{hour:02d}:{minute:02d}"
    return f"{date}{sep}{hour:02d}:{minute:02d}:{second:02d}{frac}"


def _write(path: str, rows: int, seed: int, zoned: bool | None) -> None:
    """CSV rows whose label depends on the time: a date read wrong changes the prediction."""
    rng = np.random.default_rng(seed)
    when = [_when(rng, zoned) for _ in range(rows)]
    utc = pd.to_datetime(pd.Series(when), format="ISO8601", utc=True)
    hours = ((utc - pd.Timestamp("2013-09-20", tz="UTC")) / pd.Timedelta(hours=1)).to_numpy()
    gold = rng.normal(50, 10, rows)
    cls = rng.choice(CLASSES, rows)
    score = hours / 24 + gold / 10 + (cls == "a") + rng.normal(0, 0.1, rows)
    pd.DataFrame({"when": when, "gold": np.round(gold, 3), "hero": cls,
                  "score": np.round(score, 4)}).to_csv(path, index=False)


# what a client may send that is not a date or a number: each row of odd.csv, with the number
# of values predict gives the mean although they are not missing (0: missing, as predict reads)
ODD = [
    ("not a date", "3.5", "a", 1),
    ("", "12x", "b", 1),       # a stray token in a number column
    ("2013-02-30", "", "c", 1),  # no such day
    ("2013-09-23T25:00:00Z", "NA", "a", 1),  # no such hour; NA: a missing number
    ("yesterday", "oops", "b", 2),
    ("", "", "c", 0),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A regression run over a date, a number and a text column; predict's scores of held rows."""
    import tensorflow as tf

    from daskfeed.inference._predict import predict
    from daskfeed.training._train import train

    root = tmp_path_factory.mktemp("serving-parsing")
    for name, seed in (("train", 0), ("held", 1)):
        os.makedirs(root / name)
        _write(str(root / name / "zoned.csv"), 300, seed, zoned=True)
        _write(str(root / name / "naive.csv"), 300, seed + 10, zoned=False)
        _write(str(root / name / "mixed.csv"), 300, seed + 20, zoned=None)
    # the odd values sit in a file of their own: pyarrow reads a date column holding one as
    # text, which the feed's encoder reads value by value (daskfeed.manifest._encoding)
    pd.DataFrame([(w, g, c, 1.0) for w, g, c, _ in ODD],
                 columns=["when", "gold", "hero", "score"]).to_csv(root / "held" / "odd.csv",
                                                                    index=False)
    out = str(root / "out")
    train(str(root / "train" / "*.csv"), label="score", epochs=3, memory_limit="3GB",
          nworkers=1, output=out, cache=False, verbose=0, echo=lambda _line: None)
    files = sorted(glob.glob(str(root / "held" / "*.csv")))
    scored = predict(out, files, memory_limit=in_process_budget(), nworkers=1, quiet=True)
    held = pd.concat([pd.read_csv(p, dtype=str, keep_default_na=False) for p in files],
                     ignore_index=True)
    assert len(held) == len(scored)
    return {"out": out, "held": held, "scored": scored["prediction"].to_numpy(),
            "feed": _feed_scores(out, files), "odd": held.index[held["score"] == "1.0"].to_numpy(),
            "model": tf.saved_model.load(os.path.join(out, "serving"))}


def _feed_scores(out: str, files: list[str]) -> np.ndarray:
    """predict's scores, computed here: the files read and encoded as predict does (pyarrow, the
    reader's markers, the feed's encoder), the model called on them."""
    from daskfeed.adapters import keras
    from daskfeed.inference._scoring import TrainedRun
    from daskfeed.manifest import encode_features
    from daskfeed.reading import Block, ReadOptions, iter_tables

    trained = TrainedRun.open(out)
    net = keras.saving.load_model(trained.model_path, compile=False)
    return np.concatenate([
        net(encode_features(table, trained.encoding), training=False).numpy()[:, 0]
        for i, path in enumerate(files) for table in iter_tables(Block(path, 0, -1, i), ReadOptions())])


def _same(served, run: dict, rows) -> None:
    """Served predictions equal predict's: the model on the feed's encoding (float32 rounding).
    predict feeds float64 dates as float64 (Keras' ``model.predict`` narrowed them to float32:
    seconds since 1970 moved by up to 64 s in 2013, 2e-3 here)."""
    got = served["prediction"].numpy()
    np.testing.assert_allclose(got, run["feed"][rows], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, run["scored"][rows], rtol=0, atol=1e-5)


def _typed(held: pd.DataFrame) -> dict:
    """``serve``'s inputs: numbers as float64 (what the client could not read: NaN), else text."""
    import tensorflow as tf

    gold = pd.to_numeric(held["gold"], errors="coerce").to_numpy(dtype=np.float64)
    return {"when": tf.constant(held["when"].tolist()), "gold": tf.constant(gold),
            "hero": tf.constant(held["hero"].tolist())}


def test_served_dates_in_every_iso_form_match_predict(run) -> None:
    import tensorflow as tf

    held, loaded = run["held"], run["model"]
    zoned = held["when"].str.contains(r"(?:Z|[+-]\d\d(?::?\d\d)?)$")
    assert zoned.sum() > 200 and (held["when"].str.len() == 10).sum() > 50  # date-only
    assert held["when"].str.contains(r"\.\d+").sum() > 50  # fractional seconds
    rows = held.index[held["score"] != "1.0"]  # the rows of zoned.csv, naive.csv and mixed.csv
    inputs = _typed(held.loc[rows])
    _same(loaded.serve(inputs), run, rows)  # the Python call, by column name
    served = loaded.signatures["serve"](**inputs)
    _same(served, run, rows)
    assert not served["unparsed"].numpy().any()
    text = loaded.signatures["serve_text"](**{k: tf.constant(held.loc[rows, k].tolist())
                                              for k in ("when", "gold", "hero")})
    _same(text, run, rows)


def test_unparsed_values_are_counted_and_filled_as_predict_fills_them(run) -> None:
    import tensorflow as tf

    held, loaded, odd = run["held"], run["model"], run["odd"]
    text = loaded.signatures["serve_text"](**{k: tf.constant(held[k].tolist())
                                              for k in ("when", "gold", "hero")})
    _same(text, run, held.index)
    counts = text["unparsed"].numpy()
    assert counts[odd].tolist() == [n for *_, n in ODD]
    assert not np.delete(counts, odd).any()
    columns = [c.decode() for c in text["unparsed_columns"].numpy()[odd]]
    assert columns == ["when", "gold", "when", "when", "when,gold", ""]
    # serve: the client reads the numbers (12x: NaN, missing); a text date is still counted
    typed = loaded.signatures["serve"](**_typed(held.loc[odd]))
    _same(typed, run, odd)
    assert typed["unparsed"].numpy().tolist() == [1, 0, 1, 1, 1, 0]


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
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
    assert described["outputs"] == ["prediction", "unparsed", "unparsed_columns"]
    loaded = tf.saved_model.load(os.path.join(out, "serving"))
    for name in ("serve", "serve_text", "serving_default"):
        _, spec = loaded.signatures[name].structured_input_signature
        assert set(spec) == set(expected.values()), name

    scored = predict(out, data, memory_limit=in_process_budget(), nworkers=1, quiet=True)
    text = pd.read_csv(data, dtype=str, keep_default_na=False)
    served = loaded.signatures["serve_text"](**{expected[c]: tf.constant(text[c].tolist())
                                               for c in expected})
    np.testing.assert_allclose(served["prediction"].numpy(), scored["prediction"].to_numpy(),
                               rtol=0, atol=1e-4)
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


# ----------------------------------------------------------------------------- value by value
# each value alone in a block, as predict reads it; the values pyarrow reads as text get the
# mean in predict (the feed's encoder counts them) and serving counts them
DATES_READ = [
    "2013-09-23", "2012-02-29", "2000-02-29", "0000-01-01", "9999-12-31T23:59:59", " 2013-09-23",
    "2013-09-23T21", "2013-09-23 21:05", "2013-09-23T21:00:00", "2013-09-23T21:00:00Z",
    "2013-09-23T21Z", "2013-09-23T21:00Z", "2013-09-23T21:00:00+02", "2013-09-23T21:00:00+0230",
    "2013-09-23T21:00:00+02:30", "2013-09-23T21:00:00-05:30", "2013-09-23T21:00:00+23:59",
    "2013-09-23T21:00:00-00:00", "2013-09-23T21-05", "2013-09-23T21+02:00",
    "2013-09-23T21:00:00.5", "2013-09-23 21:00:00.25Z", "2013-09-23T21:00:00.123456789",
    "2013-09-23T21:00:00.000", "1969-12-31T23:59:59.5", "2013-09-23T21:00:00.5+0200",
    "2013-09-23T21:00:00.5-05", "1677-09-22T00:00:00.25", "2262-04-10T23:59:59.999999999",
]
DATES_NOT = [
    "not a date", "NA", "2013-02-29", "1900-02-29", "2013-00-10", "2013-09-00", "2013-13-01",
    "2013-09-23T24:00:00", "2013-09-23T23:59:60", "2013-09-23T21:60", "2013-09-23T21:0",
    "2013-09-23T2100", "2013-09-23t21:00", "2013-09-23T21:00:00z", "2013-09-23T21:00:00.",
    "2013-09-23T21:00:00.1234567891", "2013-09-23T21:00:00+24", "2013-09-23T21:00:00+02:60",
    "2013-09-23T21:00:00+2:00", "2013-09-23T21:00:00 +02:00", "2013-09-23T21:00:00+02:00:00",
    "2013-9-23", "+2013-09-23", "2013-09-23TZ", "2013-09-23Z", "20130923",
]
NUMBERS_READ = [
    "5", " 5", "5 ", "\t7", "+5", "-0", "00012", "1e5", "1E+5", ".5", "5.", "+.5e-3", "1.5E3",
    "-2.25", "123456789012345678", "99999999999999999999", "1e-400", "0x10", "0X10", "0x1F",
    "0xffffffffffffffff", "true", "True", "TRUE", "false", "tRue",
]
NUMBERS_INFINITE = ["inf", "-inf", "Infinity", "INF", "iNf", "+inf", "5e400"]
NUMBERS_MISSING = ["", "  ", "NA", "N/A", "NULL", "null", "None", "nan", "NaN", "NAN", "-nan",
                   "+nan", "#N/A", "missing"]
NUMBERS_NOT = ["12x", "oops", "1_000", "1 000", "--5", "1.5e", "0x", "-0x10", "+0x10", "0x10.5",
               "٣", "t", "yes", "1d", "1.2.3", "e5", "."]
FILL = -7.0  # the training mean of these columns: told apart from any value read


def _predict_reads(tmp_path, values: list[str], code, na_values: tuple[str, ...]) -> list:
    """Each value as predict encodes it alone in a block, and the type pyarrow gave the block."""
    from daskfeed.manifest import Encoding, encode_features
    from daskfeed.reading import Block, ReadOptions, iter_tables

    encoding = Encoding("y", "float32", (code,))
    found = []
    for i, value in enumerate(values):
        path = str(tmp_path / f"v{i}.csv")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"a,y\n{value},1\n")
        (table,) = iter_tables(Block(path, 0, -1, 0), ReadOptions(na_values=na_values))
        found.append((str(table.schema.field("a").type), encode_features(table, encoding)["a"][0]))
    return found


def _serve_reads(values: list[str], code, na_values: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Each value as serve_text encodes it, and whether it was counted as unparsed."""
    import tensorflow as tf

    from daskfeed.inference._scoring import Scorer
    from daskfeed.inference._serving import _Serve
    from daskfeed.manifest import Encoding

    scorer = Scorer("", 0, Encoding("y", "float32", (code,)), "regression", None, False)
    x, unparsed = _Serve(None, scorer, list(na_values)).encode({"a": tf.constant(values)})
    return x["a"].numpy(), unparsed.numpy()[:, 0]


def test_each_date_reads_as_pyarrow_reads_it_zones_in_utc(tmp_path) -> None:
    from daskfeed.manifest import ColumnCode

    code = ColumnCode("a", "datetime", FILL, (), "float64")
    values, unparsed = _serve_reads(DATES_READ + DATES_NOT + ["", "gone"], code, ("gone",))
    read = _predict_reads(tmp_path, DATES_READ, code, ())
    assert [t for t, _ in read if not t.startswith("timestamp")] == []
    assert values[:len(DATES_READ)].tolist() == [v for _, v in read]  # exactly, fractions too
    assert not unparsed[:len(DATES_READ)].any()
    rejected = _predict_reads(tmp_path, DATES_NOT, code, ())
    assert {t for t, _ in rejected} <= {"string", "int64"}  # not a date to pyarrow, nor the scan
    assert values[len(DATES_READ):].tolist() == [FILL] * (len(DATES_NOT) + 2)
    assert unparsed[len(DATES_READ):].tolist() == [True] * len(DATES_NOT) + [False, False]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_each_number_reads_as_pyarrow_reads_it_and_markers_are_missing(tmp_path, dtype) -> None:
    from daskfeed.manifest import ColumnCode

    code = ColumnCode("a", "numeric", FILL, (), dtype)
    read = NUMBERS_READ
    missing = [*NUMBERS_MISSING, *NUMBERS_INFINITE, "-999", "-999.0"]  # inf: missing, as NaN
    values, unparsed = _serve_reads(read + missing + NUMBERS_NOT, code, ("missing", "-999"))
    # the reader fails on a block of integers beyond 2**53 when a null marker is a number
    # (pyarrow compares them as float64), so the values are read without the marker -999
    predicted = [v for _, v in _predict_reads(tmp_path, read + NUMBERS_NOT, code, ("missing",))]
    predicted[len(read):len(read)] = [v for _, v in _predict_reads(
        tmp_path, missing, code, ("missing", "-999"))]
    assert values.tolist() == predicted
    fill = np.dtype(dtype).type(FILL)
    assert values[len(read):].tolist() == [fill] * (len(missing) + len(NUMBERS_NOT))
    assert unparsed.tolist() == [False] * (len(read) + len(missing)) + [True] * len(NUMBERS_NOT)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_numbers_in_a_block_pyarrow_leaves_as_text_read_as_serving_reads_them(tmp_path, dtype) -> None:
    """One block holding every kind of number and some text (pyarrow reads it as a string
    column): predict reads each value as serving reads it, and counts the same ones unparsed."""
    from daskfeed.manifest import ColumnCode, Encoding, encode_features
    from daskfeed.reading import Block, ReadOptions, iter_tables

    code = ColumnCode("a", "numeric", FILL, (), dtype)
    values = NUMBERS_READ + NUMBERS_INFINITE + NUMBERS_MISSING[2:] + NUMBERS_NOT
    path = tmp_path / "mixed.csv"
    path.write_text("a,y\n" + "".join(f'"{v}",1\n' for v in values), encoding="utf-8")
    (table,) = iter_tables(Block(str(path), 0, -1, 0), ReadOptions())
    assert str(table.schema.field("a").type) == "string"
    unparsed: dict[str, np.ndarray] = {}
    predicted = encode_features(table, Encoding("y", "float32", (code,)), unparsed=unparsed)["a"]
    served, served_unparsed = _serve_reads(values, code, ())
    assert predicted.tolist() == served.tolist()
    assert unparsed["a"].tolist() == served_unparsed.tolist()
    at = len(NUMBERS_READ)  # infinities: missing (the fill), not unparsed
    fill = np.dtype(dtype).type(FILL)
    assert served[at:at + len(NUMBERS_INFINITE)].tolist() == [fill] * len(NUMBERS_INFINITE)
    assert not served_unparsed[at:at + len(NUMBERS_INFINITE)].any()
