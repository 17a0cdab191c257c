"""Object storage: s3:// through fsspec/s3fs against a real S3 API (moto's server mode).

The server runs on 127.0.0.1 with IAM authentication on (see ``tests/s3server.py``): a
wrong key or secret is refused as a real S3 would refuse it. Credentials reach daskfeed the
usual ways: ``storage_options`` / ``--storage-options`` or the ``AWS_*`` environment of the
trainer and of the workers. They must never show up in output, manifest or history.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from s3server import moto_s3

BIN = pathlib.Path(sys.executable).parent
OURS = ("scans", "daskfeed-cache.json", "daskfeed-cache.lock")  # a root's own names, not entries
BUCKET = "quests"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, with bucket ``quests``: train/ (8 files, 8,000 rows) and validate/ (2,000)."""
    from daskfeed.cli._demo import write_demo_data

    data = write_demo_data(tmp_path_factory.mktemp("s3data"), rows=8000, validate_rows=2000)
    root = pathlib.Path(data.root)
    with moto_s3(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        server.upload(BUCKET, "train", sorted((root / "log_quest" / "splited").glob("*.csv")))
        server.upload(BUCKET, "validate",
                      sorted((root / "log_quest_validate" / "splited").glob("*.csv")))
        yield server


def _env(server, **creds) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(server.env(**creds))
    env.update(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    return env


def _cli(args: list[str], env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "daskfeed"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _assert_secret_absent(secret: str, *texts: str, files: list[pathlib.Path] = ()) -> None:
    for text in texts:
        assert secret not in text
    for f in files:
        assert secret.encode() not in f.read_bytes(), f"the secret is written in {f}"


def test_storage_options_flag_takes_json_and_pairs():
    import click

    from daskfeed.cli._flag_types import parse_storage_options

    got = parse_storage_options(None, None, ('{"anon": false, "client_kwargs": {"region_name": "x"}}',
                                        "endpoint_url=http://127.0.0.1:9 max_concurrency=4",
                                        "client_kwargs.verify=false"))
    assert got == {"anon": False, "endpoint_url": "http://127.0.0.1:9", "max_concurrency": 4,
                   "client_kwargs": {"region_name": "x", "verify": False}}
    assert parse_storage_options(None, None, ()) is None
    with pytest.raises(click.BadParameter, match="KEY=VALUE"):
        parse_storage_options(None, None, ("secret",))
    with pytest.raises(click.BadParameter, match="not JSON") as err:
        parse_storage_options(None, None, ('{"secret": "s3cr3t-value",}',))
    assert "s3cr3t-value" not in str(err.value)


def test_same_size_rewrite_changes_the_fingerprint(s3):
    """S3 mtimes have 1 s resolution: the ETag tells a same-size rewrite within that second."""
    from daskfeed.reading._source import Source

    so = {"endpoint_url": s3.endpoint, "key": s3.key, "secret": s3.secret}
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="etag/a.csv", Body=b"x,cleared\n1,0\n")
    before = Source(f"s3://{BUCKET}/etag/*.csv", storage_options=so)
    client.put_object(Bucket=BUCKET, Key="etag/a.csv", Body=b"x,cleared\n2,1\n")
    after = Source(f"s3://{BUCKET}/etag/*.csv", storage_options=so)
    assert before.files[0].size == after.files[0].size
    assert before.files[0].etag and before.files[0].etag != after.files[0].etag
    assert before.fingerprint() != after.fingerprint()
    assert s3.secret not in repr(before.options)


def test_missing_bucket_is_a_clear_error(s3):
    from daskfeed.core._exceptions import DataNotFoundError
    from daskfeed.reading._source import Source

    so = {"endpoint_url": s3.endpoint, "key": s3.key, "secret": s3.secret}
    with pytest.raises(DataNotFoundError) as err:
        Source("s3://no-such-bucket/train/*.csv", storage_options=so)
    text = str(err.value)
    assert "Cannot list 's3://no-such-bucket/train/*.csv'" in text
    assert re.search(r"Received: (FileNotFoundError: The specified bucket|the bucket "
                     r"'no-such-bucket') does not exist", text), text
    assert "Hint: check the bucket name and the endpoint" in text
    assert s3.secret not in text


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
@pytest.mark.parametrize("who", ["unknown key", "wrong secret"])
def test_denied_credentials_are_a_clear_error(s3, who):
    from daskfeed.core._exceptions import DataNotFoundError
    from daskfeed.reading._source import Source

    key, secret = ("AKIA0000000000000000", "not-the-secret-0") if who == "unknown key" else \
        (s3.key, "not-the-secret-1")
    so = {"endpoint_url": s3.endpoint, "key": key, "secret": secret}
    with pytest.raises(DataNotFoundError) as err:
        Source(f"s3://{BUCKET}/train/*.csv", storage_options=so)
    text = str(err.value)
    reason = ("The AWS Access Key Id you provided does not exist" if who == "unknown key" else
              "The request signature we calculated does not match")
    assert f"Cannot read 's3://{BUCKET}/train/*.csv': permission denied." in text
    assert f"Received: PermissionError: {reason}" in text
    assert "Hint: check the credentials" in text and "AWS_ACCESS_KEY_ID" in text
    assert secret not in text


def test_listing_allowed_reading_denied_names_the_object(s3):
    """A key that may list the bucket but not read its objects: the first read names the object."""
    from daskfeed.core._exceptions import DataNotFoundError
    from daskfeed.reading._source import Source

    key, secret = s3.user("lister", [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{BUCKET}"}])
    so = {"endpoint_url": s3.endpoint, "key": key, "secret": secret}
    src = Source(f"s3://{BUCKET}/validate/*.csv", storage_options=so)  # listing is allowed
    assert len(src.files) == 2
    with pytest.raises(DataNotFoundError) as err:
        src.header()
    text = str(err.value)
    assert (f"Cannot read s3://{BUCKET}/validate/split_data_00000.csv: permission denied. "
            "Received: PermissionError: Access Denied") in text
    assert "Hint: check the credentials" in text
    assert secret not in text


@pytest.mark.slow  # three CLI scans (~20 s); the clear-error tests above stay in make test
def test_scan_cache_and_a_changed_object_on_s3(s3, tmp_path):
    """The CLI with the endpoint as a flag and credentials from the environment only.

    Scan 1 writes the parse cache, scan 2 finds nothing changed; rewriting one object (same
    size, same second) gives its part a new key: a new cache entry replaces the old one, and
    the scan says one file changed. An object added is one new file (issue 28: data that grows).
    """
    cache = tmp_path / "cache"
    env = _env(s3)
    args = ["scan", f"s3://{BUCKET}/validate/*.csv", "--label", "cleared", "--memory-limit", "2GB",
            "--nworkers", "1", "--cache", str(cache),
            "--storage-options", f"endpoint_url={s3.endpoint}"]
    first = _cli(args, env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2,000 rows in" in first.stdout
    assert re.search(r"cache: .*~[\d.]+ GB to write", first.stdout), first.stdout
    entries = [p.name for p in cache.iterdir() if p.name not in OURS]
    assert len(entries) == 1  # the two files make one part
    second = _cli(args, env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "(2 of 2 blocks cached)" in second.stdout, second.stdout
    assert "scan: 2 files unchanged since the last scan of this data" in second.stdout

    client = s3.client()
    key = "validate/split_data_00001.csv"
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    changed = body.replace(b"\n1,", b"\n2,", 1) if b"\n1," in body else body[:-2] + b"9\n"
    assert len(changed) == len(body) and changed != body
    client.put_object(Bucket=BUCKET, Key=key, Body=changed)
    # this time the credentials come as flags, not from the environment
    flags_only = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    out = tmp_path / "manifest.json"
    third = _cli([*args, "--storage-options", f"key={s3.key}", "--storage-options",
                  json.dumps({"secret": s3.secret}), "--output", str(out)], flags_only)
    assert third.returncode == 0, third.stderr[-3000:]
    assert re.search(r"cache: .*~[\d.]+ GB to write", third.stdout), third.stdout
    assert "scan: 0 new files, 1 changed, 0 gone; " in third.stdout, third.stdout
    now = [p.name for p in cache.iterdir() if p.name not in OURS]
    assert len(now) == 1 and now != entries, (entries, now)
    client.put_object(Bucket=BUCKET, Key="validate/zz-new.csv", Body=body)
    fourth = _cli(args, env)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert re.search(r"scan: 1 new file \(.+\), 0 changed, 0 gone; ", fourth.stdout), fourth.stdout
    assert "3,000 rows in" in fourth.stdout, fourth.stdout
    client.delete_object(Bucket=BUCKET, Key="validate/zz-new.csv")
    written = [out, *(p for p in cache.rglob("*") if p.is_file())]
    for secret in (s3.secret, s3.key):
        _assert_secret_absent(secret, first.stdout + first.stderr, third.stdout + third.stderr,
                              files=written)


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_a_quoted_file_on_s3_is_split_and_scanned_as_pyarrow_reads_it_whole(s3, tmp_path):
    """Quoted line breaks in an object read in byte ranges: speculated starts, and an object whose
    starts must be decided exactly (a quoted field longer than a speculation looks); the same
    rows as pyarrow reading the whole object."""
    import io

    import pyarrow.csv as pacsv

    rows = [f'{i},"note {i}\nsecond, ""line""",{i % 2}' if i % 7 == 0 else f"{i},plain {i},{i % 2}"
            for i in range(4000)]
    inner = "\n".join(f"{k},plain,1" for k in range(12_000))  # 110 kB without a quote
    bodies = {"speculated.csv": "id,note,y\n" + "\n".join(rows) + "\n",
              "exact.csv": "id,note,y\n" + "\n".join(rows[:50]) + f'\n50,"{inner}",0\n'
                           + "\n".join(rows[51:]) + "\n"}
    client = s3.client()
    for name, text in bodies.items():
        client.put_object(Bucket=BUCKET, Key=f"quoted/{name}", Body=text.encode())
        whole = pacsv.read_csv(io.BytesIO(text.encode()),
                               parse_options=pacsv.ParseOptions(newlines_in_values=True))
        out = tmp_path / f"{name}.json"
        res = _cli(["scan", f"s3://{BUCKET}/quoted/{name}", "--label", "y", "--blocksize", "16KiB",
                    "--memory-limit", "2GB", "--nworkers", "1", "--cache", str(tmp_path / "c"),
                    "--storage-options", f"endpoint_url={s3.endpoint}", "--output", str(out)],
                   _env(s3))
        assert res.returncode == 0, res.stderr[-3000:]
        manifest = json.loads(out.read_text())
        assert manifest["rows"] == whole.num_rows == 4000, (name, manifest["rows"])
        assert manifest["blocks"]["count"] >= 5  # (the blocks, packed)
        assert bool(manifest["splits"]) is (name == "exact.csv"), manifest["splits"]


def test_cli_scan_of_a_missing_bucket_exits_1(s3):
    run = _cli(["scan", "s3://no-such-bucket/*.csv", "--label", "cleared", "--memory-limit", "2GB",
                "--nworkers", "1",
                "--storage-options", json.dumps({"endpoint_url": s3.endpoint})], _env(s3))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the bucket 'no-such-bucket' does not exist" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # a whole train (~80 s here); tests/e2e/test_deploy_operator.py trains from S3 too
@pytest.mark.timeout(600)
def test_train_on_s3_never_writes_the_secret(s3, tmp_path):
    """train from s3:// with the credentials given as --storage-options (workers get them)."""
    out = tmp_path / "out"
    env = {k: v for k, v in _env(s3).items() if not k.startswith("AWS_")}  # flags only
    t0 = time.monotonic()
    run = _cli(["train", f"s3://{BUCKET}/train/*.csv", "--label", "cleared",
                "--validation", f"s3://{BUCKET}/validate/*.csv", "--epochs", "1",
                "--memory-limit", "3GB", "--nworkers", "2", "--batch-size", "128",
                "--cache", str(tmp_path / "cache"), "--output", str(out), "--verbose", "0",
                "--storage-options", json.dumps({"endpoint_url": s3.endpoint, "key": s3.key,
                                                 "secret": s3.secret}),
                "--storage-options", "client_kwargs.region_name=us-east-1"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    hist = json.loads((out / "history.json").read_text())
    assert hist["epochs"][0]["rows"] == 8000
    # 62 steps of 128 learn the demo's rule (0.75 on local copies, seeds 0-2); the default 1024
    # gives 7 steps, 0.58-0.71 by the order, which hangs on the upload times (the anchors' mtimes)
    assert hist["epochs"][0]["val_accuracy"] > 0.65
    from daskfeed.manifest._manifest import Manifest

    manifest = Manifest.from_json(out / "manifest.json")
    assert manifest.blocks[0]["path"].startswith(f"s3://{BUCKET}/train/")
    written = [p for p in out.rglob("*") if p.is_file()]
    _assert_secret_absent(s3.secret, run.stdout, run.stderr, files=written)
    _assert_secret_absent(s3.key, run.stdout, run.stderr, files=written)
    print(f"train on s3: {time.monotonic() - t0:.1f}s")


def test_credentials_on_the_command_line_are_warned_of_once_and_never_shown(s3, tmp_path):
    """key and secret as --storage-options (JSON and a pair): the scan reads with them; one
    warning names the flags (not the values), the risk and where to give them instead."""
    env = {k: v for k, v in _env(s3).items() if not k.startswith("AWS_")}  # flags only
    run = _cli(["scan", f"s3://{BUCKET}/validate/*.csv", "--label", "cleared", "--memory-limit", "2GB",
                "--nworkers", "1", "--no-cache", "--dashboard-address", "",
                "--storage-options", json.dumps({"endpoint_url": s3.endpoint, "key": s3.key}),
                "--storage-options", f"secret={s3.secret}"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2,000 rows in" in run.stdout
    assert run.stderr.count("warning: credentials on the command line") == 1, run.stderr
    assert "(--storage-options key, secret)" in run.stderr
    assert re.search(r"/proc/\d+/cmdline", run.stderr) and "history" in run.stderr
    assert "AWS_ACCESS_KEY_ID" in run.stderr and "--storage-options @options.json" in run.stderr
    _assert_secret_absent(s3.secret, run.stdout, run.stderr)
    _assert_secret_absent(s3.key, run.stdout, run.stderr)


def test_credentials_in_an_s3_url_are_refused_without_showing_them(s3):
    """s3fs takes ``key:secret@`` for part of the bucket's name: one clear error, no traceback."""
    run = _cli(["scan", f"s3://{s3.key}:{s3.secret}@{BUCKET}/validate/*.csv", "--label", "cleared",
                "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "",
                "--storage-options", f"endpoint_url={s3.endpoint}"], _env(s3))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.count("warning: credentials on the command line") == 1
    assert f"Received: credentials in the URL 's3://{BUCKET}/validate/*.csv'" in run.stderr
    _assert_secret_absent(s3.secret, run.stdout, run.stderr)
    _assert_secret_absent(s3.key, run.stdout, run.stderr)
