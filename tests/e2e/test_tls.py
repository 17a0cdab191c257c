"""tls:// schedulers: a real ``dask scheduler`` and ``dask worker`` speaking TLS with certificates
made here (a private CA), reached through distributed's ``Security`` from Python and the CLI."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from helpers import load_factor, wait_for_scheduler_file

pytest.importorskip("cryptography")

BIN = pathlib.Path(sys.executable).parent
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _ca(name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def _write(directory: pathlib.Path, name: str, key, cert) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization

    crt, pem = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        os.chmod(pem, 0o600)
    return str(crt), str(pem)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, stop_process_groups):
    """A TLS ``dask scheduler`` + ``dask worker`` on 127.0.0.1; yields paths and the address."""
    d = tmp_path_factory.mktemp("tls")
    ca_key, ca_cert = _ca("daskfeed test CA")
    ca, _ = _write(d, "ca", None, ca_cert)
    node_crt, node_key = _write(d, "node", *_leaf(ca_key, ca_cert, "dask node"))
    client_crt, client_key = _write(d, "client", *_leaf(ca_key, ca_cert, "daskfeed client"))
    other_key, other_cert = _ca("some other CA")
    other_crt, other_pem = _write(d, "other", *_leaf(other_key, other_cert, "stranger"))
    sf = str(d / "scheduler.json")
    tls = ["--tls-ca-file", ca, "--tls-cert", node_crt, "--tls-key", node_key]
    dask = str(BIN / "dask")
    procs = [subprocess.Popen([dask, "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
                               "--port", "0", "--dashboard-address", "127.0.0.1:0",
                               "--scheduler-file", sf, *tls],
                              env=ENV, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        wait_for_scheduler_file(sf, procs[0])
        address = json.loads(pathlib.Path(sf).read_text())["address"]
        procs.append(subprocess.Popen([dask, "worker", address, "--host", "127.0.0.1",
                                       "--nthreads", "1", "--dashboard-address", "127.0.0.1:0",
                                       "--memory-limit", "1GB", *tls],
                                      env=ENV, start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        yield {"address": address, "scheduler_file": sf, "ca": ca, "cert": client_crt,
               "key": client_key, "other_cert": other_crt, "other_key": other_pem}
    finally:
        stop_process_groups(procs)


def test_tls_scheduler_through_security(tls_cluster):
    from daskfeed.cluster._remote import connect, make_security
    from daskfeed.cluster._start import close_client

    assert tls_cluster["address"].startswith("tls://127.0.0.1:")
    sec = make_security(tls_cluster["ca"], tls_cluster["cert"], tls_cluster["key"])
    client = connect(tls_cluster["address"], security=sec)
    try:
        client.wait_for_workers(1, timeout=60)
        assert client.submit(sum, [1, 2, 3]).result(timeout=30) == 6
        workers = client.scheduler_info()["workers"]
        assert all(addr.startswith("tls://127.0.0.1:") for addr in workers), workers
    finally:
        close_client(client)


def test_tls_scheduler_without_credentials_or_with_a_foreign_cert_is_a_clear_error(tls_cluster):
    from daskfeed.cluster._remote import connect, make_security
    from daskfeed.core._exceptions import ClusterError

    for target in (tls_cluster["address"], tls_cluster["scheduler_file"]):
        with pytest.raises(ClusterError, match="speaks TLS") as info:
            connect(target)
        assert "--tls-ca-file" in str(info.value) and "Hint:" in str(info.value)
    stranger = make_security(tls_cluster["ca"], tls_cluster["other_cert"], tls_cluster["other_key"])
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="Cannot connect") as info:
        connect(tls_cluster["address"], security=stranger, timeout="5s")
    assert "Hint:" in str(info.value)
    assert time.monotonic() - t0 < 30 * load_factor()
    with pytest.raises(ClusterError, match="Expected a PEM file"):
        make_security(tls_cluster["ca"], "/no/such/cert.pem")
    with pytest.raises(ClusterError, match="Expected both a CA file"):
        make_security(None, tls_cluster["cert"])


@pytest.mark.slow
def test_cli_trains_end_to_end_through_tls(tls_cluster, id_data, tmp_path):
    exe = str(BIN / "daskfeed")
    base = [exe, "train", id_data.train_glob, "--label", "cleared", "--epochs", "1",
            "--memory-limit", "2GB", "--verbose", "0", "--output", str(tmp_path / "out")]
    bare = subprocess.run([*base, "--scheduler", tls_cluster["address"]], capture_output=True,
                          text=True, env=ENV, timeout=120)
    assert bare.returncode == 1, bare.stderr[-2000:]
    assert "speaks TLS" in bare.stderr and "Traceback" not in bare.stderr, bare.stderr[-2000:]
    run = subprocess.run([*base, "--validation", id_data.validate_glob,
                          "--scheduler-file", tls_cluster["scheduler_file"],
                          "--tls-ca-file", tls_cluster["ca"], "--tls-cert", tls_cluster["cert"],
                          "--tls-key", tls_cluster["key"]],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "connected to tls://127.0.0.1:" in run.stdout, run.stdout
    hist = json.loads((tmp_path / "out" / "history.json").read_text())
    assert hist["epochs"][0]["rows"] == id_data.train_rows
    flags_alone = subprocess.run([*base, "--tls-ca-file", tls_cluster["ca"], "--tls-cert",
                                  tls_cluster["cert"]], capture_output=True, text=True, env=ENV,
                                 timeout=120)
    assert flags_alone.returncode == 2 and "need --scheduler" in flags_alone.stderr
