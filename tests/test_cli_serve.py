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


# -- a watcher run in flight -------------------------------------------------------------------


def _watch_setup(tmp_path: Path, api_url: str, n: int, delay_s: float) -> tuple[Path, Path, str]:
    """A warehouse whose `n` samples slow_w graded, then slow_w edited (a new fingerprint, and
    `delay_s` per sample): the watcher has all of them to re-score."""
    import uuid

    from process_kit import cli_env, gradebook, make_log, write_verifier

    write_verifier(tmp_path, "slow_w")
    log = make_log(tmp_path / "logs", n, verifiers=["slow_w"])
    name = f"gb-{uuid.uuid4().hex[:6]}"
    db = tmp_path / f"{name}.duckdb"
    env = cli_env(tmp_path, api_url=api_url)
    first = gradebook("score", str(log), "--db", str(db), env=env, preload=("slow_w",))
    assert first.returncode == 0, first.stderr
    write_verifier(tmp_path, "slow_w", delay_s=delay_s)
    cfg = tmp_path / "watched.toml"
    cfg.write_text(
        f'name = "watched"\nwarehouse = "{db.name}"\nverifier_modules = ["slow_w"]\n'
        '[[models]]\nmodel = "mockllm/model"\n'
        f'[[tasks]]\ntask = "{ROOT / "tests" / "flows_kit.py"}@arith"\nverifiers = ["slow_w"]\n'
    )
    return cfg, db, f"watch-{name}"


def _watcher_runs(deployment: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
        )


def _rows(db: Path) -> int:
    from warehouse import Warehouse, WarehouseLocked

    try:
        with Warehouse(db, lock_timeout_s=0.2).read() as con:
            return con.execute("SELECT count(*) FROM scores").fetchone()[0]
    except WarehouseLocked:
        return -1


@pytest.mark.slow
@pytest.mark.serial
def test_serve_stops_within_10s_of_ctrl_c_under_load_with_a_watcher_run_in_flight(
    prefect_api, tmp_path
):
    """About 60-70 s: a warehouse graded once, serve started, and its watcher's re-score under
    way (the first 5 s interval) before the Ctrl-C; runs alone (`serial`): it bounds the exit."""
    from process_kit import MARK, busy_loops, cli_env, marked, start_gradebook, wait_for

    n = 400
    cfg, db, deployment = _watch_setup(tmp_path, prefect_api, n=n, delay_s=0.1)
    env = cli_env(tmp_path, api_url=prefect_api)
    proc = start_gradebook("serve", str(cfg), "--watch-every", "5", env=env, cwd=tmp_path)
    loops = []
    try:
        wait_for(lambda: _rows(db) > n, 300, "the watcher's re-score to be writing scores")
        (run,) = [r for r in _watcher_runs(deployment) if r.state_type.value == "RUNNING"]
        loops = busy_loops(2)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole group
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        for loop in loops:
            loop.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert took <= 10, f"serve took {took:.1f}s to exit"
    assert proc.returncode == 0, err
    assert "gradebook serve: stopped" in out
    assert "Traceback" not in err, err
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 2, err
    assert _rows(db) < 2 * n  # it was stopped mid-way, not allowed to finish
    (after,) = [r for r in _watcher_runs(deployment) if r.id == run.id]
    assert after.state_type.value == "CANCELLED", after.state
    # no runner, flow run, grading worker or zygote is left (each inherited MARK)
    assert marked(env[MARK]) == []


@pytest.mark.slow
def test_watcher_runs_of_one_warehouse_never_overlap(prefect_api, tmp_path):
    """Over 60 s: the re-score must last ~15 s so that 5 s intervals come due while it runs, and
    one of those runs must then be seen cancelled."""
    from process_kit import cli_env, start_gradebook, wait_for

    n = 300
    # a re-score of ~15 s: several 5 s intervals come due while it runs
    cfg, db, deployment = _watch_setup(tmp_path, prefect_api, n=n, delay_s=0.1)
    env = cli_env(tmp_path, api_url=prefect_api)
    proc = start_gradebook("serve", str(cfg), "--watch-every", "5", env=env, cwd=tmp_path)
    try:
        wait_for(lambda: _rows(db) > n, 300, "the re-score to start")
        wait_for(lambda: _rows(db) == 2 * n, 300, "the re-score to finish", every=1)
        wait_for(
            lambda: any(
                "concurrency limit" in (r.state.message or "") for r in _watcher_runs(deployment)
            ),
            120,
            "a run that came due meanwhile to be cancelled",
        )
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    runs = _watcher_runs(deployment)
    ran = sorted((r for r in runs if r.run_count), key=lambda r: r.start_time)
    assert ran, [r.state for r in runs]
    for a, b in zip(ran, ran[1:], strict=False):
        assert a.end_time is not None and a.end_time <= b.start_time, (a.name, b.name)
    assert not [r for r in runs if r.state_type.value in ("FAILED", "CRASHED")]
    # every sample re-scored exactly once under the new fingerprint
    from warehouse import Warehouse

    with Warehouse(db).read() as con:
        per_print = con.execute(
            "SELECT count(*), count(DISTINCT (run_id, sample_id, epoch)) FROM scores "
            "GROUP BY fingerprint ORDER BY min(scored_at)"
        ).fetchall()
    assert per_print == [(n, n), (n, n)]


@pytest.mark.slow
def test_serve_killed_with_sigkill_leaves_no_process_and_no_run_running(prefect_api, tmp_path):
    """About 60 s: a warehouse graded once, serve started, and its watcher's re-score under way
    (the first 5 s interval) before the kill."""
    # kill -9 of serve itself: its runner gets SIGTERM from the kernel (a parent-death
    # signal) and stops as on Ctrl-C; the flow run in flight dies with the runner
    from process_kit import MARK, cli_env, marked, start_gradebook, wait_for

    n = 300
    cfg, db, deployment = _watch_setup(tmp_path, prefect_api, n=n, delay_s=0.1)
    env = cli_env(tmp_path, api_url=prefect_api)
    proc = start_gradebook("serve", str(cfg), "--watch-every", "5", env=env, cwd=tmp_path)
    try:
        wait_for(lambda: _rows(db) > n, 300, "the watcher's re-score to be writing scores")
        (run,) = [r for r in _watcher_runs(deployment) if r.state_type.value == "RUNNING"]
        proc.kill()
        proc.communicate(timeout=30)
        wait_for(lambda: marked(env[MARK]) == [], 30, "every process serve started to exit")
    finally:
        for pid in marked(env[MARK]):
            os.kill(pid, signal.SIGKILL)

    def settled() -> str | None:
        (now,) = [r for r in _watcher_runs(deployment) if r.id == run.id]
        state = now.state_type.value
        return None if state in ("RUNNING", "PENDING", "CANCELLING") else state

    state = wait_for(settled, 30, "the killed run to be settled")
    assert state in ("CANCELLED", "CRASHED")
