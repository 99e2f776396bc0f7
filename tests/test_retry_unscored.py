"""Samples left unscored for an infrastructure reason are graded again from the saved transcripts:
`gradebook score --retry-unscored`, `gradebook rescore --retry-unscored`, and the sweep's own retry
of infrastructure failures. Real Inspect logs, Prefect flow runs, DuckDB files and Docker."""

from __future__ import annotations

import importlib
import textwrap
import uuid
from pathlib import Path

import flows_kit
import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from typer.testing import CliRunner

from flows.cli import app
from flows.rescore import WATCH_MAX_ATTEMPT, plan_rescore, watch_verifiers
from flows.sweep import sweep_flow
from sweeps.config import parse_config
from tasks.code import humaneval, humaneval_problems
from warehouse import Warehouse

# A verifier whose outside dependency fails for a while, the way Docker or a grading service
# does: the first DOWN_CALLS calls find the "sandbox" unreachable, and while the BROKEN file
# exists every call raises. Neither is visible in its fingerprint, like a real outage.
FLAKY_SOURCE = textwrap.dedent(
    """
    from pathlib import Path

    from scorers.grade import scored, unscored
    from scorers.registry import Verifier, register

    CALLS = Path({calls!r})
    BROKEN = Path({broken!r})
    DOWN_CALLS = {down_calls}


    def grade(view):
        with CALLS.open("a") as f:
            f.write(".")
        if len(CALLS.read_text()) <= DOWN_CALLS:
            return unscored("sandbox_unavailable", "engine not reachable (test outage)")
        if BROKEN.exists():
            raise RuntimeError("grading service offline")
        ok = view.completion.split()[-1] == view.targets[0]
        return scored(1.0 if ok else 0.0, answer=None, explanation="test", reason="checked")


    register(Verifier("{name}", grade, module="{name}", params={{}}, label="test: flaky"))
    """
)


