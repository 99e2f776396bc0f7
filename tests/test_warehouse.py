"""Scores, views, migrations, the lock and the CLI, against real DuckDB files and processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner
from warehouse_logs import make_log

from flows.cli import app
from warehouse import (
    SCHEMA_VERSION,
    SCORE_SCHEMA,
    SchemaTooNew,
    Warehouse,
    WarehouseLocked,
    stage_scores,
)
from warehouse.migrations import migrate

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def score_rows(
    keys,
    *,
    scorer="math",
    fp="fp1",
    status="scored",
    value=1.0,
    answer="42",
    at=T0,
    reason=None,
    attempt=1,
    metadata=None,
):
    """A SCORE_SCHEMA table: one row per (run_id, sample_id, epoch) key."""
    n = len(keys)
    return pa.table(
        {
            "run_id": [k[0] for k in keys],
            "sample_id": [k[1] for k in keys],
            "epoch": pa.array([k[2] for k in keys], pa.int32()),
            "scorer": [scorer] * n,
            "fingerprint": [fp] * n,
            "status": [status] * n,
            "value": pa.array([value if status == "scored" else None] * n, pa.float64()),
            "answer": [answer] * n,
            "explanation": [f"{status}: {answer}"] * n,
            "reason": [reason or ("verified_equal" if value == 1.0 else "mismatch")] * n,
            "metadata": [json.dumps(metadata or {"k": 1})] * n,
            "scored_at": pa.array([at] * n, pa.timestamp("us", tz="UTC")),
            "duration_s": [0.01] * n,
            "attempt": pa.array([attempt] * n, pa.int32()),
            "image_id": pa.nulls(n, pa.string()),
        },
        schema=SCORE_SCHEMA,
    )


def q(wh: Warehouse, sql: str, params=None) -> list[tuple]:
    with wh.read() as con:
        return con.execute(sql, params or []).fetchall()


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return make_log(tmp_path_factory.mktemp("logs"))


@pytest.fixture
def wh(tmp_path, log) -> Warehouse:
    w = Warehouse(tmp_path / "g.duckdb")
    w.ingest_logs([log.location])
    return w


def test_write_scores_is_idempotent_and_dedupes_within_a_batch(wh, log):
    run = log.eval.eval_id
    keys = [(run, f"q{i}", e) for i in range(6) for e in (1, 2)]
    batch = pa.concat_tables([score_rows(keys), score_rows(keys[:3], answer="dup")])
    assert wh.write_scores(batch) == 12
    assert wh.write_scores(score_rows(keys)) == 0
    assert q(wh, "SELECT count(*), count(DISTINCT (sample_id, epoch)) FROM scores") == [(12, 12)]
    # a new fingerprint is a new key: history is appended, not overwritten
    assert wh.write_scores(score_rows(keys, fp="fp2", value=0.0)) == 12
    assert q(wh, "SELECT fingerprint, count(*) FROM scores GROUP BY 1 ORDER BY 1") == [
        ("fp1", 12),
        ("fp2", 12),
    ]


def test_write_scores_rejects_a_bad_status_and_missing_keys(wh, log):
    bad = score_rows([(log.eval.eval_id, "q1", 1)]).set_column(5, "status", pa.array(["maybe"]))
    with pytest.raises(ValueError, match="'maybe' is not one of scored, unscored, error"):
        wh.write_scores(bad)
    with pytest.raises(ValueError, match="lack required column"):
        wh.write_scores(pa.table({"run_id": ["r"]}))
    assert q(wh, "SELECT count(*) FROM scores") == [(0,)]


def test_staged_files_load_once(wh, log, tmp_path):
    run = log.eval.eval_id
    staged = tmp_path / "staged"
    a = stage_scores(score_rows([(run, "q1", 1), (run, "q2", 1)]), staged)
    stage_scores(score_rows([(run, "q2", 1), (run, "q4", 2)]), staged)
    assert pq.read_table(a).schema.equals(SCORE_SCHEMA, check_metadata=False)
    assert not list(staged.glob("*.tmp"))
    assert wh.load_staged(staged) == 3
    assert wh.load_staged(staged) == 0  # nothing left to load
    # a crash after commit but before the move leaves the file: reloading doubles nothing
    for f in (staged / "loaded").iterdir():
        f.rename(staged / f.name)
    assert wh.load_staged(staged) == 0
    assert q(wh, "SELECT count(*) FROM scores") == [(3,)]


def test_register_verifier_and_samples_to_score(wh, log):
    from scorers.identity.fingerprint import VerifierFingerprint

    fp = VerifierFingerprint("math", "d1", "math v1", "source text", {"tol": 0})
    assert wh.register_verifier(fp) is True
    assert wh.register_verifier(fp) is False
    assert q(wh, "SELECT name, fingerprint, label, source, params FROM verifiers") == [
        ("math", "d1", "math v1", "source text", '{"tol": 0}')
    ]
    run = log.eval.eval_id
    wh.write_scores(score_rows([(run, "q1", 1), (run, "q1", 2)], fp="d1"))
    todo = wh.samples_to_score("math", "d1")
    assert todo.num_rows == 10
    assert ("q1", 1) not in set(
        zip(todo["sample_id"].to_pylist(), todo["epoch"].to_pylist(), strict=True)
    )
    assert wh.samples_to_score("math", "d2").num_rows == 12
    assert wh.samples_to_score("math", "d1", run_ids=["nope"]).num_rows == 0
    assert todo.schema.field("epoch").type == pa.int32()
    errored = [r for r in todo.to_pylist() if r["error"]]
    assert {r["sample_id"] for r in errored} == {"q0", "q3"}


def _score_the_log(wh: Warehouse, run: str) -> None:
    """fp1: q0,q3 errored; q1,q2 correct; q4 wrong; q5 unscored. fp2 (a day later): q4 right."""
    ep = (1, 2)
    wh.write_scores(score_rows([(run, s, e) for s in ("q0", "q3") for e in ep], status="error"))
    wh.write_scores(score_rows([(run, s, e) for s in ("q1", "q2") for e in ep]))
    wh.write_scores(score_rows([(run, "q4", e) for e in ep], value=0.0, answer="41"))
    wh.write_scores(score_rows([(run, "q5", e) for e in ep], status="unscored"))
    later = T0 + timedelta(days=1)
    wh.write_scores(
        score_rows(
            [(run, s, e) for s in ("q0", "q3") for e in ep], fp="fp2", status="error", at=later
        )
    )
    wh.write_scores(
        score_rows([(run, s, e) for s in ("q1", "q2", "q4") for e in ep], fp="fp2", at=later)
    )
    wh.write_scores(
        score_rows([(run, "q5", e) for e in ep], fp="fp2", value=0.0, answer="7", at=later)
    )


def test_run_metrics_counts_coverage_and_accuracy(wh, log):
    run = log.eval.eval_id
    _score_the_log(wh, run)
    got = q(
        wh,
        "SELECT fingerprint, task, model, n_samples, n_scored, n_unscored, n_error, accuracy, "
        "accuracy_strict, stderr FROM run_metrics ORDER BY fingerprint",
    )
    fp1, fp2 = got
    assert fp1[:7] == ("fp1", "arith", "mockllm/model", 12, 6, 2, 4)
    assert fp1[7] == pytest.approx(4 / 6) and fp1[8] == pytest.approx(4 / 12)
    assert fp1[9] == pytest.approx(math.sqrt((4 / 6) * (2 / 6) * 6 / 5 / 6))
    assert fp2[3:7] == (12, 8, 0, 4)
    assert fp2[7] == pytest.approx(6 / 8) and fp2[8] == pytest.approx(6 / 12)


def test_latest_scores_grade_flips_and_history(wh, log):
    run = log.eval.eval_id
    _score_the_log(wh, run)
    assert q(wh, "SELECT DISTINCT fingerprint FROM latest_scores") == [("fp2",)]
    flips = q(
        wh,
        "SELECT sample_id, epoch, old_fingerprint, new_fingerprint, old_value, new_value, "
        "old_answer, new_answer FROM grade_flips ORDER BY sample_id, epoch",
    )
    assert flips == [
        ("q4", 1, "fp1", "fp2", 0.0, 1.0, "41", "42"),
        ("q4", 2, "fp1", "fp2", 0.0, 1.0, "41", "42"),
        ("q5", 1, "fp1", "fp2", None, 0.0, "42", "7"),
        ("q5", 2, "fp1", "fp2", None, 0.0, "42", "7"),
    ]
    history = q(
        wh,
        "SELECT task, model, scorer, fingerprint, accuracy_strict, n_samples "
        "FROM score_history ORDER BY fingerprint",
    )
    assert [h[:4] for h in history] == [
        ("arith", "mockllm/model", "math", "fp1"),
        ("arith", "mockllm/model", "math", "fp2"),
    ]
    assert history[1][4] == pytest.approx(0.5) and history[1][5] == 12


def test_a_registered_verifier_orders_fingerprints_by_first_seen(wh, log):
    from scorers.identity.fingerprint import VerifierFingerprint

    run = log.eval.eval_id
    # "zzz" scored earlier but registered later than "aaa": registration decides which is newest
    wh.register_verifier(VerifierFingerprint("math", "zzz", "v1", "", {}))
    time.sleep(0.01)
    wh.register_verifier(VerifierFingerprint("math", "aaa", "v2", "", {}))
    wh.write_scores(score_rows([(run, "q1", 1)], fp="aaa", at=T0))
    wh.write_scores(score_rows([(run, "q1", 1)], fp="zzz", value=0.0, at=T0 + timedelta(1)))
    assert q(wh, "SELECT DISTINCT fingerprint FROM latest_scores") == [("aaa",)]
    assert q(wh, "SELECT old_fingerprint, new_fingerprint FROM grade_flips") == [("zzz", "aaa")]


def test_migration_from_the_previous_schema_version(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    migrate(con, str(path), target=1)  # a v1 file: tables only, no analysis views
    con.execute(
        "INSERT INTO wh.scores VALUES ('r1', 's1', 1, 'math', 'fp', 'scored', 1.0, '1', 'ok', "
        "'verified_equal', '{}', now(), 0.1)"
    )
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM run_metrics")
    con.close()

    wh = Warehouse(path)
    assert wh.schema_version() == SCHEMA_VERSION
    assert q(wh, "SELECT run_id, n_scored, accuracy FROM run_metrics") == [("r1", 1, 1.0)]
    assert q(wh, "SELECT version FROM wh.schema_version ORDER BY 1") == [
        (v,) for v in range(1, SCHEMA_VERSION + 1)
    ]


def _unscored(wh: Warehouse, keys, reason: str, explanation: str, **kw) -> None:
    rows = score_rows(keys, status="unscored", reason=reason, **kw)
    wh.write_scores(rows.set_column(8, "explanation", pa.array([explanation] * len(keys))))


def _retry_keys(wh: Warehouse, scope) -> list[tuple]:
    todo = wh.samples_to_score("math", "fp1", retry=scope)
    return sorted(
        (r["sample_id"], r["epoch"], r["attempt"]) for r in todo.to_pylist() if r["attempt"] > 1
    )


def test_samples_to_score_offers_only_retryable_unscored_samples_again(wh, log):
    run = log.eval.eval_id
    _unscored(wh, [(run, "q1", 1)], "sandbox_unavailable", "Docker Engine not reachable")
    _unscored(wh, [(run, "q1", 2)], "timeout", "verifier did not finish within 60s")
    _unscored(wh, [(run, "q2", 1)], "verifier_error", "verifier raised ValueError: x")
    _unscored(wh, [(run, "q2", 2)], "verifier_error", "scoring worker died (exit code -9): EOF")
    _unscored(wh, [(run, "q4", 1)], "invalid_target", "the reference does not parse")
    wh.write_scores(score_rows([(run, "q4", 2), (run, "q5", 1)]))
    wh.write_scores(score_rows([(run, "q0", 1)], status="error", reason="generation_error"))

    # without a retry, nothing that has a row is offered again (the old contract)
    plain = wh.samples_to_score("math", "fp1")
    assert set(plain["attempt"].to_pylist()) == {1}
    assert plain.num_rows == 12 - 8
    assert _retry_keys(wh, "all") == [("q1", 1, 2), ("q1", 2, 2), ("q2", 1, 2), ("q2", 2, 2)]
    assert wh.samples_to_score("math", "fp1", retry="all").num_rows == 4 + 4
    # what the sweep retries by itself: the sandbox and a dead worker, not the verifier's faults
    assert _retry_keys(wh, "infrastructure") == [("q1", 1, 2), ("q2", 2, 2)]


def test_an_automatic_retry_can_leave_out_a_reason_and_stops_at_an_attempt_cap(wh, log):
    run = log.eval.eval_id
    down = "Docker Engine not reachable"
    _unscored(wh, [(run, "q1", 1), (run, "q5", 1)], "sandbox_unavailable", down)
    _unscored(wh, [(run, "q1", 1)], "sandbox_unavailable", down, attempt=2)
    _unscored(wh, [(run, "q2", 1)], "verifier_error", "scoring worker died (exit code -9): EOF")
    _unscored(wh, [(run, "q4", 1)], "verifier_error", "verifier raised ValueError: x")
    # counted per run, reason and latest attempt, without reading the samples
    assert wh.unscored_to_retry("math", "fp1", "infrastructure") == [
        (run, "sandbox_unavailable", 1, 1),
        (run, "sandbox_unavailable", 2, 1),
        (run, "verifier_error", 1, 1),
    ]
    assert wh.unscored_to_retry("math", "fp2", "infrastructure") == []

    def retries(**kw) -> list[tuple]:
        todo = wh.samples_to_score("math", "fp1", retry="infrastructure", **kw)
        return sorted((r["sample_id"], r["attempt"]) for r in todo.to_pylist() if r["attempt"] > 1)

    assert retries() == [("q1", 3), ("q2", 2), ("q5", 2)]
    assert retries(max_attempt=2) == [("q2", 2), ("q5", 2)]  # q1 is at attempt 2 already
    assert retries(skip_reasons=["sandbox_unavailable"]) == [("q2", 2)]


def test_a_retry_is_a_new_attempt_and_every_view_reads_the_latest(wh, log):
    run = log.eval.eval_id
    keys = [(run, "q1", 1), (run, "q2", 1)]
    _unscored(wh, keys, "sandbox_unavailable", "Docker Engine not reachable")
    wh.write_scores(score_rows([(run, "q4", 1)], value=0.0))
    retry = score_rows(keys, value=1.0, attempt=2, at=T0 + timedelta(hours=1))
    assert wh.write_scores(retry) == 2
    assert wh.write_scores(retry) == 0  # idempotent, like every write
    # a retry never supersedes a scored row, and attempts have no gaps
    assert wh.write_scores(score_rows([(run, "q4", 1)], value=1.0, attempt=2)) == 0
    assert wh.write_scores(score_rows([(run, "q1", 1)], value=0.0, attempt=3)) == 0
    assert wh.write_scores(score_rows([(run, "q5", 1)], value=1.0, attempt=2)) == 0

    assert q(wh, "SELECT sample_id, attempt, status FROM scores ORDER BY ALL") == [
        ("q1", 1, "unscored"),
        ("q1", 2, "scored"),
        ("q2", 1, "unscored"),
        ("q2", 2, "scored"),
        ("q4", 1, "scored"),
    ]
    assert q(wh, "SELECT sample_id, attempt FROM latest_scores ORDER BY ALL") == [
        ("q1", 2),
        ("q2", 2),
        ("q4", 1),
    ]
    metrics = q(wh, "SELECT n_scored, n_unscored, n_pending, accuracy, pass_at_k FROM run_metrics")
    # the run has 2 epochs; epoch 2 is not scored yet, so it counts as a failed attempt
    assert metrics == [(3, 0, 9, pytest.approx(2 / 3), pytest.approx([1 / 3, 2 / 3]))]
    assert q(wh, "SELECT n_scored, accuracy FROM score_history") == [(3, pytest.approx(2 / 3))]
    assert q(wh, "SELECT k, n_problems FROM run_pass_at_k ORDER BY k") == [(1, 3), (2, 3)]
    assert q(wh, "SELECT count(*) FROM grade_flips") == [(0,)]
    assert wh.samples_to_score("math", "fp1", retry="all").num_rows == 12 - 3


def _in_image(**images: str) -> dict:
    """A sandbox verdict's metadata: each named sandbox restored into that task image."""
    return {"sandbox": {"restored": {n: {"image": "t", "image_id": i} for n, i in images.items()}}}


