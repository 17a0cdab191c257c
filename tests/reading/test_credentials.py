"""Credentials in data URLs: read with them, kept without them (a real HTTP server, basic auth)."""

from __future__ import annotations

import pickle

import pytest
from httpserver import basic_auth_server

from daskfeed import DataNotFoundError
from daskfeed.reading import Source, expand_paths, iter_tables, url_credentials, with_credentials
from daskfeed.reading._credentials import CARRIED

PASSWORD = "pa55-Wd.secret"
ROTATED = "r0tated-pa55"


@pytest.fixture()
def server(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,0\n2,1\n3,0\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text("x,y\n4,1\n", encoding="utf-8")
    with basic_auth_server(tmp_path, "reader", PASSWORD) as srv:
        yield srv


def _no_secret(*things: object, secret: str = PASSWORD) -> None:
    for thing in things:
        assert secret not in str(thing), thing
        assert secret.encode() not in pickle.dumps(thing), thing


def test_a_url_with_credentials_is_read_with_them_and_named_without(server):
    url = server.url("a.csv", PASSWORD)
    src = Source([url, server.url("b.csv", PASSWORD)])
    clean = f"http://127.0.0.1:{server.port}/a.csv"
    assert [f.path for f in src.files] == [clean, f"http://127.0.0.1:{server.port}/b.csv"]
    assert src.given[0] == clean and [b.path for b in src.blocks] == [clean, f"http://127.0.0.1:{server.port}/b.csv"]
    assert src.header() == ["x", "y"]
    rows = [v for b in src.blocks for t in iter_tables(b, src.options) for v in t.column("x").to_pylist()]
    assert rows == [1, 2, 3, 4]  # read (on a worker: the blocks and the options travel)
    _no_secret(src.files, src.blocks, src.given, src.parts(), src.fingerprint(), repr(src.options),
               repr(src))
    # what travels to open them: the host's userinfo, in the storage options (never shown)
    assert dict(src.options.storage_options)[CARRIED] == (f"http://reader:{PASSWORD}@127.0.0.1:{server.port}",)


def test_a_rotated_password_keeps_the_fingerprint_and_the_old_one_is_refused_unnamed(server):
    before = Source(server.url("a.csv", PASSWORD))
    server.passwords = {ROTATED}
    after = Source(server.url("a.csv", ROTATED))
    assert after.fingerprint() == before.fingerprint()
    assert [p.key for p in after.parts()] == [p.key for p in before.parts()]
    assert after.header() == ["x", "y"]
    with pytest.raises(DataNotFoundError) as err:
        Source(server.url("a.csv", PASSWORD))
    text = str(err.value)
    assert f"Cannot read 'http://127.0.0.1:{server.port}/a.csv': permission denied." in text
    assert "401" in text and "Hint: check the http:// credentials" in text
    _no_secret(text)
    with pytest.raises(DataNotFoundError) as err:  # listed, then refused when opened
        before.header()
    assert f"Cannot read http://127.0.0.1:{server.port}/a.csv" in str(err.value)
    _no_secret(str(err.value))


def test_a_secret_query_parameter_is_read_and_shown_redacted(server):
    src = Source(server.url("a.csv?token=t0k3n-1&v=2", PASSWORD))
    assert [f.path for f in src.files] == [f"http://127.0.0.1:{server.port}/a.csv?token=redacted&v=2"]
    assert src.header() == ["x", "y"]
    rotated = Source(server.url("a.csv?token=t0k3n-2&v=2", PASSWORD))
    assert rotated.fingerprint() == src.fingerprint()
    _no_secret(src.files, src.blocks, src.given, repr(src), secret="t0k3n")


def test_credentials_are_put_back_only_for_their_own_host_and_url():
    carried = url_credentials(["https://u:p@h:81/dir/*.csv", "https://other/a.csv?sig=s1",
                               "/local/a.csv", object()])
    assert carried == ("https://u:p@h:81", "https://other/a.csv?sig=s1")
    assert with_credentials("https://h:81/dir/a.csv", carried) == "https://u:p@h:81/dir/a.csv"
    assert with_credentials("https://other/a.csv?sig=redacted", carried) == "https://other/a.csv?sig=s1"
    assert with_credentials("https://h:82/a.csv", carried) == "https://h:82/a.csv"  # another port
    assert with_credentials("https://other/b.csv", carried) == "https://other/b.csv"
    assert with_credentials("/local/a.csv", carried) == "/local/a.csv"
    assert url_credentials(["s3://bucket/a.csv", "data/*.csv"]) == ()


def test_credentials_in_an_object_store_url_are_refused_named_without_them():
    """s3fs reads ``key:secret@`` as part of the bucket's name; refused before any request."""
    with pytest.raises(DataNotFoundError) as err:
        expand_paths("s3://AKIAEXAMPLE:wJalr/K7MDENG@quests/train/*.csv")
    text = str(err.value)
    assert "Received: credentials in the URL 's3://quests/train/*.csv'" in text
    assert "Hint: " in text and "@options.json" in text
    _no_secret(text, secret="wJalr")
    _no_secret(text, secret="AKIAEXAMPLE")
