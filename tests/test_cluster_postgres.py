"""The Prefect server on PostgreSQL (Debian's package) instead of SQLite, set up by infra/cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import cluster_kit
import pytest
from conftest import need

from flows.runtime.server import free_port

SCRIPT = cluster_kit.INFRA / "postgres.sh"


@pytest.mark.slow
def test_cluster_setup_on_a_prefect_server_backed_by_postgresql(monkeypatch):
    cluster_kit.need_postgres()
    data = cluster_kit.postgres_data_dir()
    port = free_port()
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", str(data / "pg"), str(port)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    need(
        started.returncode == 0, f"postgres.sh could not start PostgreSQL: {started.stderr[-500:]}"
    )
    url = started.stdout.strip().splitlines()[-1]
    try:
        assert url == f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect"
        # a second start (another start_server.sh) reuses the running one, on its port
        again = subprocess.run(
            ["bash", str(SCRIPT), "start", str(data / "pg"), str(free_port())],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert (again.returncode, again.stdout.strip()) == (0, url), again.stderr
        monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", url)
        from prefect.client.orchestration import get_client

        from flows.cluster.setup import setup_cluster
        from flows.runtime.server import local_server

        with tempfile.TemporaryDirectory() as home, local_server(home=Path(home), ui=False) as api:
            with cluster_kit.prefect_api_in_process(api):
                done = setup_cluster()
                with get_client(sync_client=True) as client:
                    pools = {p.name: p.type for p in client.read_work_pools()}
        assert done.deployments == ["cluster-generate/gpu", "cluster-score/cpu"]
        assert pools["gpu"] == pools["cpu"] == "process"
        # and they are rows in PostgreSQL, not in a SQLite file somewhere
        rows = subprocess.run(
            [
                *(["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []),
                "psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "-d",
                "prefect",
                "-tAc",
                "SELECT name FROM work_pool ORDER BY name",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert {"cpu", "gpu"} <= set(rows)
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(data / "pg")], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
