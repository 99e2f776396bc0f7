"""Test material for the cluster tests: the cluster's Prefect server as infra/cluster starts it,
workers as process groups, a slow test verifier, model args.

`mock_args` is what a test sweep's `args_from` names: the GPU worker imports this module (the
tests directory is on its PYTHONPATH) and builds mockllm's scripted outputs there, because a
Python callable cannot travel to a worker as JSON.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flows_kit
from conftest import need
from process_kit import wait_for

INFRA = Path(__file__).resolve().parents[1] / "infra" / "cluster"
# What a log must never hold after a small cluster run.
LOG_ERRORS = ("Traceback", "database is locked")

WRONG = {2, 5}


def mock_args() -> dict[str, Any]:
    """mockllm args: right answers except for operands in WRONG."""
    return {"custom_outputs": flows_kit.mock_outputs(WRONG)}


SLOW_VERIFIER = textwrap.dedent(
    '''
    """{name}: last word equals the target, after a pause (long enough to kill a chunk mid-way)."""
    import time

    from scorers.grade import SampleView, scored
    from scorers.registry import Verifier, register

    DELAY_S = {delay!r}


    def grade(view: SampleView):
        time.sleep(DELAY_S)
        words = view.completion.split()
        answer = words[-1] if words else None
        ok = answer == view.targets[0]
        return scored(
            1.0 if ok else 0.0,
            answer=answer,
            explanation="equal" if ok else "mismatch",
            reason="verified_equal" if ok else "mismatch",
        )


    register(Verifier("{name}", grade, module="{name}", params={{}}, label="test: slow last word"))
    '''
)


def write_slow_verifier(directory: Path, name: str, delay_s: float) -> Path:
    path = directory / f"{name}.py"
    path.write_text(SLOW_VERIFIER.format(name=name, delay=delay_s))
    return path


class Worker:
    """A `prefect worker start` subprocess in its own process group (killed as a whole)."""

    def __init__(
        self, pool: str, env: dict[str, str], log: Path, name: str, cwd: Path | None = None
    ) -> None:
        from flows.cluster.setup import worker_command

        self.pool = pool
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                worker_command(pool, name=name),
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL the worker's whole process group: what a host losing power looks like."""
        kill_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        kill_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            kill_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def need_postgres() -> None:
    """Skip (fail under CI) where infra/cluster/postgres.sh can neither find nor install
    PostgreSQL."""
    need(
        bool(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or os.geteuid() == 0,
        "PostgreSQL is not installed and this is not root: apt-get install -y postgresql",
    )
    need(shutil.which("runuser") is not None or os.geteuid() != 0, "runuser is missing")


def postgres_data_dir() -> Path:
    """A fresh directory for a PostgreSQL data dir; not under pytest's tmp dir, where the
    postgres user (root runs PostgreSQL as that user) could not reach it. The caller removes it."""
    parent = Path(tempfile.mkdtemp(prefix="gradebook-pg-", dir="/tmp"))
    os.chmod(parent, 0o755)
    return parent


@dataclass(frozen=True)
class ClusterServer:
    api_url: str
    log: Path  # everything the server (and start_server.sh) printed
    pg_dir: Path


@contextmanager
def cluster_server(home: Path) -> Iterator[ClusterServer]:
    """`infra/cluster/start_server.sh` with its defaults (its own PostgreSQL) on free ports of
    127.0.0.1, its PostgreSQL in a temp data dir; both stopped afterwards."""
    from flows.runtime.server import (
        PrefectServerError,
        free_port,
        server_healthy,
        stop_process_group,
        warm_up,
    )

    need_postgres()
    parent = postgres_data_dir()
    pg_dir = parent / "pg"
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    log = home / "server.log"
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("PREFECT_API_URL", "GRADEBOOK_PREFECT_DB")
        },
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_HOST": "127.0.0.1",
        "PREFECT_SERVER_PORT": str(port),
        "PREFECT_UI_ENABLED": "false",
        "GRADEBOOK_PREFECT_PG_DIR": str(pg_dir),
        "GRADEBOOK_PREFECT_PG_PORT": str(free_port()),
    }
    api_url = f"http://127.0.0.1:{port}/api"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(INFRA / "start_server.sh")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise PrefectServerError(f"start_server.sh exited: {log.read_text()[-2000:]}")
            return server_healthy(api_url, timeout=1.0)

        wait_for(up, 600, "the cluster's Prefect server")
        warm_up(api_url)
        yield ClusterServer(api_url, log, pg_dir)
    finally:
        stop_process_group(proc)
        subprocess.run(
            ["bash", str(INFRA / "postgres.sh"), "stop", str(pg_dir)], capture_output=True
        )
        shutil.rmtree(parent, ignore_errors=True)


@contextmanager
def prefect_api_in_process(api_url: str) -> Iterator[None]:
    """This process's flows on another server for the block (environment and settings).

    Prefect keeps one event sender per process, bound to the server it first sent to, and the
    server records task runs from those events: the senders are drained and stopped on the way
    in and out, or the rest of the session's task runs would go to this block's server (gone
    by then), and a later test waiting for them would wait in vain (CI, test_run_names).
    """
    from prefect.settings import temporary_settings

    from flows.runtime.envvars import environ_set
    from flows.runtime.session import flush_to_server

    flush_to_server()
    try:
        with (
            environ_set({"PREFECT_API_URL": api_url}),
            temporary_settings(updates={"api.url": api_url}),
        ):
            yield
            flush_to_server()
    finally:
        flush_to_server()


def log_errors(*logs: Path) -> list[str]:
    """The lines of `logs` that hold a traceback or a locked database."""
    return [
        f"{log.name}: {line}"
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if any(e in line for e in LOG_ERRORS)
    ]
