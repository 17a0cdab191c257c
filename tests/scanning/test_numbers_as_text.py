"""Numbers the reader would take for text: decimal commas (``--decimal``) and stray tokens.

Either used to become a text column of thousands of categories without a word (a numeric label:
a classifier of as many classes). Now the scan refuses them naming the values and the flag that
reads them, and ``decimal=","`` reads such numbers in the scan, the feed and ``predict`` alike.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskfeed
from daskfeed import SchemaError, SettingError


def _comma_file(path, rows=400, seed=3):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"a": rng.normal(5, 2, rows).round(3), "b": rng.integers(0, 50, rows),
                       "y": rng.normal(10, 3, rows).round(2)})
    df.to_csv(path, sep=";", decimal=",", index=False)
    return pd.read_csv(path, sep=";", decimal=",")


def test_decimal_commas_are_refused_with_the_flag_that_reads_them(tmp_path, client):
    _comma_file(tmp_path / "dc.csv")
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(str(tmp_path / "dc.csv"), label="y", sep=";", client=client)
    text = str(err.value)
    assert text.startswith("Expected numbers with the decimal point '.' in column 'a'. Received: "
                           "numbers written with a decimal comma (")
    assert "400 of 400 values) in block 0" in text and "dc.csv" in text
    assert "--decimal , (decimal=',')" in text and "--dtype a=string" in text


def test_decimal_comma_reads_the_numbers_in_the_scan_and_the_feed(tmp_path, client):
    frame = _comma_file(tmp_path / "dc.csv")
    m = daskfeed.scan(str(tmp_path / "dc.csv"), label="y", sep=";", decimal=",", client=client)
    assert m.task == "regression" and m.read_options["decimal"] == ","
    assert [m.columns[c].kind for c in ("a", "b", "y")] == ["numeric"] * 3
    assert m.columns["a"].mean == pytest.approx(frame["a"].mean(), rel=1e-12)
    assert m.columns["y"].var == pytest.approx(frame["y"].var(ddof=0), rel=1e-9)
    with daskfeed.DaskSequence(str(tmp_path / "dc.csv"), label="y", sep=";", decimal=",",
                               client=client, batch_size=100, shuffle=False) as seq:
        a = np.concatenate([seq[i][0]["a"] for i in range(len(seq))])
        y = np.concatenate([seq[i][1] for i in range(len(seq))])
    assert np.allclose(np.sort(a), np.sort(frame["a"].to_numpy()))
    assert np.allclose(np.sort(y), np.sort(frame["y"].to_numpy()))


def test_decimal_comma_with_null_markers_still_reads_numbers(tmp_path, client):
    """A column with NA markers is read as text first, then converted: the comma too."""
    (tmp_path / "na.csv").write_text("a;y\n" + "".join(
        f"{'NA' if i % 10 == 0 else f'{i},5'};{i % 2}\n" for i in range(200)), encoding="utf-8")
    m = daskfeed.scan(str(tmp_path / "na.csv"), label="y", sep=";", decimal=",", client=client)
    col = m.columns["a"]
    assert col.kind == "numeric" and col.missing == 20 and col.missing_markers == {"NA": 20}
    want = np.array([i + 0.5 for i in range(200) if i % 10])
    assert col.mean == pytest.approx(want.mean(), rel=1e-12)


def test_a_decimal_point_that_is_the_separator_is_refused(tmp_path, client):
    _comma_file(tmp_path / "dc.csv")
    with pytest.raises(SettingError, match=r"other than the separator \(','\).*decimal=','"):
        daskfeed.scan(str(tmp_path / "dc.csv"), label="y", decimal=",", client=client)


def test_a_stray_token_in_a_column_of_numbers_is_refused_then_read_as_missing(tmp_path, client,
                                                                             write_csv):
    rows = [f"{i * 0.37:.3f},{i % 5},{i % 2}" for i in range(3000)]
    rows[1500] = "?,1,0"
    write_csv("stray.csv", "x,z,y\n" + "\n".join(rows) + "\n")
    data = str(tmp_path / "stray.csv")
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(data, label="y", client=client)
    assert str(err.value).startswith(
        "Expected numbers in column 'x'. Received: 2,999 numbers and 1 other value(s) '?' (1), "
        f"which would make the whole column text categories: '?' on line 1,502 of {data} "
        "(column 'x', field 1).\n")
    assert "--na-values ? (na_values=['?'])" in str(err.value)
    m = daskfeed.scan(data, label="y", na_values=["?"], client=client)
    assert m.columns["x"].kind == "numeric" and m.columns["x"].missing_markers == {"?": 1}
    kept = daskfeed.scan(data, label="y", dtype={"x": "string"}, client=client)  # asked for text
    assert kept.columns["x"].kind == "categorical"


def test_a_stray_token_among_more_numbers_than_are_counted_exactly_is_refused_too(tmp_path, client,
                                                                                write_csv):
    """Past 50,000 distinct values the scan keeps the most frequent counts only: a rare '?' is not
    among them, and the column was made text categories without a word."""
    rows = [f"{i * 0.001:.3f},{i % 2}" for i in range(60_000)]  # 60,000 distinct numbers, one block
    rows[58_000] = "?,1"
    data = write_csv("many.csv", "x,y\n" + "\n".join(rows) + "\n")
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(data, label="y", client=client)
    text = str(err.value)
    assert text.startswith("Expected numbers in column 'x'. Received: about 60,000 numbers and other "
                           "values, among them '?', which would make the whole column text categories: "
                           f"'?' first on line 58,002 of {data} (column 'x', field 1).\n"), text
    assert "--na-values ? (na_values=['?'])" in text
    m = daskfeed.scan(data, label="y", na_values=["?"], client=client)
    assert m.columns["x"].kind == "numeric" and m.columns["x"].missing_markers == {"?": 1}


def test_text_that_holds_some_numbers_stays_text(tmp_path, client, write_csv):
    words = ["red", "green", "blue", "12", "7"]
    write_csv("t.csv", "c,y\n" + "".join(f"{words[i % 5]},{i % 2}\n" for i in range(500)))
    m = daskfeed.scan(str(tmp_path / "t.csv"), label="y", client=client)
    assert m.columns["c"].kind == "categorical"


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_cli_trains_a_regression_on_decimal_commas_and_refuses_without_the_flag(tmp_path):
    _comma_file(tmp_path / "dc.csv")
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [exe, "train", str(tmp_path / "dc.csv"), "--label", "y", "--sep", ";", "--epochs", "1",
            "--memory-limit", "2GB", "--dashboard-address", "", "--verbose", "0", "--no-cache"]
    out = subprocess.run([*args, "--output", str(tmp_path / "no")], capture_output=True,
                         text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "--decimal ," in out.stderr
    out = subprocess.run([*args, "--decimal", ",", "--output", str(tmp_path / "ok")],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "label 'y': regression" in out.stdout and "final: loss" in out.stdout
    scored = subprocess.run([exe, "predict", str(tmp_path / "ok"), str(tmp_path / "dc.csv"),
                             "--output", str(tmp_path / "p.csv"), "--memory-limit", "2GB",
                             "--nworkers", "1"], capture_output=True, text=True, env=env,
                            timeout=300, cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    p = pd.read_csv(tmp_path / "p.csv")  # predict reads with the run's decimal point
    assert len(p) == 400 and np.isfinite(p["prediction"]).all()
    assert p["prediction"].std() > 0  # the features were read as numbers, not all missing


def test_with_a_decimal_comma_dots_group_thousands(tmp_path, client, write_csv):
    write_csv("g.csv", "a;y\n1.234,5;0\n2.000;1\n3,25;0\n-1.000.000,5;1\n")
    m = daskfeed.scan(str(tmp_path / "g.csv"), label="y", sep=";", decimal=",", client=client)
    col = m.columns["a"]
    assert col.kind == "numeric" and col.min == pytest.approx(-1_000_000.5)
    assert col.max == pytest.approx(2000.0)
    assert col.mean == pytest.approx((1234.5 + 2000 + 3.25 - 1_000_000.5) / 4)


def test_us_thousands_separators_are_not_taken_for_a_decimal_comma(tmp_path, client, write_csv):
    write_csv("t.csv", "a;y\n" + "".join(f"{i},{i * 7 % 1000:03d};{i % 2}\n"
                                           for i in range(1, 200)))
    with pytest.raises(SchemaError) as err:
        daskfeed.scan(str(tmp_path / "t.csv"), label="y", sep=";", client=client)
    assert str(err.value).startswith("Expected numbers without thousands separators in column 'a'")
    assert "--decimal , instead" in str(err.value)


# -- stray tokens in any block -------------------------------------------------------------------
_TOKENS = ["?", "-", "missing"]  # none a number nor a null marker


@st.composite
def _files_with_strays(draw):
    """Files of one header (numbers in ``a`` and ``b``, a 0/1 label, maybe quoted text over lines),
    stray tokens put in column ``a`` or ``b`` of random rows of random files.

    Returns the files (name -> rows of text), the header, the column, and the strays: ``(file,
    row, token)`` in data order.
    """
    names = draw(st.permutations(["a", "b", "y", *(["t"] if draw(st.booleans()) else [])]))
    column = draw(st.sampled_from(["a", "b"]))
    files = {}
    for f in range(draw(st.integers(1, 3))):
        rows = []
        for i in range(draw(st.integers(300, 700))):
            field = {"a": str(draw(st.integers(-50, 50))) if i % 7 else f"{i * 0.25:.2f}",
                     "b": f"{(i * 37 + f) % 1000 / 8:.3f}", "y": str(i % 2),
                     "t": '"line\nbreak"' if i % 50 == 3 else f"w{i % 5}"}
            rows.append([field[n] for n in names])
        files[f"f{f}.csv"] = rows
    where = draw(st.lists(st.tuples(st.sampled_from(sorted(files)), st.integers(0, 10**6)),
                          min_size=1, max_size=3))
    rows_at = {(name, at % len(files[name])) for name, at in where}  # (any block of the file)
    strays = sorted((name, row, draw(st.sampled_from(_TOKENS))) for name, row in rows_at)
    for name, row, token in strays:
        files[name][row][names.index(column)] = token
    return files, names, column, strays


def _line_of(rows, names, row):
    """The line (as an editor counts it: the header is 1) row ``row`` of a file starts on."""
    return 2 + sum(1 + r[names.index("t")].count("\n") if "t" in names else 1 for r in rows[:row])


# the same examples on every run; each scans real files on the session's cluster
@pytest.mark.filterwarnings("ignore:.*compressed file")
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=_files_with_strays(), blocksize=st.sampled_from([1500, 4000, None]), gz=st.booleans())
def test_stray_tokens_in_any_block_are_named_with_file_line_and_column(client, data, blocksize, gz):
    """Wherever stray tokens are (the first block or a later one, of one file or another, with
    text over several lines beside them, compressed or not), the refusal names each token, the
    file, line and column of its first place, and the ``--na-values`` that reads them."""
    files, names, column, strays = data
    d = tempfile.mkdtemp(prefix="daskfeed-strays-")
    try:
        paths = {}
        for name, rows in files.items():
            text = ",".join(names) + "\n" + "".join(",".join(r) + "\n" for r in rows)
            paths[name] = os.path.join(d, name + (".gz" if gz else ""))
            with open(paths[name], "wb") as f:
                f.write(gzip.compress(text.encode()) if gz else text.encode())
        with pytest.raises(SchemaError) as err:
            daskfeed.scan(os.path.join(d, "*.csv*"), label="y", blocksize=blocksize, client=client)
        text = str(err.value)
        assert "Traceback" not in text
        counts = {t: sum(1 for *_, tok in strays if tok == t) for _, _, t in strays}
        tokens = sorted(counts, key=lambda t: (-counts[t], t))
        assert text.startswith(f"Expected numbers in column {column!r}. Received: "), text
        assert ", ".join(f"{t!r} ({counts[t]:,})" for t in tokens) in text, text
        assert f"Hint: if they mean 'missing', list them: --na-values {','.join(tokens)} " in text, text
        field = names.index(column) + 1
        first = {}
        for name, row, token in strays:  # (in data order: files by name, rows in order)
            first.setdefault(token, (name, row))
        for token, (name, row) in first.items():
            place = (f"{token!r} {'first ' if counts[token] > 1 else ''}on line "
                     f"{_line_of(files[name], names, row):,} of {paths[name]} (column {column!r}, "
                     f"field {field})")
            if token == strays[0][2]:  # the first token of all is always named where it is
                assert place in text, text
            else:  # a later one too, unless it is past the blocks read again
                assert place in text or f"{token!r} in a later block" in text, text
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_cli_names_a_stray_token_in_a_later_block_without_a_traceback(tmp_path):
    rows = [f"{(i * 37) % 200 - 100}.5,{i % 7},{i % 2}" for i in range(20_000)]
    rows[18_000] = "?,1,0"  # far down: a later block of 64 KiB
    (tmp_path / "flights.csv").write_text("delay,z,y\n" + "\n".join(rows) + "\n", encoding="utf-8")
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([exe, "scan", str(tmp_path / "flights.csv"), "--label", "y", "--blocksize",
                          "64KiB", "--memory-limit", "2GB", "--nworkers", "1"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr + out.stdout
    assert "changes type" not in out.stderr
    assert (f"Error: Expected numbers in column 'delay'. Received: 19,999 numbers and 1 other value(s) "
            f"'?' (1), which would make the whole column text categories: '?' on line 18,002 of "
            f"{tmp_path / 'flights.csv'} (column 'delay', field 1).\nHint: if they mean 'missing', "
            "list them: --na-values ? (na_values=['?'])") in out.stderr
