"""Numbers keep their value from the CSV to the batch (issue 11, item 1)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import daskfeed

# each loses its value in float32: 16777216, 16777220, 123456792, 2147483648, 9007199254740992
WIDE = [16777217, 16777219, 123456789, 2147483649, 9007199254740993]


@pytest.fixture(scope="module")
def wide_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("wide") / "ints.csv"
    lines = ["big,small,price,blank_big,y"]
    for i in range(2000):
        v = WIDE[i % 5]
        blank = "" if i % 10 == 3 else str(v)  # whole numbers with blanks: still exact
        lines.append(f"{v},{i % 7},{1.5 + i},{blank},{v}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _all_rows(seq):
    xs, ys = zip(*(seq[i] for i in range(len(seq))), strict=True)
    if isinstance(xs[0], dict):
        return {k: np.concatenate([x[k] for x in xs]) for k in xs[0]}, np.concatenate(ys)
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("cache", [False, True], ids=["parsed", "cached"])
def test_integers_above_2_24_reach_the_batch_exactly(wide_csv, client, tmp_path, cache):
    kw = {"label": "y", "client": client, "batch_size": 300, "shuffle": False,
          "cache": tmp_path / "c" if cache else False}
    for _ in range(2 if cache else 1):  # with the cache: the second sequence reads only Arrow
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with daskfeed.DaskSequence(wide_csv, **kw) as seq:
                x, y = _all_rows(seq)
    expected = np.array(WIDE * 400, dtype=np.int64)
    assert x["big"].dtype == np.int64 and y.dtype == np.int64
    assert np.array_equal(x["big"], expected)
    assert np.array_equal(y, expected)
    assert len(np.unique(x["big"])) == 5  # nothing collapsed
    assert x["small"].dtype == np.float32  # narrow columns stay the model's dtype
    assert np.array_equal(x["price"], (1.5 + np.arange(2000)).astype(np.float32))
    blanks = np.arange(2000) % 10 == 3
    assert x["blank_big"].dtype == np.int64
    assert np.array_equal(x["blank_big"][~blanks], expected[~blanks])


def test_the_scan_warns_naming_the_column_and_largest_value(wide_csv, client):
    with pytest.warns(UserWarning) as record:
        m = daskfeed.scan(wide_csv, label="y", client=client)
    text = "\n".join(str(w.message) for w in record)
    assert "Column 'big' holds values up to 9,007,199,254,740,993" in text
    assert "Label 'y' holds values up to 9,007,199,254,740,993" in text
    assert "'small'" not in text and "'price'" not in text
    assert m.columns["big"].max == 9007199254740993  # exact, not float64's ...992
    assert m.columns["big"].integer and not m.columns["price"].integer


def test_as_matrix_with_a_wide_column_is_float64(wide_csv, client):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with daskfeed.DaskSequence(wide_csv, label="y", client=client, batch_size=500, shuffle=False,
                                   features=["big", "small"], as_matrix=True, cache=False) as seq:
            x, _ = _all_rows(seq)
    assert x.dtype == np.float64
    # float64 holds whole numbers exactly up to 2**53; 9007199254740993 is the one beyond
    assert np.array_equal(x[:4, 0], np.array(WIDE[:4], dtype=np.float64))


def test_the_default_model_takes_wide_columns(wide_csv, client):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with daskfeed.DaskSequence(wide_csv, label="y", client=client, batch_size=500,
                                   exclude=["blank_big"], cache=False) as seq:
            model = daskfeed.default_model(seq.manifest, exclude=["blank_big"])
            assert model.inputs[0].dtype == "int64"
            hist = model.fit(seq, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(hist.history["loss"][0])
