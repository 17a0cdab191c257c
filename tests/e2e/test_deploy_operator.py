"""deploy/kubernetes/operator/: the dask-kubernetes operator's resources and the trainer Job.

Checked against the CRDs the operator ships (vendored from its wheel, see
``tests/data/dask-kubernetes-crds/README.md``), strictly: a field the CRD does not know is an
error here (the API server would silently drop it). Then the exact command lines run as
real processes on 127.0.0.1 -- the scheduler, workers and the trainer Job's ranks, with the
environment the operator and the Job controller give them -- against a real S3 API.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import jsonschema
import pytest
import yaml
from helpers import ROOT, TESTS

OPERATOR = ROOT / "deploy" / "kubernetes" / "operator"
CRDS = TESTS / "data" / "dask-kubernetes-crds"
CRD_SHA256 = {  # of the uncompressed YAML in dask_kubernetes-2026.3.0 (see the README there)
    "daskcluster": "2da8d66739b4c98c8aadb2d1653b6ae6171d35f4e6c17db14d5ab0873943b9c6",
    "daskjob": "f81511cbbdd0d8421301b9b4499dfe51eee66e5e514a878d188801d36d7a668e",
}
BIN = pathlib.Path(sys.executable).parent


# ------------------------------------------------------------------ the manifests
def _docs() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(OPERATOR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                found.append((path.name, doc))
    return found


def _one(kind: str) -> dict:
    docs = [d for _, d in _docs() if d["kind"] == kind]
    assert len(docs) == 1, kind
    return docs[0]


def _crd(name: str) -> dict:
    raw = gzip.decompress((CRDS / f"{name}.yaml.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == CRD_SHA256[name], f"{name}.yaml.gz is not the shipped CRD"
    return yaml.safe_load(raw)


def _strict(schema: dict) -> dict:
    """The CRD's schema where an object lists its properties and keeps no unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def _validator(kind: str) -> tuple[str, jsonschema.Draft7Validator]:
    crd = _crd(kind.lower())
    assert crd["spec"]["names"]["kind"] == kind
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"].update(apiVersion={"type": "string"}, kind={"type": "string"},
                                metadata={"type": "object"})
    schema.setdefault("required", []).extend(["apiVersion", "kind", "metadata"])
    return f"{crd['spec']['group']}/{version['name']}", jsonschema.Draft7Validator(schema)


def _errors(doc: dict) -> list[str]:
    api_version, validator = _validator(doc["kind"])
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in validator.iter_errors(doc)]
    if doc["apiVersion"] != api_version:
        errors.append(f"apiVersion {doc['apiVersion']!r}, expected {api_version!r}")
    return errors


def test_operator_resources_validate_against_the_shipped_crds():
    checked = 0
    for name, doc in _docs():
        if doc["kind"] in ("DaskCluster", "DaskJob"):
            assert _errors(doc) == [], name
            checked += 1
    assert checked == 2


@pytest.mark.parametrize("break_it, where", [
    (lambda d: d["spec"]["worker"].update(replica=d["spec"]["worker"].pop("replicas")),
     "spec.worker: Additional properties are not allowed ('replica' was unexpected)"),
    (lambda d: d["spec"]["scheduler"]["spec"].pop("containers"),
     "spec.scheduler.spec: 'containers' is a required property"),
    (lambda d: d["spec"]["worker"]["spec"]["containers"][0]["resources"].update(limits="7Gi"),
     "spec.worker.spec.containers.0.resources.limits: '7Gi' is not of type 'object'"),
    (lambda d: d["spec"]["worker"].update(replicas="four"),
     "spec.worker.replicas: 'four' is not of type 'integer'"),
])
def test_the_check_catches_what_the_api_server_would_drop_or_refuse(break_it, where):
    doc = copy.deepcopy(_one("DaskCluster"))
    break_it(doc)
    assert where in _errors(doc)


def _args(container: dict) -> list[str]:
    return list(container.get("command", [])) + list(container.get("args", []))


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _bytes(text: str) -> int:
    """Kubernetes quantities (7Gi) and dask sizes (6GiB, 6GB)."""
    from dask.utils import parse_bytes

    text = str(text)
    return int(parse_bytes(text + "B" if text.endswith("i") else text))


