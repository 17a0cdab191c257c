"""Bad input: a clear error naming file / byte range / column, or an explicit counted policy."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

import daskfeed
from daskfeed import DataError, SchemaError


def test_empty_files_are_skipped_and_counted_even_first(tmp_path, client, write_csv):
    write_csv("d/0.csv", "")
    write_csv("d/1.csv", "x,y\n1,0\n2,1\n")
    write_csv("d/2.csv", "")
    with pytest.warns(UserWarning, match="2 empty file"):
        m = daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client)
    assert m.rows == 2 and m.counts == [0, 2, 0]


def test_only_empty_files_is_a_clear_error(tmp_path, client, write_csv):
    write_csv("d/0.csv", "")
    with pytest.raises(SchemaError, match="label column 'y'"):
        daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client)


def test_bom_is_not_part_of_the_first_column_name(tmp_path, client, write_csv):
    write_csv("bom.csv", b"\xef\xbb\xbfx,y\n1,0\n2,1\n")
    with daskfeed.DaskSequence(str(tmp_path / "bom.csv"), label="y", client=client,
                               batch_size=2) as seq:
        assert seq.features == ["x"]
        assert np.array_equal(np.sort(seq[0][0]["x"]), [1, 2])


def test_gzip_file_is_one_partition_with_a_warning(tmp_path, client):
    rows = "".join(f"{i},{i % 2}\n" for i in range(3000))
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(("x,y\n" + rows).encode()))
    with pytest.warns(UserWarning, match="cannot be split"):
        seq = daskfeed.DaskSequence(str(tmp_path / "a.csv.gz"), label="y", client=client,
                                    batch_size=512, blocksize=1000)
    with seq:
        assert len(seq.manifest.blocks) == 1 and seq.manifest.rows == 3000
        xs = np.concatenate([seq[i][0]["x"] for i in range(len(seq))])
        assert np.array_equal(np.sort(xs), np.arange(3000))


def test_quoted_commas_and_non_ascii_stay_in_their_field(tmp_path, client, write_csv):
    write_csv("q.csv", 'city,y\n"São Paulo, BR",1\n"東京",0\n"a ""quoted"" name",1\n')
    m = daskfeed.scan(str(tmp_path / "q.csv"), label="y", client=client)
    assert m.rows == 3
    assert set(m.columns["city"].vocabulary) == {"São Paulo, BR", "東京", 'a "quoted" name'}


def test_malformed_line_names_the_file_and_the_line(tmp_path, client, write_csv):
    write_csv("d/a.csv", "x,y\n1,0\n")
    write_csv("d/b.csv", "x,y\n1,0\n2,1,5\n")
    with pytest.raises(DataError) as err:
        daskfeed.scan(str(tmp_path / "d" / "*.csv"), label="y", client=client)
    msg = str(err.value)
    assert "b.csv" in msg and "Expected 2 columns, got 3" in msg and "Hint:" in msg


def test_non_utf8_bytes_are_a_clear_error_and_encoding_reads_them(tmp_path, client, write_csv):
    write_csv("lat.csv", b"city,y\n\xe9t\xe9,1\nabc,0\n")
    with pytest.raises(DataError) as err:
        daskfeed.scan(str(tmp_path / "lat.csv"), label="y", client=client)
    msg = str(err.value)
    assert "lat.csv" in msg and "'city'" in msg and "latin-1" in msg
    m = daskfeed.scan(str(tmp_path / "lat.csv"), label="y", client=client, encoding="latin-1")
    assert "été" in m.columns["city"].vocabulary


def test_label_all_empty_is_refused(tmp_path, client, write_csv):
    write_csv("e.csv", "x,y\n1,\n2,\n")
    with pytest.raises(SchemaError, match="label"):
        daskfeed.scan(str(tmp_path / "e.csv"), label="y", client=client)


def test_byte_ranges_lose_and_duplicate_no_row(tmp_path, client):
    lines = ["a,b,y"] + [f"{i},{'x' * (i % 17)},{i % 2}" for i in range(5000)]
    for name, text in {"lf.csv": "\n".join(lines) + "\n", "nolf.csv": "\n".join(lines),
                       "crlf.csv": "\r\n".join(lines) + "\r\n"}.items():
        (tmp_path / name).write_bytes(text.encode())
        with daskfeed.DaskSequence(str(tmp_path / name), label="y", client=client, batch_size=999,
                                   blocksize=997, shuffle=False) as seq:
            assert len(seq.manifest.blocks) > 20
            a = np.concatenate([seq[i][0]["a"] for i in range(len(seq))])
            assert np.array_equal(a, np.arange(5000)), name


_MALFORMED = "x,y,c\n1,0,a\n2,1,b,EXTRA\n3,0,c\n4\n5,1,d\n"


def test_malformed_line_is_an_error_naming_file_and_the_policy(tmp_path, client, write_csv):
    write_csv("bad.csv", _MALFORMED)
    with pytest.raises(DataError) as err:
        daskfeed.scan(str(tmp_path / "bad.csv"), label="y", client=client)
    msg = str(err.value)
    assert "bad.csv" in msg and "Expected" in msg and "Hint:" in msg and "--bad-lines skip" in msg


@pytest.mark.parametrize("policy", ["skip", "quarantine"])
def test_bad_lines_skipped_are_counted_never_silent(tmp_path, client, write_csv, policy):
    write_csv("bad.csv", _MALFORMED)
    with pytest.warns(UserWarning, match="2 malformed line"):
        seq = daskfeed.DaskSequence(str(tmp_path / "bad.csv"), label="y", client=client,
                                    shuffle=False, batch_size=10, bad_lines=policy)
    with seq:
        m = seq.manifest
        assert (m.rows, m.bad_lines) == (3, 2)
        assert np.array_equal(seq[0][0]["x"], [1, 3, 5])
        if policy == "quarantine":
            assert [r["line"] for r in m.rejects] == ["2,1,b,EXTRA", "4"]
            assert "bad.csv" in m.rejects[0]["where"]
        else:
            assert m.rejects == []


def test_quarantine_keeps_a_bounded_text_and_counts_every_line(tmp_path, client, write_csv):
    """A partition with many malformed lines: all counted, the first MAX_REJECTS_KEPT kept (each
    at most MAX_REJECT_CHARS), and one line saying how many more there were."""
    from daskfeed.scanning import _task as scan_task

    good = "".join(f"{i},{i % 2}\n" for i in range(3000))
    bad = "".join(f"{i},1,{'z' * 5000}\n" for i in range(1200))
    write_csv("many.csv", "x,y\n" + good + bad)
    with pytest.warns(UserWarning, match="1,200 malformed line"):
        m = daskfeed.scan(str(tmp_path / "many.csv"), label="y", client=client, bad_lines="quarantine")
    assert m.bad_lines == 1200 and m.rows == 3000
    assert len(m.rejects) == scan_task.MAX_REJECTS_KEPT + 1
    assert all(len(r["line"]) <= scan_task.MAX_REJECT_CHARS for r in m.rejects)
    assert m.rejects[0]["line"].startswith("0,1,zzz")
    assert "200 more malformed lines" in m.rejects[-1]["line"] and "many.csv" in m.rejects[-1]["where"]


def test_a_file_that_is_mostly_malformed_is_refused_even_when_skipping(tmp_path, client, write_csv):
    write_csv("semi.csv", "x,y\n" + "".join(f"{i};{i % 2};x\n" for i in range(300)) + "1,0\n")
    with pytest.raises(DataError, match="delimiter"):
        daskfeed.scan(str(tmp_path / "semi.csv"), label="y", client=client, bad_lines="skip")


def test_quoted_newlines_give_the_right_rows_in_a_whole_file(tmp_path, client, write_csv):
    write_csv("q.csv", 'x,note,y\n1,"two\nlines, and a comma",0\n2,plain,1\n3,"a ""quote""",0\n')
    with daskfeed.DaskSequence(str(tmp_path / "q.csv"), label="y", client=client, shuffle=False,
                               batch_size=10) as seq:
        x, _ = seq[0]
        assert seq.manifest.rows == 3 and np.array_equal(x["x"], [1, 2, 3])
        assert seq.manifest.columns["note"].vocabulary == sorted(
            ["two\nlines, and a comma", "plain", 'a "quote"'])