def test_a_verdict_graded_in_a_rebuilt_image_supersedes_only_one_from_another_image(wh, log):
    run = log.eval.eval_id
    old, new = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    wh.write_scores(
        score_rows([(run, "q1", 1), (run, "q2", 1)], value=0.0, metadata=_in_image(default=old))
    )
    wh.write_scores(score_rows([(run, "q4", 1)], value=0.0))  # gradebook's own image
    assert q(wh, "SELECT DISTINCT image_id FROM scores ORDER BY 1") == [(old,), (None,)]
    # graded again: asked for, by key, as the next attempt (only those asked for, each once)
    todo = wh.samples_to_score(
        "math", "fp1", run_ids=[run], regrade=[(run, "q1", 1), (run, "q4", 1), (run, "q1", 1)]
    )
    # epoch 1 of q1, q2 and q4 is graded; the rest of the run is not: first attempts (q0 and
    # q3 are generation errors, graded as such)
    again = sorted((r["sample_id"], r["attempt"]) for r in todo.to_pylist() if r["epoch"] == 1)
    assert again == [("q0", 1), ("q1", 2), ("q3", 1), ("q4", 2), ("q5", 1)]
    # only a row naming another image supersedes a verdict from an image
    assert (
        wh.write_scores(score_rows([(run, "q1", 1)], attempt=2, metadata=_in_image(default=old)))
        == 0
    )
    _unscored(wh, [(run, "q2", 1)], "sandbox_unavailable", "image gone", attempt=2)
    assert (
        wh.write_scores(score_rows([(run, "q4", 1)], attempt=2, metadata=_in_image(default=new)))
        == 0
    )
    rebuilt = score_rows([(run, "q1", 1)], attempt=2, metadata=_in_image(default=new))
    assert wh.write_scores(rebuilt) == 1
    assert wh.write_scores(rebuilt) == 0  # idempotent
    assert q(wh, "SELECT sample_id, attempt, value, image_id FROM latest_scores ORDER BY 1") == [
        ("q1", 2, 1.0, new),
        ("q2", 1, 0.0, old),  # its re-grade could not restore: the verdict stands
        ("q4", 1, 0.0, None),
    ]
    assert q(
        wh,
        "SELECT n_scored, n_correct FROM (SELECT n_scored, round(accuracy * n_scored) AS n_correct FROM run_metrics)",
    ) == [(3, 1)]
    # several sandboxes: each named, sorted
    two = _in_image(helper=old, default=new)
    wh.write_scores(score_rows([(run, "q5", 1)], metadata=two))
    assert q(wh, "SELECT image_id FROM scores WHERE sample_id = 'q5'") == [
        (f"default={new},helper={old}",)
    ]


