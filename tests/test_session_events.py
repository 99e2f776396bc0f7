"""One process, two Prefect servers in turn (the Python API in a notebook, a test session):
the second block's task runs reach the second server, and the process exits although the
first server is gone.

Prefect keeps one event sender per process, bound to the API of the first block that sent; task
runs are recorded by the server from those events. Before each block stopped it, the second
block's events went to the first, dead, server: its task runs were never recorded, and the
process hung at exit while Prefect retried every event (a CI run of the suite was killed at
its time limit that way).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest
from process_kit import ROOT, cli_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from prefect import flow, task
    from flows.runtime.server import local_server
    from flows.runtime.session import prefect_session

    @task(task_run_name="step {name}")
    def step(name: str) -> str:
        return name

    @flow
    def two_steps(name: str) -> None:
        step(name)
        step(name + "-again")

    with local_server(home=None, ui=False, startup_timeout=600) as first:
        os.environ["PREFECT_API_URL"] = first
        with prefect_session():
            two_steps("first")
    # the first server is gone; the next block uses the session's
    os.environ["PREFECT_API_URL"] = sys.argv[1]
    with prefect_session():
        two_steps(sys.argv[2])
    print("blocks done", flush=True)
    """
)


def _task_run_names(api_url: str, prefix: str) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=prefix))
        )
    return {r.name for r in runs}


def test_a_second_server_gets_its_task_runs_and_the_process_exits(prefect_api, tmp_path):
    from process_kit import wait_for

    name = f"second-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, prefect_api, name],
        cwd=ROOT,
        env=cli_env(tmp_path, PREFECT_HOME=str(tmp_path / "client-home")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wanted = {f"step {name}", f"step {name}-again"}
        wait_for(
            lambda: wanted <= _task_run_names(prefect_api, f"step {name}"),
            timeout=420,  # the first server's start, on a loaded machine (under the 600 s test timeout)
            what="the second block's task runs, recorded by the server it ran against",
        )
        # then it exits: the old code went on retrying the dead server's events at exit
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "blocks done" in out
