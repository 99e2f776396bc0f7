"""A real S3-compatible server for tests: moto's standalone server over HTTP on 127.0.0.1.

Each test session (each pytest-xdist worker, each checkout) starts its own on a free port, so
two test runs beside each other never share a bucket. Clients reach it the way a user reaches
MinIO or R2: `AWS_ENDPOINT_URL` and a key pair in the environment (`s3_env`), through the
standard AWS chain, so what is tested is the wire, not a patched client.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# any key pair works against moto; a user's real credentials are never in a test's environment
TEST_KEYS = {
    "AWS_ACCESS_KEY_ID": "gradebook-test-key",
    "AWS_SECRET_ACCESS_KEY": "gradebook-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
START_TIMEOUT_S = float(os.environ.get("GRADEBOOK_TEST_S3_TIMEOUT", "120"))


class S3ServerError(RuntimeError):
    """The test S3 server did not start (the message says why)."""


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen

    def env(self) -> dict[str, str]:
        """The environment a client (this process or a `gradebook` subprocess) needs."""
        return {**TEST_KEYS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=TEST_KEYS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=TEST_KEYS["AWS_SECRET_ACCESS_KEY"],
            region_name=TEST_KEYS["AWS_DEFAULT_REGION"],
        )

    def new_bucket(self, prefix: str = "gb") -> str:
        """A fresh, empty bucket; returns its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server(log_dir: Path) -> Iterator[S3Server]:
    """Run `python -m moto.server` on a free port until the block ends.

    Raises:
        S3ServerError: moto is not installed, or the server did not answer in time.
    """
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise S3ServerError(f"moto[server] is not installed ({exc}): run `make install`") from exc
    log_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a port taken between choosing it and binding it: choose again
        port = free_port()
        log = open(log_dir / f"moto-{port}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **TEST_KEYS},
        )
        endpoint = f"http://127.0.0.1:{port}"
        if _answers(endpoint, proc):
            try:
                yield S3Server(endpoint, proc)
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.close()
            return
        proc.kill()
        proc.wait()
        log.close()
    tail = (log_dir / f"moto-{port}.log").read_text(errors="replace")[-500:]
    raise S3ServerError(f"moto's S3 server did not start on 127.0.0.1: {tail}")


def _answers(endpoint: str, proc: subprocess.Popen) -> bool:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=5):
                return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            time.sleep(0.1)  # polling a condition: the server's socket accepting
    return False