def test_a_retry_is_not_a_flip_and_clears_a_flip_against_its_unscored_attempt(wh, log):
    run = log.eval.eval_id
    wh.write_scores(score_rows([(run, "q1", 1)], fp="fp0", value=1.0))
    later = T0 + timedelta(days=1)
    _unscored(wh, [(run, "q1", 1)], "sandbox_unavailable", "Docker Engine not reachable", at=later)
    # fp0 scored it, fp1 could not: a flip (scored -> unscored) until the retry is stored
    assert q(wh, "SELECT old_fingerprint, new_status FROM grade_flips") == [("fp0", "unscored")]
    retry = score_rows([(run, "q1", 1)], value=1.0, attempt=2, at=later + timedelta(hours=1))
    assert wh.write_scores(retry) == 1
    assert q(wh, "SELECT count(*) FROM grade_flips") == [(0,)]
    # a retry that grades differently from fp0 is a flip between the fingerprints' verdicts
    wh.write_scores(score_rows([(run, "q2", 1)], fp="fp0", value=1.0))
    _unscored(wh, [(run, "q2", 1)], "timeout", "verifier did not finish within 60s", at=later)
    wh.write_scores(score_rows([(run, "q2", 1)], value=0.0, attempt=2, at=later))
    assert q(wh, "SELECT sample_id, old_value, new_status, new_value FROM grade_flips") == [
        ("q2", 1.0, "scored", 0.0)
    ]


