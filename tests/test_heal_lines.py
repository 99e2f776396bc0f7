"""The line every command prints about samples left unscored for a retryable reason says what
to do about each reason, not the reason's name again (warehouse.heal)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_kit import gradebook, shell_env
from gate_world import ingest, run_eval, score_run

from scorers.grade import unscored
from warehouse import Warehouse
from warehouse.heal import Unscored, heal_lines
from warehouse.schema import RETRYABLE_REASONS
from workspaces.restore import STORES_ENV


@pytest.mark.parametrize("reason", RETRYABLE_REASONS)
def test_each_retryable_reason_says_why_and_what_to_do(reason: str, tmp_path: Path) -> None:
    [line, heal] = heal_lines(tmp_path / "g.duckdb", [Unscored("run-1", "math", reason, 2)])
    head, _, cause = line.partition(f"2 samples unscored ({reason} 2): ")
    assert head == "" and cause, line
    assert reason not in cause, line  # not "workspace_missing: workspace_missing."
    assert "once that is fixed" not in cause.lower(), line  # says what "that" is
    assert "--retry-unscored" in heal


def test_several_reasons_each_say_what_to_do(tmp_path: Path) -> None:
    [line, _] = heal_lines(
        tmp_path / "g.duckdb",
        [
            Unscored("run-1", "a", "sandbox_unavailable", 1),
            Unscored("run-2", "b", "grader_failed", 1),
        ],
    )
    assert "`make services`" in line and "once it answers" in line, line


def test_gate_says_where_a_missing_workspace_is_looked_for(tmp_path: Path) -> None:
    # a run whose samples' sandbox workspaces were in no store when they were graded: the
    # restore's own explanation, under the math verifier's current fingerprint
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier

    db = tmp_path / "g.duckdb"
    wh = Warehouse(db)
    log = run_eval(tmp_path / "logs", ["1", "2"], metadata={"verifiers": ["math"]})
    run_id = ingest(wh, log)
    missing = unscored(
        "workspace_missing",
        "workspace 0123456789ab of sandbox 'default' is in none of the stores /gone/workspaces: "
        f"mount the store there, or name its directory or URL in {STORES_ENV}, then grade again with "
        "--retry-unscored",
    )
    digest = fingerprint(get_verifier("math")).digest
    score_run(wh, run_id, lambda view: missing, scorer="math", fingerprint=digest)

    gate = gradebook("gate", "--run", run_id, "--db", str(db), env=shell_env(tmp_path / "ph"),
                     cwd=tmp_path)  # fmt: skip
    assert gate.code == 1, gate.stdout + gate.stderr  # its unscored rate fails it
    [line] = [ln for ln in gate.stdout.splitlines() if "unscored (workspace_missing 2)" in ln]
    assert "workspace_missing." not in line, line
    # the variable the restore reads (workspaces.restore), and the way out when none has it
    assert STORES_ENV in line and "re-run their generation" in line, line
    # a store may be a bucket prefix, reached with this host's own credentials (issue 39)
    assert "s3:// prefix" in line and "AWS_ENDPOINT_URL" in line, line
