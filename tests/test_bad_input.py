"""Bad input: a clear error naming file / byte range / column, or an explicit counted policy."""

from __future__ import annotations

import gzip

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
        assert len(seq.manifest.partitions) == 1 and seq.manifest.rows == 3000
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
            assert len(seq.manifest.partitions) > 20
            a = np.concatenate([seq[i][0]["a"] for i in range(len(seq))])
            assert np.array_equal(a, np.arange(5000)), name