def test_migration_from_v5_keeps_every_row_and_then_retries(tmp_path):
    path = tmp_path / "v5.duckdb"
    con = duckdb.connect(str(path))
    migrate(con, str(path), target=5)  # the schema before grading attempts
    con.execute(
        "INSERT INTO wh.samples (run_id, sample_id, epoch, completion) "
        "VALUES ('r1', 's1', 1, 'a'), ('r1', 's2', 1, 'b'), ('r1', 's3', 1, 'c')"
    )
    con.execute(
        "INSERT INTO wh.scores VALUES "
        "('r1', 's1', 1, 'math', 'fp', 'scored', 1.0, '1', 'ok', 'verified_equal', '{}', "
        " TIMESTAMPTZ '2026-01-01', 0.1), "
        "('r1', 's2', 1, 'math', 'fp', 'unscored', NULL, NULL, 'down', 'sandbox_unavailable', "
        " '{}', TIMESTAMPTZ '2026-01-01', 0.1), "
        "('r1', 's3', 1, 'math', 'fp', 'error', NULL, NULL, 'boom', 'generation_error', '{}', "
        " TIMESTAMPTZ '2026-01-01', 0.0), "
        "('r1', 's1', 1, 'math', 'fp0', 'scored', 0.0, '2', 'no', 'mismatch', '{}', "
        " TIMESTAMPTZ '2025-12-01', 0.1)"
    )
    con.execute(
        "INSERT INTO wh.flip_pairs SELECT 'math', 'r1', 's1', 1, 'fp0', 'fp', 'scored', "
        "'scored', 0.0, 1.0, '2', '1', 'no', 'ok' UNION ALL SELECT 'math', 'r1', 's1', 1, 'fp', "
        "'fp0', 'scored', 'scored', 1.0, 0.0, '1', '2', 'ok', 'no'"
    )
    scores_before = con.execute("SELECT * FROM wh.scores ORDER BY ALL").fetchall()
    pairs_before = con.execute("SELECT * FROM wh.flip_pairs ORDER BY ALL").fetchall()
    metrics_before = con.execute(
        "SELECT * EXCLUDE (created) FROM run_metrics ORDER BY ALL"
    ).fetchall()
    con.close()

    wh = Warehouse(path)
    assert wh.schema_version() == SCHEMA_VERSION
    assert (
        q(wh, "SELECT * EXCLUDE (attempt, image_id) FROM wh.scores ORDER BY ALL") == scores_before
    )
    assert q(wh, "SELECT DISTINCT attempt FROM wh.scores") == [(1,)]
    pairs = "SELECT * EXCLUDE (old_attempt, new_attempt) FROM wh.flip_pairs ORDER BY ALL"
    assert q(wh, pairs) == pairs_before
    assert q(wh, "SELECT * EXCLUDE (created) FROM run_metrics ORDER BY ALL") == metrics_before
    assert q(wh, "SELECT sample_id FROM grade_flips") == [("s1",)]
    # the migrated file takes retries: only the sandbox_unavailable sample is offered again
    todo = wh.samples_to_score("math", "fp", retry="all").to_pylist()
    assert [(r["sample_id"], r["attempt"]) for r in todo] == [("s2", 2)]


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.duckdb"
    Warehouse(path).write_scores(score_rows([("r", "s", 1)]))
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO wh.schema_version VALUES (99, 'from the future', now())")
    con.close()
    with pytest.raises(SchemaTooNew, match="schema version 99 but this gradebook knows only"):
        Warehouse(path).write_scores(score_rows([("r", "s", 2)]))
    result = CliRunner().invoke(app, ["sql", "SELECT 1", "--db", str(path)])
    assert result.exit_code == 2
    assert "schema version 99" in result.output