def _cluster_specs() -> list[tuple[str, dict]]:
    return [("DaskCluster", _one("DaskCluster")["spec"]),
            ("DaskJob", _one("DaskJob")["spec"]["cluster"]["spec"])]


def test_memory_limits_within_container_limits_and_images_pinned():
    containers = []
    for where, spec in _cluster_specs():
        containers += [(f"{where} worker", c) for c in spec["worker"]["spec"]["containers"]]
        containers += [(f"{where} scheduler", c) for c in spec["scheduler"]["spec"]["containers"]]
    job = _one("Job")["spec"]["template"]["spec"]["containers"]
    daskjob = _one("DaskJob")["spec"]["job"]["spec"]["containers"]
    containers += [("Job trainer", c) for c in job] + [("DaskJob trainer", c) for c in daskjob]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    tag = re.search(r"-t (daskfeed:[\w.]+)", dockerfile).group(1)
    for where, c in containers:
        assert c["image"] == tag, where
        limits, requests = c["resources"]["limits"], c["resources"]["requests"]
        assert _bytes(requests["memory"]) <= _bytes(limits["memory"]), where
        args = _args(c)
        if "--memory-limit" in args:  # workers (dask) and trainers (daskfeed): below the limit
            assert _bytes(_flag(args, "--memory-limit")) < _bytes(limits["memory"]), where
            if args[:2] == ["dask", "worker"]:
                assert _bytes(requests["memory"]) == _bytes(limits["memory"]), where  # guaranteed
        else:
            assert args[:2] == ["dask", "scheduler"], where
        assert not any(a.startswith("dask-") for a in args), where  # two-word commands only


def test_trainer_job_points_at_the_operator_service_and_ranks_add_up():
    cluster = _one("DaskCluster")
    service = cluster["spec"]["scheduler"]["service"]
    assert service["selector"]["dask.org/cluster-name"] == cluster["metadata"]["name"]
    comm = next(p for p in service["ports"] if p["name"] == "tcp-comm")
    job = _one("Job")
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    # the operator names the Service <cluster>-scheduler
    assert _flag(_args(trainer), "--scheduler") == \
        f"tcp://{cluster['metadata']['name']}-scheduler:{comm['port']}"
    env = {e["name"]: e for e in trainer["env"]}
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert int(env["WORLD_SIZE"]["value"]) == spec["completions"] == spec["parallelism"]
    daskjob = _one("DaskJob")
    assert daskjob["spec"]["cluster"]["spec"]["scheduler"]["service"]["selector"][
        "dask.org/cluster-name"] == daskjob["metadata"]["name"]
    assert _flag(_args(daskjob["spec"]["job"]["spec"]["containers"][0]), "--scheduler") == \
        "$(DASK_SCHEDULER_ADDRESS)"
    # one cluster shape: the DaskJob's cluster is the DaskCluster's
    assert _one("DaskJob")["spec"]["cluster"]["spec"]["worker"] == cluster["spec"]["worker"]


# ------------------------------------------------------------------ the command lines, run
def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of command and args from the container's environment."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def _listen_on_loopback(args: list[str], scheduler_file: str | None = None) -> list[str]:
    """Bind what the Pod binds on 0.0.0.0 / fixed ports to 127.0.0.1 and free ports instead."""
    args = list(args)
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0"),
                        ("--dashboard-address", "127.0.0.1:0")):
        if flag in args:
            args[args.index(flag) + 1] = value
    return args + (["--scheduler-file", scheduler_file] if scheduler_file else [])


