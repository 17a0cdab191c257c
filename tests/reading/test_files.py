"""What a directory given as data means: its data files, and not the notes beside them."""

from __future__ import annotations

import warnings

import pytest

from daskfeed.reading import expand_paths


def test_text_files_beside_csv_files_are_left_out_and_said(tmp_path):
    (tmp_path / "2026-11-24").mkdir()
    for name in ("a.csv", "2026-11-24/b.csv.gz", "c.parquet"):
        (tmp_path / name).write_bytes(b"x,y\n1,0\n")
    (tmp_path / "README.txt").write_text("how these logs were made", encoding="utf-8")
    (tmp_path / "notes.TXT").write_text("...", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"Left out 2 \.txt file\(s\) in the directory .*"
                                         r"\(README\.txt, notes\.TXT\): its data are the 3 "
                                         r"CSV/TSV/Parquet file\(s\) beside them") as caught:
        files = expand_paths(str(tmp_path))
    assert [f.path.rsplit("/", 1)[1] for f in files] == ["b.csv.gz", "a.csv", "c.parquet"]
    assert "'**/*.txt'" in str(caught[0].message).replace(str(tmp_path) + "/", "")


def test_a_directory_of_text_files_only_reads_them(tmp_path):
    for name in ("x.txt", "y.txt.gz"):
        (tmp_path / name).write_bytes(b"x,y\n1,0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        files = expand_paths(str(tmp_path))
    assert sorted(f.path.rsplit("/", 1)[1] for f in files) == ["x.txt", "y.txt.gz"]


def test_tsv_files_are_read_with_tabs_unless_a_separator_is_chosen(tmp_path, client):
    import daskfeed

    (tmp_path / "a.tsv").write_text("x\ty\tname\n" + "".join(
        f"{i}\t{i % 2}\tn,{i}\n" for i in range(100)), encoding="utf-8")
    m = daskfeed.scan(str(tmp_path / "a.tsv"), label="y", client=client)
    assert list(m.columns) == ["x", "y", "name"] and m.read_options["sep"] == "\t"
    assert m.columns["x"].kind == "numeric" and m.columns["name"].kind == "categorical"
    with pytest.raises(daskfeed.SchemaError, match="label column 'y'"):  # chosen: as chosen
        daskfeed.scan(str(tmp_path / "a.tsv"), label="y", sep=",", client=client)
    (tmp_path / "b.csv").write_text("x,y\n1,0\n2,1\n", encoding="utf-8")
    assert daskfeed.scan(str(tmp_path / "b.csv"), label="y",
                         client=client).read_options["sep"] == ","


def test_an_http_url_is_listed_once_with_its_protocol_and_a_refusal_is_a_permission_error(tmp_path):
    """fsspec's http filesystem keeps whole URLs (the others strip the protocol): a file is
    ``http://host/a.csv``, read; a server's 401 is daskfeed's error, not aiohttp's traceback."""
    from httpserver import basic_auth_server

    from daskfeed import DataNotFoundError
    from daskfeed.reading import Source

    (tmp_path / "a.csv").write_text("x,y\n1,0\n", encoding="utf-8")
    with basic_auth_server(tmp_path, "reader", "pw") as server:
        src = Source(server.url("a.csv", "pw"))
        assert len(src.files) == 1 and src.files[0].path.startswith("http://")
        assert "http://http" not in src.files[0].path and src.files[0].size == 8
        assert src.header() == ["x", "y"]
        with pytest.raises(DataNotFoundError, match=r"permission denied\. Received: "
                                                    r"ClientResponseError: 401") as err:
            Source(server.url("a.csv", "wrong"))
        assert "Hint: check the http:// credentials" in str(err.value)