_HOLD_LOCK = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
print("released", flush=True)
time.sleep(30)
"""


def _hold(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow
def test_sql_names_the_process_holding_the_lock(wh):
    holder = _hold(wh.path, 60)
    try:
        result = subprocess.run(
            [
                str(REPO / ".venv/bin/gradebook"),
                "sql",
                "SELECT count(*) FROM runs",
                "--db",
                str(wh.path),
                "--lock-timeout",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1
        assert f"locked by process {holder.pid}" in lines[0]
        with pytest.raises(WarehouseLocked) as info:
            with Warehouse(wh.path, lock_timeout_s=0.3).read():
                pass
        assert info.value.pid == holder.pid
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_sql_waits_out_a_short_write_and_answers(wh):
    holder = _hold(wh.path, 1.5)
    try:
        result = subprocess.run(
            [
                str(REPO / ".venv/bin/gradebook"),
                "sql",
                "SELECT count(*) AS n FROM samples",
                "--db",
                str(wh.path),
                "--format",
                "csv",
                "--lock-timeout",
                "20",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["n", "12"]
    finally:
        holder.kill()
        holder.wait()


def test_cli_ingest_sql_and_export(log, tmp_path):
    runner = CliRunner()
    db = tmp_path / "cli.duckdb"
    env = {"GRADEBOOK_DB": str(db)}
    result = runner.invoke(app, ["ingest", log.location], env=env)
    assert result.exit_code == 0, result.output
    assert "+12 samples (12 stored)" in result.output

    bad = runner.invoke(app, ["ingest", str(tmp_path / "nope.eval"), log.location], env=env)
    assert bad.exit_code == 2
    assert "nope.eval: no such file" in bad.output
    assert "+0 samples (12 stored)" in bad.output

    as_json = runner.invoke(
        app,
        ["sql", "SELECT sample_id, epoch FROM samples ORDER BY 1, 2 LIMIT 2", "--format", "json"],
        env=env,
    )
    assert as_json.exit_code == 0
    assert json.loads(as_json.output) == [
        {"sample_id": "q0", "epoch": 1},
        {"sample_id": "q0", "epoch": 2},
    ]
    table = runner.invoke(app, ["sql", "SELECT task, n_samples FROM runs"], env=env)
    assert "arith" in table.output and "1 row" in table.output

    bad_sql = runner.invoke(app, ["sql", "SELECT * FROM nowhere"], env=env)
    assert bad_sql.exit_code == 2 and "query failed" in bad_sql.output
    read_only = runner.invoke(app, ["sql", "DELETE FROM wh.samples"], env=env)
    assert read_only.exit_code == 2
    assert q(Warehouse(db), "SELECT count(*) FROM samples") == [(12,)]

    missing = runner.invoke(app, ["sql", "SELECT 1", "--db", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 2 and "no warehouse here" in missing.output

    out = tmp_path / "export"
    exported = runner.invoke(app, ["export", "--parquet", str(out)], env=env)
    assert exported.exit_code == 0, exported.output
    assert pq.read_table(out / "samples.parquet").num_rows == 12
    assert pq.read_table(out / "messages.parquet").num_rows == 20
    assert pq.read_table(out / "runs.parquet").column("task").to_pylist() == ["arith"]
    # one file per documented view (docs/reference/warehouse.md: every view as DIR/<view>.parquet), no temp files
    assert sorted(p.name for p in out.iterdir()) == [
        f"{view}.parquet"
        for view in (
            "current_scores",
            "current_verifiers",
            "fingerprint_changes",
            "fingerprint_order",
            "gates",
            "grade_flips",
            "judge_usage",
            "latest_gates",
            "latest_scores",
            "log_copies",
            "messages",
            "run_metrics",
            "run_metrics_base",
            "run_pass_at_k",
            "runs",
            "samples",
            "sandbox_calls",
            "score_history",
            "scores",
            "verifier_specs",
            "verifiers",
            "workspaces",
        )
    ]
    assert pq.read_table(out / "gates.parquet").schema.names[:3] == ["gate_id", "created", "run_id"]
    assert not os.environ.get("GRADEBOOK_DB")
