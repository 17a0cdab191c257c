"""Secrets stay secret: the real CLI on data behind HTTP basic auth (``tests/httpserver.py``).

``--storage-options @FILE.json`` keeps credentials off the command line (not warned of).
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