def _flaky(tmp_path: Path, monkeypatch, *, down_calls: int = 0, broken: bool = False) -> str:
    name = f"flaky_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / f"{name}.broken"
    if broken:
        marker.touch()
    (tmp_path / f"{name}.py").write_text(
        FLAKY_SOURCE.format(
            calls=str(tmp_path / f"{name}.calls"),
            broken=str(marker),
            down_calls=down_calls,
            name=name,
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    return name


def _sweep(tmp_path: Path, verifier: str):
    cfg = parse_config(
        {
            "name": "t",
            "log_dir": "logs",
            "warehouse": "gb.duckdb",
            "models": [
                {
                    "name": "v1",
                    "model": "mockllm/model",
                    "args": {"custom_outputs": flows_kit.mock_outputs({2})},
                }
            ],
            "tasks": [{"task": flows_kit.TASK_SPEC, "args": {"n": 6}, "verifiers": [verifier]}],
            "gates": {"max_regression": None},
        },
        source=tmp_path / "sweep.toml",
    )
    return cfg, sweep_flow(cfg, workers=1, progress=False, gate=False)


def _q(db, sql: str, params=()) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute(sql, list(params)).fetchall()


@pytest.mark.slow
def test_the_sweep_retries_a_sandbox_outage_once_by_itself(prefect_api, tmp_path, monkeypatch):
    name = _flaky(tmp_path, monkeypatch, down_calls=6)  # the whole first pass finds it down
    cfg, result = _sweep(tmp_path, name)
    (row,) = result.rows
    assert (row.scored, row.unscored, row.unscored_reasons) == (6, 0, {})
    assert row.accuracy == pytest.approx(5 / 6)
    assert [s.retried for s in result.scores] == [0, 6]
    history = _q(
        cfg.warehouse, "SELECT attempt, status, count(*) FROM scores GROUP BY ALL ORDER BY 1"
    )
    assert history == [(1, "unscored", 6), (2, "scored", 6)]


@pytest.mark.slow
def test_rescore_retry_unscored_grades_verifier_errors_again_once(
    prefect_api, tmp_path, monkeypatch
):
    name = _flaky(tmp_path, monkeypatch, broken=True)
    cfg, result = _sweep(tmp_path, name)
    db = str(cfg.warehouse)
    # a verifier exception is not retried by the sweep: it would most likely raise again
    assert result.rows[0].unscored_reasons == {"verifier_error": 6}
    assert _q(db, "SELECT count(*) FROM scores") == [(6,)]
    assert not any(p.changed for p in plan_rescore(db, [name]))

    (tmp_path / f"{name}.broken").unlink()  # the outage is over
    (plan,) = plan_rescore(db, [name], retry_unscored=True)
    assert (plan.pending, plan.retries) == (6, 6)
    runner = CliRunner()
    out = runner.invoke(app, ["rescore", "--db", db, "--scorer", name, "--retry-unscored"])
    assert out.exit_code == 0, out.output
    metrics = _q(db, "SELECT n_scored, n_unscored, accuracy FROM run_metrics")
    assert metrics == [(6, 0, pytest.approx(5 / 6))]
    assert _q(db, "SELECT attempt, status, reason FROM scores GROUP BY ALL ORDER BY ALL") == [
        (1, "unscored", "verifier_error"),
        (2, "scored", "checked"),
    ]
    assert _q(db, "SELECT count(*) FROM grade_flips") == [(0,)]

    # nothing left to retry: a second retry writes nothing
    again = runner.invoke(app, ["rescore", "--db", db, "--scorer", name, "--retry-unscored"])
    assert again.exit_code == 0, again.output
    assert "nothing to re-score" in again.output
    assert _q(db, "SELECT count(*) FROM scores") == [(12,)]


def _humaneval_log(log_dir: Path) -> str:
    """A generate-only HumanEval log: a right solution, a wrong one, and no code at all."""
    p0, p1, _ = humaneval_problems()[:3]
    answers = [
        f"```python\n{p0['prompt']}{p0['canonical_solution']}```",
        f"```python\n{p1['prompt']}    return None\n```",
        "I am not sure how to solve this.",
    ]
    usage = ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)
    outputs = [
        ModelOutput.from_content("mockllm/model", a).model_copy(update={"usage": usage})
        for a in answers
    ]
    model = get_model("mockllm/model", custom_outputs=outputs)
    (log,) = inspect_eval(
        humaneval(limit=3), model=model, log_dir=str(log_dir), display="none", score=False
    )
    assert log.status == "success"
    return log.location


@pytest.mark.docker
@pytest.mark.slow
def test_score_retry_unscored_grades_a_docker_outage_from_the_saved_log(
    docker_sandbox, prefect_api, tmp_path, monkeypatch
):
    import scorers.sandbox.pool as sandbox

    log = _humaneval_log(tmp_path / "logs")
    db = str(tmp_path / "gb.duckdb")
    score = ["score", log, "--db", db, "--verifier", "unit_tests"]
    runner = CliRunner()

    # Docker "down": the Engine socket does not answer and no pool is cached
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(sandbox, "_default_pool", None)
    out = runner.invoke(app, score)
    assert out.exit_code == 0, out.output
    rows = "SELECT sample_id, attempt, status, reason FROM scores ORDER BY ALL"
    down = [
        ("HumanEval/0", 1, "unscored", "sandbox_unavailable"),
        ("HumanEval/1", 1, "unscored", "sandbox_unavailable"),
        ("HumanEval/2", 1, "scored", "no_answer"),
    ]
    assert _q(db, rows) == down
    monkeypatch.undo()  # Docker is back
    # scoring again without the flag keeps the old contract: those samples have a row
    assert runner.invoke(app, score).exit_code == 0
    assert _q(db, rows) == down

    out = runner.invoke(app, [*score, "--retry-unscored"])
    assert out.exit_code == 0, out.output
    assert _q(db, rows) == [
        ("HumanEval/0", 1, "unscored", "sandbox_unavailable"),  # history is kept
        ("HumanEval/0", 2, "scored", "tests_passed"),
        ("HumanEval/1", 1, "unscored", "sandbox_unavailable"),
        ("HumanEval/1", 2, "scored", "tests_failed"),
        ("HumanEval/2", 1, "scored", "no_answer"),
    ]
    metrics = _q(db, "SELECT n_samples, n_scored, n_unscored, accuracy FROM run_metrics")
    assert metrics == [(3, 3, 0, pytest.approx(1 / 3))]
    # `gradebook verifiers` counts samples graded, not rows: 3, not the 5 rows of history
    listing = runner.invoke(app, ["verifiers", "--db", db]).output
    (line,) = [ln for ln in listing.splitlines() if ln.strip("│ ").startswith("unit_tests")]
    assert [c.strip() for c in line.split("│")][-3] == "3"

    # a second retry finds nothing to retry and writes nothing
    assert runner.invoke(app, [*score, "--retry-unscored"]).exit_code == 0
    assert _q(db, "SELECT count(*) FROM scores") == [(5,)]


DEAD_DOCKER = "unix:///nonexistent/docker.sock"
WATCH_ROWS = "SELECT sample_id, attempt, status, reason FROM scores ORDER BY ALL"


@pytest.mark.docker
@pytest.mark.slow
def test_the_watcher_grades_a_docker_outage_again_once_the_sandbox_is_back(
    docker_sandbox, prefect_api, tmp_path, monkeypatch, capsys
):
    import scorers.sandbox.pool as sandbox

    log = _humaneval_log(tmp_path / "logs")
    db = str(tmp_path / "gb.duckdb")
    # a scheduled sweep's scoring while Docker is down
    monkeypatch.setenv("DOCKER_HOST", DEAD_DOCKER)
    monkeypatch.setattr(sandbox, "_default_pool", None)
    out = CliRunner().invoke(app, ["score", log, "--db", db, "--verifier", "unit_tests"])
    assert out.exit_code == 0, out.output
    down = [
        ("HumanEval/0", 1, "unscored", "sandbox_unavailable"),
        ("HumanEval/1", 1, "unscored", "sandbox_unavailable"),
        ("HumanEval/2", 1, "scored", "no_answer"),
    ]
    assert _q(db, WATCH_ROWS) == down

    # still down: the watcher checks the sandbox first and writes nothing, silently
    capsys.readouterr()
    waiting = watch_verifiers(db)
    assert (waiting.retry.written, waiting.retry.waiting_for_sandbox) == ([], 2)
    assert "Docker Engine not reachable" in (waiting.retry.sandbox_down or "")
    assert _q(db, WATCH_ROWS) == down
    assert "verifier watcher" not in capsys.readouterr().out

    monkeypatch.undo()  # Docker is back
    back = watch_verifiers(db)
    assert back.rescored == []  # no fingerprint changed: this is a retry, not a re-score
    assert [(w.scorer, w.retried, w.scored) for w in back.retry.written] == [("unit_tests", 2, 2)]
    assert _q(db, WATCH_ROWS) == [
        ("HumanEval/0", 1, "unscored", "sandbox_unavailable"),  # history is kept
        ("HumanEval/0", 2, "scored", "tests_passed"),
        ("HumanEval/1", 1, "unscored", "sandbox_unavailable"),
        ("HumanEval/1", 2, "scored", "tests_failed"),
        ("HumanEval/2", 1, "scored", "no_answer"),  # already judged: not graded again
    ]
    metrics = _q(db, "SELECT n_scored, n_unscored, accuracy FROM run_metrics")
    assert metrics == [(3, 0, pytest.approx(1 / 3))]
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "verifier watcher" in ln]
    assert "retried 2 sample(s)" in line and "2 scored" in line

    # the next tick has nothing to retry: no rows, no output
    assert watch_verifiers(db).retry.written == []
    assert _q(db, "SELECT count(*) FROM scores") == [(5,)]
    assert "verifier watcher" not in capsys.readouterr().out


