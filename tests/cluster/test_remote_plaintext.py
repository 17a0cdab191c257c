"""A scheduler on another host over plain tcp://: a one-line warning, and no credentials sent
there unless the config allows it. A real ``dask scheduler`` and ``dask worker`` listen on this
machine's own network address (not loopback), which daskfeed cannot tell from another host's."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
from helpers import wait_for_scheduler_file

BIN = pathlib.Path(sys.executable).parent
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
CREDENTIALS = ["--storage-options", "key=AKIDEXAMPLE", "--storage-options",
               "secret=wJalrXUtnFEMI-not-a-real-secret"]


def _network_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None: loopback only)."""
    import ipaddress

    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


@pytest.fixture(scope="module")
def plain_cluster(tmp_path_factory, stop_process_groups):
    """``dask scheduler`` on 0.0.0.0 (plain tcp://) and one worker; the scheduler's port."""
    ip = _network_address()
    if ip is None:
        pytest.skip("this machine has no network address but loopback")
    d = tmp_path_factory.mktemp("plain")
    sf = str(d / "scheduler.json")
    dask = str(BIN / "dask")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "0.0.0.0", "--port", "0",
                               "--dashboard-address", "127.0.0.1:0", "--scheduler-file", sf],
                              env=ENV, start_new_session=True, **quiet)]
    try:
        wait_for_scheduler_file(sf, procs[0])
        port = json.loads(pathlib.Path(sf).read_text())["address"].rsplit(":", 1)[1]
        procs.append(subprocess.Popen([dask, "worker", f"tcp://{ip}:{port}", "--host", ip,
                                       "--nthreads", "1", "--memory-limit", "2GB",
                                       "--dashboard-address", "127.0.0.1:0"],
                                      env=ENV, start_new_session=True, **quiet))
        yield {"remote": f"tcp://{ip}:{port}", "loopback": f"tcp://127.0.0.1:{port}",
               "dir": d}
    finally:
        stop_process_groups(procs)


def test_a_scheduler_on_another_host_over_tcp_is_warned_of_in_one_line(plain_cluster):
    from daskfeed.cluster._remote import connect
    from daskfeed.cluster._start import close_client

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = connect(plain_cluster["remote"])
    try:
        assert client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
    finally:
        close_client(client)
    said = [str(w.message) for w in caught if "plain tcp://" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert plain_cluster["remote"] in said[0] and "\n" not in said[0]
    assert "unencrypted and unauthenticated" in said[0] and "Hint: " in said[0]
    assert "tls://" in said[0] and "--tls-ca-file" in said[0]
    # the same scheduler through loopback: nothing crosses a network, nothing said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = connect(plain_cluster["loopback"])
    close_client(client)
    assert not [w for w in caught if "plain tcp://" in str(w.message)]


def test_credentials_for_it_are_refused_before_connecting_unless_allowed(plain_cluster):
    import dask.config
    from distributed import Client

    from daskfeed.cluster._remote import connect
    from daskfeed.cluster._start import acquire_client, close_client
    from daskfeed.core import SettingError

    secret = {"key": "AKIDEXAMPLE", "client_kwargs": {"aws_secret_access_key": "hush-hush"}}
    with pytest.raises(SettingError) as info:
        connect(plain_cluster["remote"], storage_options=secret)
    text = str(info.value)
    assert text.startswith("Expected credentials in the storage options only for a scheduler "
                           "reached over TLS (tls://)"), text
    assert (f"Received: key, client_kwargs.aws_secret_access_key in the storage options, for the "
            f"scheduler {plain_cluster['remote']} on another host over plain tcp://") in text
    assert "\nHint: " in text and "daskfeed.allow-plaintext-credentials: true" in text
    assert "AKIDEXAMPLE" not in text and "hush-hush" not in text
    # a Client of the user's own, to the same scheduler: the same refusal
    with Client(plain_cluster["remote"], timeout="30s", set_as_default=False) as own:
        with pytest.raises(SettingError, match="Expected credentials"):
            acquire_client(own, secret)
        assert acquire_client(own, {"endpoint_url": "http://minio:9000", "anon": True})[0] is own
    # loopback, and the opt-in, connect
    close_client(connect(plain_cluster["loopback"], storage_options=secret))
    with dask.config.set({"daskfeed.allow-plaintext-credentials": "true"}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the plain tcp:// warning: the test above)
        client = connect(plain_cluster["remote"], storage_options=secret)
    assert client.submit(sum, [2, 3], pure=False).result(timeout=60) == 5
    close_client(client)


def test_the_cli_refuses_them_without_a_traceback_and_the_opt_in_scans(plain_cluster,
                                                                         small_files):
    exe = str(BIN / "daskfeed")
    cmd = [exe, "scan", small_files, "--label", "cleared", "--memory-limit", "2GB",
           "--scheduler", plain_cluster["remote"], *CREDENTIALS]
    refused = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert refused.returncode == 1, refused.stdout[-2000:] + refused.stderr[-2000:]
    err = refused.stderr
    assert "Error: Expected credentials in the storage options only for a scheduler" in err, err
    assert "Received: key, secret in the storage options" in err and "Hint: " in err, err
    assert "Traceback" not in err and "not-a-real-secret" not in err + refused.stdout
    assert "connected to" not in refused.stdout  # refused before connecting
    allowed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={
        **ENV, "DASK_DASKFEED__ALLOW_PLAINTEXT_CREDENTIALS": "true"})
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]
    assert f"connected to {plain_cluster['remote']}" in allowed.stdout
    assert "3,000 rows" in allowed.stdout, allowed.stdout
    warned = [line for line in allowed.stderr.splitlines() if "plain tcp://" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: the scheduler "), allowed.stderr
    assert "not-a-real-secret" not in allowed.stdout + allowed.stderr


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """3,000 quest rows in 3 files: a glob."""
    from daskfeed.cli._demo import write_demo_data

    return write_demo_data(tmp_path_factory.mktemp("rows"), rows=3000, validate_rows=1000).train_glob


def test_credential_names_are_the_options_that_hold_one():
    from daskfeed.cluster._remote import credential_names

    assert credential_names({
        "key": "AK", "secret": "S", "endpoint_url": "http://x", "anon": False,
        "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": "T"},
        "headers": {"Authorization": "Bearer x"}, "token": "anon", "sas_token": "",
        "password": None, "config_kwargs": {"signature_version": "s3v4"},
        "account_key": "K", "connection_string": "DefaultEndpointsProtocol=https;...",
    }) == ["key", "secret", "client_kwargs.aws_session_token", "headers.Authorization",
           "account_key", "connection_string"]
    assert credential_names(None) == [] and credential_names({"anon": True}) == []
    assert credential_names({"token": {"client_email": "a@b", "private_key": "..."}}) == ["token"]
