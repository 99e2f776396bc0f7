"""Nothing to do costs nothing: `score`, `rescore` and `gate` decide from the warehouse, before
any flow run and without loading Prefect or Inspect, and say what they found.

PREFECT_API_URL points at a port where nothing listens: a command that touched Prefect would
fail on it (exit 2, "does not answer"), so answering at all shows it did not.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from process_kit import cli_env, gradebook, make_log

DEAD_API = "http://127.0.0.1:9/api"
# Runs the CLI, then reports on stderr whether Prefect or Inspect were imported.
PROBE = (
    "import atexit, sys; atexit.register(lambda: print('LOADED prefect=%s inspect=%s' % "
    "('prefect' in sys.modules, 'inspect_ai' in sys.modules), file=sys.stderr)); "
    "from flows.cli import main; main()"
)


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=cli_env(api_url=DEAD_API),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def scored(tmp_path_factory, prefect_api):
    """A log of 5 samples, ingested and scored by the math verifier for real."""
    tmp = tmp_path_factory.mktemp("noop")
    log = make_log(tmp / "logs", 5)
    db = tmp / "w.duckdb"
    out = gradebook("score", str(log), "--db", str(db), env=cli_env(api_url=prefect_api))
    assert out.returncode == 0, out.stderr
    return log, db


def _math_digest() -> str:
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier

    return fingerprint(get_verifier("math")).digest


def test_score_of_a_scored_log_answers_from_the_warehouse_alone(scored):
    log, db = scored
    out = _probe("score", str(log), "--db", str(db))

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"nothing to score: 5 samples already scored by math@{_math_digest()[:8]}"
    )
    assert "LOADED prefect=False inspect=False" in out.stderr


def test_rescore_with_nothing_changed_answers_from_the_warehouse_alone(scored):
    _, db = scored
    out = _probe("rescore", "--db", str(db))

    assert out.returncode == 0, out.stderr
    assert "nothing to re-score: every verifier's fingerprint is current" in out.stdout
    assert "LOADED prefect=False inspect=False" in out.stderr


def test_gate_answers_without_loading_prefect(scored):
    from warehouse import Warehouse

    _, db = scored
    with Warehouse(db).read() as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    out = _probe("gate", "--db", str(db), "--run", run_id, "--min-accuracy", "0", "--dry-run")

    assert out.returncode == 0, out.stderr
    assert "gate: PASS" in out.stdout
    assert "LOADED prefect=False" in out.stderr


def test_score_with_work_left_runs_its_flow(scored):
    # unit_tests never graded this log: that is work, so the command goes to Prefect (here:
    # the dead URL, exit 2), it never claims there is nothing to do
    log, db = scored
    out = _probe("score", str(log), "--db", str(db), "--verifier", "unit_tests")
    assert out.returncode == 2
    assert "nothing to score" not in out.stdout
    assert "does not answer" in out.stderr


def test_a_log_whose_file_changed_is_not_taken_as_scored(scored, tmp_path):
    # a copy has another inode: the warehouse's record cannot vouch for it without a read
    import shutil

    log, db = scored
    copy = tmp_path / log.name
    shutil.copy(log, copy)
    out = _probe("score", str(copy), "--db", str(db))
    assert out.returncode == 2 and "nothing to score" not in out.stdout


def test_score_with_a_scorer_file_given_answers_before_prefect_loads(tmp_path, prefect_api):
    # the entry as typed (`file.py@scorer`) is not the name its rows are stored under
    scorers = tmp_path / "my_scorers.py"
    scorers.write_text(
        "from inspect_ai.scorer import accuracy, includes, scorer\n\n\n"
        "@scorer(metrics=[accuracy()])\n"
        "def has_target():\n"
        "    return includes()\n"
    )
    log = make_log(tmp_path / "logs", 3)
    db = tmp_path / "w.duckdb"
    given = ("score", str(log), "--db", str(db), "--verifier", f"{scorers}@has_target")
    out = gradebook(*given, env=cli_env(api_url=prefect_api))
    assert out.returncode == 0, out.stderr

    again = _probe(*given)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("nothing to score: 3 samples already scored by has_target@")
    assert "LOADED prefect=False" in again.stderr
