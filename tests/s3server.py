"""A real S3 API on 127.0.0.1 for the tests: moto's server mode, with authentication on.

``moto_server`` is started as a process of its own (``start_new_session``); requests are
signed and checked against IAM: the first three actions are unauthenticated (moto's
``INITIAL_NO_AUTH_ACTION_COUNT``) and create the user ``admin`` (every action allowed) and its
access key; everything after that needs a valid key and a policy that allows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and the admin's credentials."""

    endpoint: str
    key: str
    secret: str

    def env(self, key: str | None = None, secret: str | None = None) -> dict[str, str]:
        """Environment variables that give a process these credentials (boto's usual ones)."""
        return {"AWS_ACCESS_KEY_ID": key or self.key, "AWS_SECRET_ACCESS_KEY": secret or self.secret,
                "AWS_DEFAULT_REGION": REGION}

    def client(self, service: str = "s3", key: str | None = None, secret: str | None = None):
        """A boto3 client of ``service`` on this server."""
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=key or self.key,
                            aws_secret_access_key=secret or self.secret)

    def user(self, name: str, statements: list[dict]) -> tuple[str, str]:
        """Create IAM user ``name`` with these policy statements; its (key, secret)."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": statements}))
        made = iam.create_access_key(UserName=name)["AccessKey"]
        return made["AccessKeyId"], made["SecretAccessKey"]

    def upload(self, bucket: str, prefix: str, files: list[pathlib.Path]) -> list[str]:
        """Put ``files`` under ``s3://bucket/prefix/``; their URLs."""
        s3 = self.client()
        urls = []
        for f in files:
            key = f"{prefix}/{f.name}"
            s3.put_object(Bucket=bucket, Key=key, Body=f.read_bytes())
            urls.append(f"s3://{bucket}/{key}")
        return urls


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"moto_server exited with status {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, f"moto_server not listening on {port} after {timeout:g}s"
        time.sleep(0.1)  # polling interval


@contextlib.contextmanager
def moto_s3(log_dir: pathlib.Path) -> Iterator[S3Server]:
    """Run ``moto_server`` on a free port of 127.0.0.1 with IAM authentication enforced."""
    import signal

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
    log = open(log_dir / "moto.log", "wb")  # closed below
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                             "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_listening(port, proc)
        import boto3

        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION,
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="admin")  # the three unauthenticated actions
        iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        made = iam.create_access_key(UserName="admin")["AccessKey"]
        yield S3Server(endpoint, made["AccessKeyId"], made["SecretAccessKey"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
