"""Secrets taken out of URLs (what daskfeed keeps and shows) and found in storage options."""

from __future__ import annotations

import pytest

from daskfeed.core import redact_text, redact_url, secret_options, url_parts


@pytest.mark.parametrize(("url", "clean"), [
    # userinfo, on every scheme
    ("s3://AKIAEXAMPLE:wJalr/K7MDENG+bPxRfiCY@quests/train/*.csv", "s3://quests/train/*.csv"),
    ("s3://key:secret@quests/a.csv", "s3://quests/a.csv"),
    ("https://reader:pa55@data.example.com/logs/a.csv", "https://data.example.com/logs/a.csv"),
    ("https://reader:pa55@data.example.com:8443/a.csv", "https://data.example.com:8443/a.csv"),
    ("https://ghp_token123@raw.example.com/a.csv", "https://raw.example.com/a.csv"),
    ("https://u:p@ss@host/a.csv", "https://host/a.csv"),  # an "@" in the password
    ("gs://user:pw@bucket/a.csv", "gs://bucket/a.csv"),
    ("gcs://bucket/dir/a.csv", "gcs://bucket/dir/a.csv"),
    # secret query parameters (any case), others kept
    ("https://b.s3.amazonaws.com/a.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2026"
     "&X-Amz-Date=20260101T000000Z&X-Amz-Security-Token=FQo&X-Amz-Signature=9f3a",
     "https://b.s3.amazonaws.com/a.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=redacted"
     "&X-Amz-Date=20260101T000000Z&X-Amz-Security-Token=redacted&X-Amz-Signature=redacted"),
    ("https://acct.blob.core.windows.net/c/a.csv?sv=2022&sig=abc%2Bdef&se=2026",
     "https://acct.blob.core.windows.net/c/a.csv?sv=2022&sig=redacted&se=2026"),
    ("https://storage.googleapis.com/b/a.csv?x-goog-signature=00ff&X-Goog-Credential=sa",
     "https://storage.googleapis.com/b/a.csv?x-goog-signature=redacted&X-Goog-Credential=redacted"),
    ("https://u:p@host/a.csv?TOKEN=t&password=p&secret=s&page=2",
     "https://host/a.csv?TOKEN=redacted&password=redacted&secret=redacted&page=2"),
    ("https://host/a.csv#access_token=abc", "https://host/a.csv#access_token=redacted"),
    # nothing to take out: as given
    ("s3://quests/train/*.csv", "s3://quests/train/*.csv"),
    ("s3://bucket/user@example.com/a.csv", "s3://bucket/user@example.com/a.csv"),
    ("https://host:8443/p/user@x.csv", "https://host:8443/p/user@x.csv"),
    ("https://host/a.csv?page=2&key_column=id", "https://host/a.csv?page=2&key_column=id"),
    ("s3://bucket/a[0-9]?.csv", "s3://bucket/a[0-9]?.csv"),
    ("/data/log_quest/**/*.csv", "/data/log_quest/**/*.csv"),
    ("data/user:pw@x.csv", "data/user:pw@x.csv"),  # a local path, not a URL
])
def test_redact_url_takes_out_userinfo_and_secret_parameters_only(url, clean):
    assert redact_url(url) == clean
    assert redact_url(clean) == clean  # idempotent: a kept URL stays as it is


def test_a_redacted_url_is_the_same_whatever_the_secret():
    """What keys are made of: a rotated password or signature gives the same URL."""
    assert redact_url("https://u:old@h/a.csv?sig=1") == redact_url("https://u:new@h/a.csv?sig=2")
    assert redact_url("https://u:old@h/a.csv") != redact_url("https://u:old@h/b.csv")


def test_url_parts_split_what_redaction_keeps():
    assert url_parts("https://u:p/w@host:8443/a.csv?v=1") == ("https", "u:p/w", "host:8443", "/a.csv?v=1")
    assert url_parts("s3://bucket/a.csv") == ("s3", "", "bucket", "/a.csv")
    assert url_parts("/local/a.csv") == ("", "", "", "/local/a.csv")


def test_redact_text_redacts_every_url_in_a_message():
    text = ("Cannot read 'https://reader:pa55@h:81/a.csv': FileNotFoundError: "
            "http://reader:pa55@h:81/b.csv?token=t0k (and s3://bucket/c.csv)")
    got = redact_text(text)
    assert "pa55" not in got and "t0k" not in got
    assert got == ("Cannot read 'https://h:81/a.csv': FileNotFoundError: "
                   "http://h:81/b.csv?token=redacted (and s3://bucket/c.csv)")
    assert redact_text("no URL here: key=secret") == "no URL here: key=secret"


def test_secret_options_names_credentials_never_other_options():
    options = {"key": "AKIA", "secret": "s", "endpoint_url": "http://127.0.0.1:9000", "anon": False,
               "profile": "team", "client_kwargs": {"region_name": "eu", "aws_session_token": "t"},
               "headers": {"Authorization": "Basic dTpw"}, "my_password_file": "pw"}
    assert secret_options(options) == ["key", "secret", "client_kwargs.aws_session_token",
                                       "headers.Authorization", "my_password_file"]
    assert secret_options({"token": "anon"}) == []  # gcsfs: a way to find credentials
    assert secret_options({"token": {"type": "service_account", "private_key": "x"}}) == ["token"]
    assert secret_options({"key": "", "secret": None}) == []
    assert secret_options(None) == []
