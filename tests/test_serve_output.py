"""`gradebook serve` says where the UI is and keeps Prefect's INFO lines out of the terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_serve_prints_the_ui_url_and_no_info_lines_while_the_watcher_runs(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    cfg = tmp_path / "quiet.toml"
    cfg.write_text(
        'name = "quiet-test"\nwarehouse = "quiet.duckdb"\n'
        '[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_LOGGING_HANDLERS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", cfg.name, "--watch-every", "5"],
        cwd=tmp_path,
        env={**env, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        done = []
        deadline = time.monotonic() + 240
        runs = FlowRunFilter(state={"type": FlowRunFilterStateType(any_=[StateType.COMPLETED])})
        watcher = DeploymentFilter(name=DeploymentFilterName(any_=["watch-quiet"]))
        with get_client(sync_client=True) as client:
            # two watcher runs finished in their own processes, which inherit serve's console
            while len(done) < 2 and time.monotonic() < deadline and proc.poll() is None:
                done = client.read_flow_runs(flow_run_filter=runs, deployment_filter=watcher)
                time.sleep(1)
        assert len(done) >= 2, "".join(lines)
        seen = list(lines)  # what the terminal showed while serving, before Ctrl-C
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    ui = prefect_api.removesuffix("/api")
    assert any(f"Prefect UI {ui} " in ln for ln in seen), seen
    assert not [ln for ln in seen if "| INFO" in ln], seen