@pytest.mark.docker
@pytest.mark.slow
def test_the_watcher_stops_retrying_a_sample_at_the_attempt_cap(
    docker_sandbox, prefect_api, tmp_path, monkeypatch, capsys
):
    assert WATCH_MAX_ATTEMPT == 3  # the numbers below follow from it
    # a grading service that keeps failing although the sandbox check passes: the sweep's
    # two passes and the watcher's one retry all find it down (3 x 6 calls)
    name = _flaky(tmp_path, monkeypatch, down_calls=18)
    cfg, _ = _sweep(tmp_path, name)
    db = str(cfg.warehouse)
    history = "SELECT attempt, status, count(*) FROM scores GROUP BY ALL ORDER BY ALL"
    assert _q(db, history) == [(1, "unscored", 6), (2, "unscored", 6)]

    capsys.readouterr()
    first = watch_verifiers(db)
    assert [(w.retried, w.unscored) for w in first.retry.written] == [(6, 6)]
    assert first.retry.at_cap == 6
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "verifier watcher" in ln]
    assert "6 unscored after 3 attempts" in line and "--retry-unscored" in line

    again = watch_verifiers(db)  # at the cap: left for a human, without a word
    assert (again.retry.written, again.retry.at_cap) == ([], 6)
    assert "verifier watcher" not in capsys.readouterr().out
    assert _q(db, history) == [(1, "unscored", 6), (2, "unscored", 6), (3, "unscored", 6)]

    # the cap binds only the watcher: a human's --retry-unscored still grades them
    out = CliRunner().invoke(app, ["rescore", "--db", db, "--scorer", name, "--retry-unscored"])
    assert out.exit_code == 0, out.output
    assert _q(db, "SELECT n_scored, n_unscored FROM run_metrics") == [(6, 0)]
    assert _q(db, "SELECT max(attempt) FROM scores") == [(4,)]
