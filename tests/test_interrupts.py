"""Stopping commands: SIGINT/SIGTERM stop a sweep as a whole, Ctrl-C on `score` is one line and
loses or doubles nothing, and a killed command leaves no process or temp dir behind (the shared
Prefect server aside, which is meant to stay). Real `gradebook` processes, signalled as a
terminal, `timeout` or `kill -9` would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import textwrap
import time
from pathlib import Path

import pytest
from process_kit import (
    MARK,
    STOP_LINE,
    TESTS,
    Lines,
    cli_env,
    flow_run_states,
    gradebook,
    make_log,
    marked,
    score_counts,
    start_gradebook,
    wait_for,
    write_verifier,
)

from warehouse import Warehouse

SLOW_TASK = textwrap.dedent(
    '''
    """A task whose samples take a while (a solver pauses), with a trace line per sample."""
    import asyncio
    import os

    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate, solver


    @solver
    def pause(seconds: float, quick: int):
        async def solve(state, generate_fn):
            # the first `quick` samples do not pause; the others pause `seconds`, or
            # $SLOW_TASK_HOLD when set (a run that is slow this time, with the same config)
            hold = float(os.environ.get("SLOW_TASK_HOLD", seconds))
            await asyncio.sleep(0 if int(state.sample_id) <= quick else hold)
            with open(os.environ["SLOW_TASK_TRACE"], "a") as f:
                f.write("sample\\n")
            return state

        return solve


    @task
    def slow(n: int = 40, seconds: float = 1.0, quick: int = 0):
        samples = [
            Sample(input=f"What is {i} + {2 * i}?", target=str(3 * i), id=i)
            for i in range(1, n + 1)
        ]
        solver = [pause(seconds, quick), generate()]
        return Task(dataset=MemoryDataset(samples, name="slow"), solver=solver)
    '''
)


def _sweep_config(tmp: Path, slow_args: str = "{}") -> Path:
    (tmp / "slow_task.py").write_text(SLOW_TASK)
    write_verifier(tmp, "quick_v")
    cfg = tmp / "stoppable.toml"
    cfg.write_text(
        textwrap.dedent(
            f"""
            name = "stoppable"
            log_dir = "logs"
            warehouse = "w.duckdb"
            verifier_modules = ["quick_v"]
            [[models]]
            name = "v1"
            model = "mockllm/model"
            args_from = "cluster_kit:mock_args"
            [[tasks]]
            task = "{tmp / "slow_task.py"}@slow"
            args = {slow_args}
            verifiers = ["quick_v"]
            [[tasks]]
            task = "{TESTS / "flows_kit.py"}@arith"
            verifiers = ["quick_v"]
            [gates]
            min_accuracy = 0.0
            """
        )
    )
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_whole_sweep_and_keeps_what_was_generated(prefect_api, tmp_path, sig):
    cfg = _sweep_config(tmp_path)
    trace = tmp_path / "trace"
    env = cli_env(tmp_path, api_url=prefect_api, SLOW_TASK_TRACE=str(trace))
    proc = start_gradebook("sweep", str(cfg), env=env, cwd=tmp_path)
    try:
        wait_for(
            lambda: trace.exists() and len(trace.read_text().splitlines()) >= 3,
            180,
            "the first samples to be generated",
        )
        sent = time.monotonic()
        # SIGTERM as `timeout`/systemd send it (to the process); SIGINT as a terminal (the group)
        if sig == signal.SIGTERM:
            proc.send_signal(sig)
        else:
            os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    assert took < 60, f"the sweep took {took:.0f}s to stop"
    assert "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"gradebook: {signal.Signals(sig).name}: stopping (again to exit at once)"
    ]
    # the summary has every pair with its state
    rows = {ln.split("│")[2].strip(): ln for ln in out.splitlines() if ln.count("│") > 5}
    assert set(rows) == {"slow", "arith"}, out
    assert "cancelled" in rows["slow"] and "not scored" in rows["slow"]
    assert "not started" in rows["arith"]
    assert f"stopped by {signal.Signals(sig).name}" in out
    # the cancelled log is in the warehouse, with the samples it got: a sample whose trace line
    # was written may still have been generating when the signal came (cancelled, not stored)
    with Warehouse(tmp_path / "w.duckdb").read() as con:
        ((status, n),) = con.execute("SELECT status, n_samples FROM runs").fetchall()
    assert status == "cancelled" and 1 <= n <= len(trace.read_text().splitlines())
    assert flow_run_states(prefect_api, "sweep", tmp_path) == ["CANCELLED"]
    assert marked(env[MARK]) == []


@pytest.mark.slow
def test_samples_cancelled_in_flight_are_not_errors_and_a_rerun_generates_them(
    prefect_api, tmp_path
):
    from inspect_ai.log import read_eval_log_sample_summaries

    # the first 3 samples are quick; the others are still being generated when the sweep is
    # stopped (they pause 120 s this time)
    cfg = _sweep_config(tmp_path, "{quick = 3}")
    trace = tmp_path / "trace"
    env = cli_env(tmp_path, api_url=prefect_api, SLOW_TASK_TRACE=str(trace))
    db = tmp_path / "w.duckdb"
    proc = start_gradebook("sweep", str(cfg), env={**env, "SLOW_TASK_HOLD": "120"}, cwd=tmp_path)
    try:
        wait_for(
            lambda: trace.exists() and len(trace.read_text().splitlines()) >= 3,
            180,
            "the first samples to be generated",
        )
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    with Warehouse(db).read() as con:
        ((run_id, log, n_errors),) = con.execute(
            "SELECT run_id, log_path, n_errors FROM runs WHERE status = 'cancelled'"
        ).fetchall()
        stored = {sid for (sid,) in con.execute("SELECT sample_id FROM samples").fetchall()}
    # the log holds the samples that were in flight, with the cancellation as their error
    cancelled = {
        str(s.id)
        for s in read_eval_log_sample_summaries(log)
        if s.error is not None and s.error.startswith("CancelledError(")
    }
    assert cancelled, "some samples were in flight when the sweep was stopped"
    # not generated: not stored, so neither errors nor samples of the run
    assert n_errors == 0 and not cancelled & stored and stored
    row = next(ln for ln in out.splitlines() if "│ slow " in ln)
    assert [c.strip() for c in row.split("│")][5:7] == [str(len(stored)), "0"], out  # n, err

    scored = gradebook("score", log, "--db", str(db), env=env, preload=("quick_v",))
    assert scored.returncode == 0, scored.stderr
    with Warehouse(db).read() as con:
        n_samples, n_error = con.execute(
            "SELECT n_samples, n_error FROM run_metrics WHERE run_id = ?", [run_id]
        ).fetchone()
    assert (n_samples, n_error) == (len(stored), 0)
    gated = gradebook(
        "gate", "--run", run_id, "--db", str(db), "--json", "--dry-run", env=env,
        preload=("quick_v",),
    )  # fmt: skip
    (result,) = json.loads(gated.stdout)["runs"]
    rules = {r["rule"]: r for r in result["results"]}
    assert rules["max_error_rate"]["passed"] and rules["max_error_rate"]["value"] == 0
    # what the gate holds against the run is that it was cut short: coverage
    assert not rules["min_coverage"]["passed"]
    assert rules["min_coverage"]["detail"].startswith(f"{len(stored)} present / 40 expected")

    again = gradebook("sweep", str(cfg), env=env, cwd=tmp_path)

    assert again.returncode == 0, again.stdout + again.stderr
    with Warehouse(db).read() as con:
        regenerated = {
            sid
            for (sid,) in con.execute(
                "SELECT s.sample_id FROM samples s JOIN runs r USING (run_id) "
                "WHERE r.task = 'slow' AND r.status = 'success' AND s.error IS NULL"
            ).fetchall()
        }
    assert cancelled <= regenerated and len(regenerated) == 40


@pytest.mark.slow
@pytest.mark.serial
def test_a_second_ctrl_c_exits_at_once(prefect_api, tmp_path):
    from warehouse_logs import reader_holding

    cfg = _sweep_config(tmp_path)
    trace = tmp_path / "trace"
    env = cli_env(tmp_path, api_url=prefect_api, SLOW_TASK_TRACE=str(trace))
    db = tmp_path / "w.duckdb"
    with Warehouse(db).write():
        pass  # the warehouse exists, so a reader can hold it
    proc = start_gradebook("sweep", str(cfg), env=env, cwd=tmp_path)
    err = Lines(proc.stderr)
    try:
        wait_for(lambda: trace.exists(), 180, "the first sample")
        # the first Ctrl-C's clean stop must wait for the warehouse, which a reader holds
        with reader_holding(db):
            os.killpg(proc.pid, signal.SIGINT)
            wait_for(lambda: any("stopping" in ln for ln in err.lines), 60, "the first stop")
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGINT)
            sent = time.monotonic()
            proc.wait(timeout=30)
            took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert took < 3, f"{took:.1f}s from the second Ctrl-C to exit"
    assert "gradebook: SIGINT again: exiting now" in err.text()
    assert "Traceback" not in err.text()
    wait_for(lambda: marked(env[MARK]) == [], 10, "the command's children to exit")


@pytest.fixture(scope="module")
def slow_log(tmp_path_factory) -> Path:
    """A 1,000-sample log recording slow_v: generated once (~12 ms a sample), copied per test."""
    return make_log(tmp_path_factory.mktemp("slow-log"), 1000, verifiers=["slow_v"])


@pytest.fixture
def slow_stage(tmp_path, slow_log):
    """A 1,000-sample log (a copy of its own) whose verifier (slow_v) takes 10 s a chunk, and
    its db: the chunks in flight when the first scores are written take longer than a stop
    waits for them, so a stop then leaves samples to grade."""
    write_verifier(tmp_path, "slow_v", delay_s=0.04)
    (tmp_path / "logs").mkdir()
    log = Path(shutil.copy(slow_log, tmp_path / "logs" / slow_log.name))
    return log, tmp_path / "w.duckdb"


@pytest.mark.slow
def test_ctrl_c_on_score_is_one_line_and_a_rerun_scores_every_sample_once(
    prefect_api, tmp_path, slow_stage
):
    """Up to 60 s: a stage of 10 s chunks, stopped after its first write, then graded to the end
    by the re-run; the module's first user of slow_stage also generates its 1,000-sample log."""
    log, db = slow_stage
    env = cli_env(tmp_path, api_url=prefect_api)
    args = ("score", str(log), "--db", str(db), "--workers", "2")
    proc = start_gradebook(*args, env=env, preload=("slow_v",))
    try:
        wait_for(lambda: score_counts(db, "slow_v")[0] > 0, 180, "the first scores to be written")
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    stop = re.fullmatch(STOP_LINE.format(sig="SIGINT", again="Ctrl-C again"), line)
    assert stop, line
    wait_for(lambda: marked(env[MARK]) == [], 10, "the grading workers and zygotes to exit")
    written, _ = score_counts(db, "slow_v")
    assert 0 < written < 1000, "interrupted mid-stage"
    assert written == int(stop["all"].replace(",", ""))  # what it said it kept

    again = gradebook(*args, env=env, preload=("slow_v",))

    assert again.returncode == 0, again.stderr
    assert score_counts(db, "slow_v") == (1000, 1000)  # every sample once: none lost, none doubled