@pytest.fixture(scope="module")
def s3_data(tmp_path_factory):
    """moto's S3 on 127.0.0.1 with the bucket the manifests name, holding small quest logs."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from s3server import moto_s3

    from daskfeed.cli._demo import write_demo_data

    data = pathlib.Path(write_demo_data(tmp_path_factory.mktemp("opdata"), rows=8000,
                                        validate_rows=2000).root)
    with moto_s3(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket="daskfeed-data")
        for sub in ("log_quest", "log_quest_validate"):
            server.upload("daskfeed-data", sub, sorted((data / sub / "splited").glob("*.csv")))
        yield server


@pytest.mark.slow  # S3 (moto) and three dask processes; the CRDs' checks stay in the fast tier
@pytest.mark.timeout(900)
def test_operator_command_lines_train_on_127_0_0_1(s3_data, tmp_path, stop_process_groups):
    from helpers import wait_for_scheduler_file

    secret = {**s3_data.env(), "AWS_ENDPOINT_URL": s3_data.endpoint}  # the daskfeed-s3 Secret
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("AWS_") and k not in ("RANK", "WORLD_SIZE", "TF_CONFIG")}
    base.update(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    spec = _one("DaskCluster")["spec"]
    sched = spec["scheduler"]["spec"]["containers"][0]
    worker = spec["worker"]["spec"]["containers"][0]
    sf = str(tmp_path / "scheduler.json")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    bin_env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    procs = [subprocess.Popen(_listen_on_loopback(_args(sched), sf), env={**base, **bin_env},
                              start_new_session=True, **quiet)]
    try:
        wait_for_scheduler_file(sf, procs[0])
        address = json.loads(pathlib.Path(sf).read_text())["address"]
        for i in range(2):  # what the operator sets in each worker Pod
            env = {**base, **bin_env, **secret, "DASK_SCHEDULER_ADDRESS": address,
                   "DASK_WORKER_NAME": f"daskfeed-default-worker-{i}"}
            args = _listen_on_loopback(_expand(_args(worker), env))
            assert _flag(args, "--name") == f"daskfeed-default-worker-{i}"
            procs.append(subprocess.Popen([*args, "--host", "127.0.0.1"], env=env,
                                          start_new_session=True, **quiet))
        job = _one("Job")["spec"]
        trainer = job["template"]["spec"]["containers"][0]
        world = int(next(e["value"] for e in trainer["env"] if e["name"] == "WORLD_SIZE"))
        runs = []
        for index in range(job["completions"]):  # one Pod per completion index
            env = {**base, **bin_env, **secret, "RANK": str(index), "WORLD_SIZE": str(world)}
            args = _expand(_args(trainer), env)
            # the Service's name resolves to the scheduler; /out is the volume; a short run
            args[args.index("--scheduler") + 1] = address
            args[args.index("--output") + 1] = str(tmp_path / "out")
            args[args.index("--epochs") + 1] = "1"
            runs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True,
                                         start_new_session=True))
        procs += runs
        outputs = [r.communicate(timeout=800) for r in runs]
    finally:
        stop_process_groups(procs)
    for r, (stdout, stderr) in zip(runs, outputs, strict=True):
        assert r.returncode == 0, stdout[-2000:] + stderr[-3000:]
    texts = [o[0] for o in outputs]
    assert sum("(scanned in" in t for t in texts) == 1, texts
    hist = json.loads((tmp_path / "out" / "history.json").read_text())
    other = json.loads((tmp_path / "out" / "rank-1" / "history.json").read_text())
    assert hist["ranks"]["rank"] == 0 and other["ranks"]["rank"] == 1
    assert hist["ranks"]["from"] == "RANK/WORLD_SIZE"
    # the global order: rank r takes batches r, r + 2, ...; the epoch's last rows, short of a
    # batch for every rank, are left out by both and counted
    assert hist["ranks"]["shard"].startswith("batches b of the global order with b % 2 == 0")
    dropped = hist["ranks"]["dropped_rows_per_epoch"]
    assert dropped == other["ranks"]["dropped_rows_per_epoch"] < 2 * 1024
    assert hist["epochs"][0]["rows"] + other["epochs"][0]["rows"] + dropped == 8000
    assert hist["epochs"][0]["rows"] == other["epochs"][0]["rows"] == \
        hist["ranks"]["batches_per_epoch"] * 1024  # the default batch size
    assert 0.0 < hist["epochs"][0]["val_accuracy"] <= 1.0  # validated on s3:// data too
    for stdout, stderr in outputs:
        assert s3_data.secret not in stdout + stderr
