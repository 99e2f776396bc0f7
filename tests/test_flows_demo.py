"""`gradebook demo` end to end: two model versions that differ, a warehouse, gates, next steps.

The demo runs once per module with Docker "down" (the Engine socket does not answer), the case
a first-time user without `make services` meets; the second test then follows the commands the
demo printed, with Docker up, as that user would.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.demo import DEMO_MODELS, HUMANEVAL_LIMIT, run_demo
from flows.runtime.console import console
from warehouse import Warehouse
from warehouse.commands import program

N_CODE = len(DEMO_MODELS) * HUMANEVAL_LIMIT  # code samples the demo generates


@pytest.fixture(scope="module")
def demo_without_docker(prefect_api, tmp_path_factory) -> tuple[Path, int, str]:
    """(demo dir, exit code, printed output) of one demo run while Docker is unreachable."""
    import scorers.sandbox.pool as sandbox

    directory = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp:
        # the demo points Inspect at its own server only while it runs: the caller's settings survive
        mp.setenv("LOCAL_API_KEY", "caller-key")
        mp.delenv("LOCAL_BASE_URL", raising=False)
        mp.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        mp.setattr(sandbox, "_default_pool", None)
        # the summary table laid out as on a wide terminal, whatever COLUMNS says
        mp.setattr(console, "width", 160)
        with console.capture() as captured:
            code = run_demo(directory)
        assert os.environ["LOCAL_API_KEY"] == "caller-key" and "LOCAL_BASE_URL" not in os.environ
    return directory, code, captured.get()


def _q(directory: Path, sql: str) -> list[tuple[Any, ...]]:
    with Warehouse(directory / "demo.duckdb").read() as con:
        return con.execute(sql).fetchall()


def _printed_commands(out: str) -> list[list[str]]:
    # the program as printed: `gradebook`, or its path when that is not on the PATH
    prefix = f"  {program()} "
    return [shlex.split(line)[1:] for line in out.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_demo_without_docker_counts_each_outage_sample_once_and_says_how_to_grade_it(
    demo_without_docker,
):
    directory, code, out = demo_without_docker
    assert code == 0
    acc = dict(_q(directory, "SELECT model, accuracy FROM run_metrics WHERE scorer = 'math'"))
    assert len(acc) == len(DEMO_MODELS)
    assert len(set(acc.values())) == 2  # the two versions answer differently

    # what the user sees counts each sample once (its latest attempt) ...
    assert _q(
        directory,
        "SELECT n_samples, n_scored, n_unscored FROM run_metrics WHERE scorer = 'unit_tests'",
    ) == [(HUMANEVAL_LIMIT, 0, HUMANEVAL_LIMIT)] * len(DEMO_MODELS)
    assert _q(
        directory,
        "SELECT status, reason, count(*) FROM current_scores WHERE scorer = 'unit_tests' "
        "GROUP BY ALL",
    ) == [("unscored", "sandbox_unavailable", N_CODE)]
    assert out.count(f"{HUMANEVAL_LIMIT} (sandbox_unavailable {HUMANEVAL_LIMIT})") == len(
        DEMO_MODELS
    )
    assert f"{N_CODE} samples unscored (sandbox_unavailable {N_CODE})" in out
    # ... while the history keeps both attempts of every sample: the first pass and the sweep's
    # own retry, both unscored because Docker stayed down
    assert (
        _q(
            directory,
            "SELECT list(attempt ORDER BY attempt), list(DISTINCT reason) "
            "FROM scores WHERE scorer = 'unit_tests' GROUP BY run_id, sample_id",
        )
        == [([1, 2], ["sandbox_unavailable"])] * N_CODE
    )

    gates = _q(directory, "SELECT task, verdict, results FROM latest_gates ORDER BY task, model")
    assert [(task, verdict) for task, verdict, _ in gates] == [
        ("humaneval", "fail"),
        ("humaneval", "fail"),
        ("math_verified", "pass"),
        ("math_verified", "pass"),
    ]
    for _, _, results in gates[:2]:
        failed = {r["rule"]: r["detail"] for r in json.loads(results) if not r["passed"]}
        assert (
            failed["max_unscored_rate"] == f"{HUMANEVAL_LIMIT} unscored / {HUMANEVAL_LIMIT} samples"
        )
    assert f"gate humaneval / openai-api/local/demo-v1: {HUMANEVAL_LIMIT} unscored" in out

    db, toml = str(directory / "demo.duckdb"), str(directory / "demo.toml")
    commands = _printed_commands(out)
    assert ["rescore", "--db", db, "--retry-unscored", "--scorer", "unit_tests"] in commands
    assert ["gate", "--config", toml] in commands
    assert "make services" in out
    assert ["rescore", "--db", db, "--dry-run"] in commands
    assert ["sql", "--db", db, "--format", "line", "SELECT * FROM grade_flips"] in commands
    assert Path(toml).read_text().startswith('name = "demo"')


@pytest.mark.docker
@pytest.mark.slow
def test_the_printed_commands_grade_the_outage_samples_once_docker_is_up(
    demo_without_docker, docker_sandbox, prefect_api
):
    directory, _, out = demo_without_docker
    commands = _printed_commands(out)
    retry = next(c for c in commands if c[0] == "rescore" and "--retry-unscored" in c)
    gate = next(c for c in commands if c[0] == "gate")
    runner = CliRunner()

    result = runner.invoke(app, retry)
    assert result.exit_code == 0, result.output
    # every code sample graded from its saved transcript; the unscored attempts stay in history
    assert _q(
        directory,
        "SELECT attempt, status, count(*) FROM scores WHERE scorer = 'unit_tests' "
        "GROUP BY ALL ORDER BY ALL",
    ) == [(1, "unscored", N_CODE), (2, "unscored", N_CODE), (3, "scored", N_CODE)]
    assert _q(
        directory,
        "SELECT n_scored, n_unscored FROM run_metrics WHERE scorer = 'unit_tests'",
    ) == [(HUMANEVAL_LIMIT, 0)] * len(DEMO_MODELS)

    result = runner.invoke(app, gate)
    assert result.exit_code == 0, result.output
    assert _q(directory, "SELECT task, verdict FROM latest_gates ORDER BY ALL") == [
        ("humaneval", "pass"),
        ("humaneval", "pass"),
        ("math_verified", "pass"),
        ("math_verified", "pass"),
    ]


@pytest.mark.slow
@pytest.mark.docker
def test_the_agentic_demo_rescores_every_workspace_with_no_model_call(
    docker_sandbox, prefect_api, tmp_path, monkeypatch
):
    """`gradebook demo --agentic`: sweep -> scores -> the scorer's test command is widened ->
    rescore restores every workspace and runs the tests again, 0 model calls -> flips."""
    from flows.cli.demo_agentic import SCORER, run_agentic_demo
    from tasks import agentic

    monkeypatch.setattr(console, "width", 160)
    with console.capture() as captured:
        code = run_agentic_demo(tmp_path, tickets=6)
    out = captured.get()
    assert code == 0, out
    # the scripted agent gives up on ticket 5; tickets 3 and 6 pass the narrow tests only
    rows = "SELECT sample_id::INTEGER, value FROM scores WHERE scorer = ? AND fingerprint = ? ORDER BY 1"
    with Warehouse(tmp_path / "demo.duckdb").read() as con:
        first, last = [
            r[0]
            for r in con.execute(
                "SELECT fingerprint FROM scores WHERE scorer = ? GROUP BY 1 ORDER BY min(scored_at)",
                [SCORER],
            ).fetchall()
        ]
        before = con.execute(rows, [SCORER, first]).fetchall()
        after = con.execute(rows, [SCORER, last]).fetchall()
        flips = con.execute(
            "SELECT sample_id::INTEGER, old_value, new_value FROM grade_flips ORDER BY 1"
        ).fetchall()
        restored = con.execute(
            "SELECT count(*) FROM scores WHERE fingerprint = ? AND "
            "json_extract_string(metadata, '$.sandbox.restored.default.digest') IS NOT NULL",
            [last],
        ).fetchone()
    assert before == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 0.0), (6, 1.0)]
    assert after == [(1, 1.0), (2, 1.0), (3, 0.0), (4, 1.0), (5, 0.0), (6, 0.0)]
    assert flips == [(3, 1.0, 0.0), (6, 1.0, 0.0)]
    assert restored == (6,)  # every sample graded again in its restored workspace
    assert "model calls: 0" in out
    # the sweep's own agent calls happened in this process: the rescore made none
    assert agentic.calls[0] > 0