@pytest.fixture(scope="module")
def local_home(tmp_path_factory):
    """A Prefect home for commands run without PREFECT_API_URL; its server is stopped at the
    end."""
    home = tmp_path_factory.mktemp("kill-home")
    try:
        yield home
    finally:
        from flows.runtime.background_server import stop_server

        stop_server(home)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_score_leaves_no_process_or_temp_dir_and_the_next_one_settles_its_run(
    local_home, tmp_path, slow_stage, sig
):
    """Up to 70 s: the first case starts the module's local server; each runs a stage of 10 s
    chunks until its first write, kills it, then grades it to the end again."""
    log, db = slow_stage
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = cli_env(
        tmp_path,
        GRADEBOOK_PREFECT_HOME=str(local_home),
        PREFECT_HOME=str(local_home),  # where any Prefect server the command starts lives
        GRADEBOOK_PREFECT_PORT="0",
        TMPDIR=str(tmp),
    )
    args = ("score", str(log), "--db", str(db), "--workers", "2")
    proc = start_gradebook(*args, env=env, preload=("slow_v",))
    server_pid = None
    try:
        wait_for(lambda: score_counts(db, "slow_v")[0] > 0, 240, "the first scores to be written")
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 143)
        # the shared server stays, by design (its pid is in the home's record); nothing else
        record = local_home / "gradebook-server.json"
        server_pid = json.loads(record.read_text())["pid"] if record.exists() else None
        wait_for(
            lambda: set(marked(env[MARK])) <= {server_pid},
            10,
            "every process the command started (workers, zygotes, servers) to exit",
        )
        assert server_pid is not None
        assert [p.name for p in tmp.iterdir()] == []

        again = gradebook(*args, env=env, preload=("slow_v",))

        assert again.returncode == 0, again.stderr
        assert score_counts(db, "slow_v") == (1000, 1000)
        # the killed run is not left Running: SIGTERM stops it in order (Cancelled); after a
        # SIGKILL the next command (the re-run) finds its process gone and marks it Crashed
        api_url = f"http://127.0.0.1:{json.loads(record.read_text())['port']}/api"
        rerun, killed = _score_runs(api_url)
        ended = "CRASHED" if sig == signal.SIGKILL else "CANCELLED"
        assert (rerun.state_type.value, killed.state_type.value) == ("COMPLETED", ended)
        if sig == signal.SIGKILL:
            assert f"its process ({proc.pid} on" in killed.state.message
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in marked(env[MARK]):  # whatever a failing command left, but the shared server
            if pid != server_pid:
                os.kill(pid, signal.SIGKILL)


def _score_runs(api_url: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"api.url": api_url}), get_client(sync_client=True) as c:
        return c.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["score"])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=2,
        )
