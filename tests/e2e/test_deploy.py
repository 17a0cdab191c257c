"""deploy/: every manifest parses and is consistent; its command lines run as real processes."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import urllib.request

import pytest
import yaml
from helpers import ROOT, compose_commands, wait_for_scheduler_file

DEPLOY = ROOT / "deploy"
BIN = pathlib.Path(sys.executable).parent
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _docs():
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                yield path, doc


def _size(text: str) -> int:
    """Kubernetes / compose / dask sizes: 7Gi, 7g (GiB in compose), 6GiB, 6GB."""
    from dask.utils import parse_bytes

    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", str(text).strip())
    assert m, text
    num, unit = float(m.group(1)), m.group(2)
    compose_units = {"g": 2**30, "m": 2**20, "k": 2**10, "": 1}
    if unit in compose_units:
        return int(num * compose_units[unit])
    if unit.endswith("i"):
        unit += "B"
    return int(parse_bytes(f"{m.group(1)}{unit}"))


def _containers():
    for path, doc in _docs():
        if path.name == "compose.yaml":
            for name, svc in doc["services"].items():
                yield f"{path.name}:{name}", svc["image"], svc["command"], svc.get("mem_limit")
        elif doc.get("kind") == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                yield (f"{path.name}:{c['name']}", c["image"], c["command"],
                       c["resources"]["limits"]["memory"])


def test_every_manifest_parses():
    names = {p.name for p, _ in _docs()}
    assert {"compose.yaml", "scheduler.yaml", "workers.yaml"} <= names
    assert (DEPLOY / "Dockerfile").read_text().startswith("#")


def test_images_pinned_commands_two_word_memory_within_limits():
    seen = 0
    for where, image, command, limit in _containers():
        seen += 1
        assert re.fullmatch(r"[\w./-]+:\d[\w.-]*", image) and not image.endswith(":latest"), where
        assert command[0] == "dask" and command[1] in ("scheduler", "worker"), where
        assert not any(part.startswith("dask-") for part in command), where
        if command[1] == "worker":
            worker_limit = _size(command[command.index("--memory-limit") + 1])
            assert worker_limit <= _size(limit), f"{where}: worker limit above container limit"
    assert seen >= 4
    assert "FROM python:3.11.7-slim-bookworm" in (DEPLOY / "Dockerfile").read_text()


def test_health_probes_on_the_dashboard_port():
    probes = 0
    for _, doc in _docs():
        if doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            probe = c["livenessProbe"]["httpGet"]
            assert probe["path"] == "/health"
            assert probe["port"] == (8787 if "scheduler" in c["command"] else 8788)
            probes += 1
    assert probes == 2


def _tls_files(command: list[str]) -> dict[str, str]:
    return {flag: command[command.index(flag) + 1]
            for flag in ("--tls-ca-file", "--tls-cert", "--tls-key") if flag in command}


def test_scheduler_and_workers_speak_tls_with_files_from_a_read_only_mount():
    """compose.yaml and the plain Kubernetes manifests (not the operator's: deploy/README.md)."""
    uid = re.search(r"useradd .*--uid (\d+)", (DEPLOY / "Dockerfile").read_text()).group(1)
    seen = set()
    for path, doc in _docs():
        if path.name == "compose.yaml":
            pods = [(name, svc["command"], [v.split(":") for v in svc.get("volumes", [])])
                    for name, svc in doc["services"].items()]
            mounts = {name: {dst: src for src, dst, *mode in vols if mode == ["ro"]}
                      for name, _, vols in pods}
            commands = [(f"compose:{name}", cmd, mounts[name]) for name, cmd, _ in pods]
            assert all(m.get("/tls") == "./tls" for m in mounts.values()), mounts
        elif doc.get("kind") == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            assert str(spec["securityContext"]["fsGroup"]) == uid, path.name  # reads the key
            secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
            assert all(s["secretName"] == "daskfeed-tls" and s["defaultMode"] == 0o440
                       for s in secrets.values()), secrets
            commands = [(f"{path.name}:{c['name']}", c["command"],
                         {m["mountPath"]: m["name"] for m in c["volumeMounts"]
                          if m.get("readOnly") and m["name"] in secrets})
                        for c in spec["containers"]]
        else:
            continue
        for where, cmd, mounts in commands:
            files = _tls_files(cmd)
            assert set(files) == {"--tls-ca-file", "--tls-cert", "--tls-key"}, where
            for file in files.values():  # a file make_certs.py writes, where it is mounted
                folder, name = file.rsplit("/", 1)
                assert folder in mounts and name in ("ca.pem", "node.pem", "node.key"), where
            if cmd[1] == "scheduler":
                assert cmd[cmd.index("--protocol") + 1] == "tls", where
            else:
                assert next(a for a in cmd if "://" in a).startswith("tls://"), where
            seen.add(where)
    assert len(seen) == 4, seen
    readme = (DEPLOY / "README.md").read_text()
    assert "kubectl create secret generic daskfeed-tls" in readme


def test_make_certs_writes_private_keys_signed_by_its_ca_and_overwrites_nothing(tmp_path):
    from cryptography import x509

    made = subprocess.run([sys.executable, str(DEPLOY / "make_certs.py"), str(tmp_path / "tls")],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    d = tmp_path / "tls"
    assert sorted(p.name for p in d.iterdir()) == sorted(
        ["ca.pem", "ca.key", "node.pem", "node.key", "client.pem", "client.key"])
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert all(os.stat(k).st_mode & 0o777 == 0o600 for k in d.glob("*.key"))
    ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    for leaf in ("node", "client"):
        cert = x509.load_pem_x509_certificate((d / f"{leaf}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
    before = (d / "ca.key").read_bytes()
    again = subprocess.run([sys.executable, str(DEPLOY / "make_certs.py"), str(d)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "Expected a new or empty directory" in again.stderr and "Hint:" in again.stderr
    assert (d / "ca.key").read_bytes() == before


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
@pytest.mark.timeout(400)
def test_scale_out_on_real_dask_scheduler_and_workers(demo_data, tmp_path, stop_process_groups):
    sf = str(tmp_path / "scheduler.json")
    sched_cmd, worker_cmd, tls = compose_commands(sf)
    dask = str(BIN / "dask")
    procs = [subprocess.Popen([dask, *sched_cmd[1:]], env=ENV, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_for_scheduler_file(sf, procs[0])
        info = json.loads(open(sf, encoding="utf-8").read())
        assert info["address"].startswith("tls://127.0.0.1:")
        port = info["services"]["dashboard"]
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read() == b"ok"
        for _ in range(2):
            procs.append(subprocess.Popen([dask, *worker_cmd[1:]], env=ENV, start_new_session=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        out_dir = tmp_path / "out"
        run = subprocess.run(
            [str(BIN / "daskfeed"), "train", demo_data.train_glob, "--label", "cleared",
             "--validation", demo_data.validate_glob, "--epochs", "1", "--scheduler-file", sf,
             "--memory-limit", "2GB", "--output", str(out_dir), "--verbose", "0", *tls],
            capture_output=True, text=True, env=ENV, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "connected to tls://127.0.0.1:" in run.stdout
        assert re.search(r"\d workers × 6\.44 GB", run.stdout), run.stdout
        hist = json.loads((out_dir / "history.json").read_text())
        assert hist["epochs"][0]["rows"] == demo_data.train_rows
        assert hist["epochs"][0]["val_accuracy"] > 0.7
    finally:
        stop_process_groups(procs)


def _tls_config(flags: list[str]) -> dict[str, str]:
    """The trainer's --tls-* flags as distributed's configuration (a trainer Pod's environment)."""
    ca, cert, key = (flags[flags.index(f) + 1] for f in ("--tls-ca-file", "--tls-cert", "--tls-key"))
    return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": ca,
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": cert,
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": key}


def _big_csv(path: pathlib.Path, mbytes: int) -> int:
    """One CSV file of about ``mbytes`` MB (a 10,000-row block repeated); its row count."""
    import numpy as np

    rng = np.random.default_rng(0)
    block = np.column_stack([rng.normal(size=(10_000, 5)).round(4), rng.integers(0, 2, 10_000)])
    lines = "".join(f"{a},{b},{c},{d},{e},{int(y)}\n" for a, b, c, d, e, y in block)
    reps = -(-mbytes * 10**6 // len(lines))
    path.write_text("a,b,c,d,e,cleared\n" + lines * reps, encoding="utf-8")
    return 10_000 * reps


@pytest.mark.timeout(400)
def test_worker_too_small_for_the_planned_partition_is_refused_before_training(
        client, tmp_path, stop_process_groups):
    """A manifest made on a bigger machine (one 60 MB partition) meets 300 MB workers."""
    from daskfeed.reading._source import Source
    from daskfeed.scanning._scan import scan

    data = tmp_path / "big.csv"
    rows = _big_csv(data, 60)
    out = tmp_path / "out"
    out.mkdir()
    m = scan(Source(str(data), blocksize="64MiB"), label="cleared", client=client,
             parse_cache=None)
    assert m.rows == rows and len(m.blocks) == 1
    m.to_json(str(out / "manifest.json"))

    sf = str(tmp_path / "scheduler.json")
    sched_cmd, worker_cmd, tls = compose_commands(sf)
    worker_cmd[worker_cmd.index("--memory-limit") + 1] = "300MB"
    dask = str(BIN / "dask")
    procs = [subprocess.Popen([dask, *sched_cmd[1:]], env=ENV, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_for_scheduler_file(sf, procs[0])
        procs.append(subprocess.Popen([dask, *worker_cmd[1:]], env=ENV, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        run = subprocess.run(
            [str(BIN / "daskfeed"), "train", str(data), "--label", "cleared", "--blocksize", "64MiB",
             "--scheduler-file", sf, "--memory-limit", "2GB", "--output", str(out),
             "--verbose", "0"], capture_output=True, text=True, timeout=300,
            env={**ENV, **_tls_config(tls)})  # no --tls-* flags: distributed's config
    finally:
        stop_process_groups(procs)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    err = run.stderr
    assert "Traceback" not in err
    size = m.nbytes / 2**20
    assert re.search(rf"Expected Dask workers whose memory limit holds the planned block of "
                     rf"{size:.2f} MiB CSV: parsing it takes about [\d.]+ MiB \(6 × its bytes\) per "
                     rf"thread\. Received: worker tls://127\.0\.0\.1:\d+ \(name '[^']+'\) with a "
                     rf"memory limit of 286\.10 MiB \(0\.30 GB\)", err), err
    assert "restarted by its nanny at 95% of it" in err
    assert re.search(r"Hint: start the workers with --memory-limit [\d.]+GB or more", err), err
    assert not (out / "history.json").exists() and not (out / "model.keras").exists()


def test_check_worker_memory_against_real_workers(client):
    """2 GiB workers, one thread: a 256 MiB window (1.5 GiB to parse) fits, 400 MiB does not."""
    from daskfeed.cluster._budget import check_worker_memory, worker_memory
    from daskfeed.core._exceptions import BudgetError

    workers = worker_memory(client)
    assert len(workers) == 2 and {w.limit for w in workers} == {2 * 2**30}
    assert {w.terminate for w in workers} == {0.95}
    check_worker_memory(client, 256 * 2**20)
    with pytest.raises(BudgetError, match=r"planned shuffle window of 400\.00 MiB CSV: parsing it "
                                          r"takes about 2\.34 GiB .* Received: worker "
                                          r"tcp://127\.0\.0\.1:\d+ .*memory limit of 2\.00 GiB "
                                          r"\(2\.15 GB\).*\(1 other worker\(s\) too\)"):
        check_worker_memory(client, 400 * 2**20)
