"""Secrets stay secret: the real CLI on data behind HTTP basic auth (``tests/httpserver.py``).

Credentials in the data's URL are used to read and found in nothing daskfeed writes or prints
(the manifest, the scan's records, the parse cache, ``files.json``, ``history.json``, the
output); a rotated password keeps the cache; credentials on the command line are warned of once;
``--storage-options @FILE.json`` keeps them off it.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from httpserver import basic_auth_server

PASSWORD = "pa55-Wd.secret"
ROTATED = "r0tated.pa55"
TOKEN = "t0k3n-val"
WARNING = "warning: credentials on the command line"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The demo's quest logs (4 files of 1,000 rows, 1 of validation) served to ``reader``."""
    from daskfeed.cli._demo import write_demo_data

    data = write_demo_data(tmp_path_factory.mktemp("httpdata"), rows=4000, validate_rows=1000)
    root = tmp_path_factory.mktemp("served")
    for f in sorted(pathlib.Path(data.root, "log_quest", "splited").glob("*.csv")):
        shutil.copy(f, root / f.name)
    for f in sorted(pathlib.Path(data.root, "log_quest_validate", "splited").glob("*.csv")):
        shutil.copy(f, root / f"validate_{f.name}")
    with basic_auth_server(root, "reader", PASSWORD) as srv:
        yield srv


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = shutil.which("daskfeed", path=os.path.dirname(sys.executable)) or "daskfeed"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=timeout)


def _written(*roots: pathlib.Path) -> list[pathlib.Path]:
    files = []
    for root in roots:
        files += [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    assert files
    return files


def _assert_absent(secrets: list[str], run: subprocess.CompletedProcess, files: list[pathlib.Path]) -> None:
    for secret in secrets:
        assert secret not in run.stdout and secret not in run.stderr, secret
        for f in files:
            assert secret.encode() not in f.read_bytes(), f"{secret!r} is written in {f}"


def _manifest_paths(path: pathlib.Path) -> list[str]:
    """The block paths of a manifest (packed there: zlib, so a grep of the file cannot see them)."""
    from daskfeed.manifest._manifest import Manifest

    return sorted({b["path"] for b in Manifest.from_json(path).blocks})


def test_a_scan_over_https_credentials_keeps_them_nowhere_and_a_rotated_password_keeps_the_cache(
        server, tmp_path):
    server.passwords = {PASSWORD}
    cache, out = tmp_path / "cache", tmp_path / "manifest.json"
    base = f"http://127.0.0.1:{server.port}"

    def scan(password: str, token: str) -> subprocess.CompletedProcess:
        return _cli("scan", server.url("split_data_00000.csv", password),
                    server.url(f"split_data_00001.csv?{token}&v=1", password), "--label", "cleared",
                    "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "",
                    "--cache", str(cache), "--output", str(out))

    first = scan(PASSWORD, f"token={TOKEN}")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2,000 rows in 2 blocks" in first.stdout, first.stdout
    assert first.stderr.count(WARNING) == 1, first.stderr
    assert (f"(in the URL '{base}/split_data_00000.csv'; in the URL "
            f"'{base}/split_data_00001.csv?token=redacted&v=1')") in first.stderr
    assert "/proc/" in first.stderr and "--storage-options @options.json" in first.stderr
    assert _manifest_paths(out) == [f"{base}/split_data_00000.csv",
                                    f"{base}/split_data_00001.csv?token=redacted&v=1"]
    _assert_absent([PASSWORD, TOKEN], first, _written(cache, out))

    server.passwords = {ROTATED}  # the secret rotated: the same files, the same keys
    again = scan(ROTATED, "token=an0ther-t0k3n")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(2 of 2 blocks cached)" in again.stdout, again.stdout
    assert "scan: 2 files unchanged since the last scan of this data" in again.stdout, again.stdout
    _assert_absent([ROTATED, "an0ther-t0k3n"], again, _written(cache, out))

    stale = scan(PASSWORD, f"token={TOKEN}")  # the old password: refused, unnamed
    assert stale.returncode == 1 and "Traceback" not in stale.stderr, stale.stderr[-3000:]
    assert f"Error: Cannot read '{base}/split_data_00000.csv': permission denied." in stale.stderr
    _assert_absent([PASSWORD, TOKEN], stale, [])


def test_storage_options_from_a_file_are_read_and_not_warned_of(server, tmp_path):
    auth = tmp_path / "options.json"
    header = "Basic " + base64.b64encode(f"reader:{ROTATED}".encode()).decode()
    auth.write_text(json.dumps({"headers": {"Authorization": header}}), encoding="utf-8")
    auth.chmod(0o600)
    server.passwords = {ROTATED}
    run = _cli("scan", server.url("split_data_00002.csv", None), "--label", "cleared",
               "--memory-limit", "2GB", "--nworkers", "1", "--dashboard-address", "", "--no-cache",
               "--storage-options", f"@{auth}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "1,000 rows in 1 blocks" in run.stdout and WARNING not in run.stderr, run.stderr
    assert header.split()[1] not in run.stdout + run.stderr
    missing = _cli("scan", server.url("split_data_00002.csv", None), "--label", "cleared",
                   "--storage-options", f"@{tmp_path / 'nope.json'}")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert (f"Invalid value for '--storage-options': expected @FILE.json, a JSON file of storage "
            f"options. Received: @{tmp_path / 'nope.json'}, which cannot be read (No such file or "
            "directory).") in " ".join(missing.stderr.split())


@pytest.mark.slow  # two `daskfeed train` runs (~1 min on 2 cores)
@pytest.mark.timeout(600)
def test_train_and_resume_over_https_credentials_write_them_nowhere(server, tmp_path):
    """files.json, history.json, the manifest, the checkpoints: none holds the password; a run
    resumed with a rotated password reads its files (their credentials are those given now)."""
    server.passwords = {PASSWORD}
    out, cache = tmp_path / "out", tmp_path / "cache"

    def train(password: str, *more: str) -> subprocess.CompletedProcess:
        return _cli("train", *(server.url(f"split_data_0000{i}.csv", password) for i in range(4)),
                    "--validation", server.url("validate_split_data_00000.csv", password),
                    "--label", "cleared", "--memory-limit", "3GB", "--nworkers", "1",
                    "--dashboard-address", "", "--cache", str(cache), "--output", str(out),
                    "--verbose", "0", *more, timeout=500)

    first = train(PASSWORD, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count(WARNING) == 1
    assert "; and 2 more)" in first.stderr  # five URLs: three named
    started = json.loads((out / "files.json").read_text())
    assert [f[0] for f in started["files"]] == [
        f"http://127.0.0.1:{server.port}/split_data_0000{i}.csv" for i in range(4)]
    assert json.loads((out / "history.json").read_text())["epochs"][0]["rows"] == 4000
    _assert_absent([PASSWORD], first, _written(out, cache))

    server.passwords = {ROTATED}
    resumed = train(ROTATED, "--epochs", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout, resumed.stdout
    assert len(json.loads((out / "history.json").read_text())["epochs"]) == 2
    _assert_absent([PASSWORD, ROTATED], resumed, _written(out, cache))