@pytest.mark.slow  # three `daskfeed train` runs
def test_cli_quarantine_writes_rejects_and_counts_them_in_history(demo_data, tmp_path):
    import glob
    import json
    import os
    import shutil
    import subprocess
    import sys

    files = sorted(glob.glob(demo_data.train_glob, recursive=True))[:6]
    (tmp_path / "d").mkdir()
    for i, f in enumerate(files):
        text = open(f, encoding="utf-8").read()
        if i == 2:  # two malformed lines in the middle of one file
            lines = text.splitlines(keepends=True)
            text = "".join([*lines[:100], "oops,only,three\n", "1,2\n", *lines[100:]])
        (tmp_path / "d" / os.path.basename(f)).write_text(text, encoding="utf-8")
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    args = [exe, "train", str(tmp_path / "d" / "*.csv"), "--label", "cleared", "--epochs", "1",
            "--memory-limit", "3GB", "--dashboard-address", "127.0.0.1:0", "--verbose", "0"]
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([*args, "--output", str(tmp_path / "e")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "split_data_00002.csv" in out.stderr and "--bad-lines skip" in out.stderr
    out = subprocess.run([*args, "--bad-lines", "quarantine", "--cache", str(tmp_path / "cache"),
                          "--output", str(tmp_path / "q")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"cache: {tmp_path / 'cache'}" in out.stdout
    hist = json.loads((tmp_path / "q" / "history.json").read_text())
    assert hist["bad_lines"]["policy"] == "quarantine" and hist["bad_lines"]["train"] == 2
    assert hist["epochs"][0]["rows"] == 6000
    rejects = (tmp_path / "q" / "rejects.csv").read_text(encoding="utf-8").splitlines()
    assert rejects[0] == "data,where,line" and len(rejects) == 3
    assert "oops,only,three" in rejects[1] and "split_data_00002.csv" in rejects[1]
    again = subprocess.run([*args, "--bad-lines", "quarantine", "--cache", str(tmp_path / "cache"),
                            "--output", str(tmp_path / "q")], capture_output=True, text=True,
                           env=env, timeout=300)
    assert again.returncode == 0 and "manifest reused" in again.stdout, again.stderr[-3000:]
    kept = (tmp_path / "q" / "rejects.csv").read_text(encoding="utf-8").splitlines()
    assert kept == rejects  # a rerun on the reused manifest keeps the quarantined lines


def test_a_file_gone_after_listing_is_a_clear_error_naming_it(tmp_path, client, write_csv):
    from daskfeed import DataNotFoundError
    from daskfeed.reading._source import Source

    write_csv("d/a.csv", "x,y\n1,0\n")
    gone = write_csv("d/b.csv", "x,y\n2,1\n")
    src = Source(str(tmp_path / "d" / "*.csv"))
    os.remove(gone)
    with pytest.raises(DataNotFoundError) as err:
        daskfeed.scan(src, label="y", client=client)
    assert "b.csv" in str(err.value) and "Hint:" in str(err.value)


@pytest.mark.parametrize("label, value", [("1", "1 (a 0/1 label)"), ("gold", "gold")])
def test_a_label_of_one_class_is_refused_before_any_fit(tmp_path, client, write_csv, label, value):
    """Binary all-1, or one text class: the CLI and the Python route refuse it, naming the value."""
    import shutil
    import subprocess
    import sys

    rows = "".join(f"{i},{i % 7},{label}\n" for i in range(300))
    write_csv("one/a.csv", "x,z,y\n" + rows)
    data = str(tmp_path / "one" / "a.csv")
    want = (f"Expected at least two classes in label 'y' to train a classifier. Received: all 300 "
            f"labelled rows have the value {value}.")
    with daskfeed.DaskSequence(data, label="y", client=client, batch_size=64) as seq:
        with pytest.raises(SchemaError, match=re_escape(want)):
            daskfeed.default_model(seq)
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([exe, "train", data, "--label", "y", "--epochs", "1", "--memory-limit",
                          "2GB", "--dashboard-address", "", "--output", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert want in " ".join(out.stderr.split()) and "--label" in out.stderr
    assert not (tmp_path / "out" / "model.keras").exists()


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_validation_split_of_one_block_is_a_clear_error_not_a_traceback(tmp_path, write_csv):
    import shutil
    import subprocess
    import sys

    write_csv("one.csv", "x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(200)))
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([exe, "train", str(tmp_path / "one.csv"), "--label", "y",
                          "--validation-split", "0.2", "--memory-limit", "2GB",
                          "--dashboard-address", "", "--output", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "Expected at least 2 blocks to hold whole blocks out for validation. Received: 1 " \
           "block(s)." in out.stderr and "--blocksize" in out.stderr


def test_a_header_only_file_and_duplicated_names_say_what_is_wrong(tmp_path, client, write_csv):
    write_csv("h/only.csv", "x,y\n")
    with pytest.raises(SchemaError, match=r"Expected rows of data\. Received: a header line and "
                                          r"no rows in every file \(.*only\.csv\)"):
        daskfeed.scan(str(tmp_path / "h" / "only.csv"), label="y", client=client)
    write_csv("d/dup.csv", "x,z,x,y\n1,2,3,0\n")
    with pytest.raises(SchemaError, match=r"Expected distinct column names in the header of "
                                          r".*dup\.csv\. Received: 'x' as column 1 and column 3 "
                                          r"\(line 1\)"):
        daskfeed.scan(str(tmp_path / "d" / "dup.csv"), label="y", client=client)


def test_a_header_of_too_many_columns_is_one_clear_message_from_the_cli(tmp_path):
    """A header of 20,001 columns (the shipped limit is 10,000): exit 1, one message, no traceback."""
    import shutil
    import subprocess
    import sys

    names = [f"c{i}" for i in range(20_001)]
    path = tmp_path / "wide.csv"
    path.write_text(",".join(names) + "\n" + "\n".join(",".join(str((i + r) % 2) for i in range(20_001))
                                                        for r in range(3)) + "\n", encoding="utf-8")
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    args = [exe, "scan", str(path), "--label", "c0", "--memory-limit", "2GB", "--nworkers", "1",
            "--no-cache", "--dashboard-address", ""]
    env = {k: v for k, v in os.environ.items() if k != "DASK_DASKFEED__MAX_COLUMNS"}
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.startswith("Error: Expected at most 10,000 columns in the header of "
                                 f"{path} (line 1). Received: 20,001 columns"), out.stderr[-3000:]
    assert out.stderr.count("Expected at most 10,000 columns") == 1
    assert "Hint: " in out.stderr and "daskfeed.max-columns" in out.stderr
