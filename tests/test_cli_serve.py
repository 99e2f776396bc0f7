"""`gradebook serve` registers the deployments, runs the watcher, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_serve_registers_deployments_and_exits_cleanly_on_ctrl_c(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    cfg = tmp_path / "nightly.toml"
    cfg.write_text(
        'name = "nightly-test"\nschedule = "0 3 * * *"\nwarehouse = "gb.duckdb"\n'
        '[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    proc = subprocess.Popen(
        # the config named relative to where serve runs: scheduled runs may run elsewhere
        [sys.executable, "-m", "flows.cli", "serve", cfg.name, "--watch-every", "5"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        names: set[str] = set()
        deadline = time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline and proc.poll() is None:
                deps = client.read_deployments()
                names = {d.name for d in deps}
                sweep = next((d for d in deps if d.name == "nightly-test"), None)
                if sweep and "watch-gb" in names:
                    break
                time.sleep(1)
            assert {"nightly-test", "watch-gb"} <= names, proc.stdout and proc.stdout.read()
            assert sweep.schedules[0].schedule.cron == "0 3 * * *"
            assert sweep.parameters["config"] == str(cfg.resolve())
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "gradebook serve: stopped" in out
    assert "Traceback" not in out


def test_serve_checks_every_configs_tasks_before_it_touches_prefect(tmp_path, monkeypatch):
    # Nothing answers here: had serve reached Prefect, the error would be about this URL.
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    good = tmp_path / "good.toml"
    good.write_text(
        'name = "good"\nschedule = "0 3 * * *"\n[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
    )
    bad = tmp_path / "bad.toml"
    spec = f"{ROOT / 'tasks' / 'math.py'}@math_verifed"
    bad.write_text(
        'name = "bad"\nschedule = "0 4 * * *"\n[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
        f'[[tasks]]\ntask = "{spec}"\nverifiers = ["math"]\n'
    )
    result = CliRunner().invoke(app, ["serve", str(good), str(bad)])

    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {bad}: tasks[1] ({spec}): ")
    assert "math.py has no @task named 'math_verifed'" in line
    assert "PREFECT_API_URL" not in line
