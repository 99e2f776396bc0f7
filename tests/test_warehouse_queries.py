"""run_metrics, run_pass_at_k and grade_flips give the numbers the schema-version-4 views gave.

The same score history (several epochs, three fingerprints, NULL values, unscored and errored
rows, a verifier registered after it scored) is written through `Warehouse.write_scores` in
batches into a current warehouse, and inserted directly into a warehouse left at schema
version 4; every row of the three views must agree.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pytest

from warehouse import SCORE_SCHEMA, Warehouse
from warehouse.migrations import migrate

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _history(seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    runs = {"r-a": 1, "r-b": 3, "r-c": 2, "r-orphan": None}  # run -> epochs (None: no runs row)
    for run, epochs in runs.items():
        for fp_i, fp in enumerate(("fp-old", "fp-mid", "fp-new")):
            for sample in range(25):
                for epoch in range(1, (epochs or 2) + 1):
                    if rng.random() < 0.1:
                        continue  # not every attempt scored: pending rows
                    status = rng.choices(["scored", "unscored", "error"], [0.8, 0.1, 0.1])[0]
                    value = rng.choice([0.0, 1.0, 1.0, 0.5, None]) if status == "scored" else None
                    rows.append(
                        {
                            "run_id": run,
                            "sample_id": f"s{sample}",
                            "epoch": epoch,
                            "scorer": rng.choice(["math", "math", "code"]),
                            "fingerprint": fp,
                            "status": status,
                            "value": value,
                            "answer": str(rng.randint(0, 9)),
                            "explanation": f"e{rng.randint(0, 3)}",
                            "reason": "r",
                            "metadata": "{}",
                            "scored_at": T0 + timedelta(days=fp_i, seconds=sample),
                            "duration_s": 0.01,
                        }
                    )
    return rows


def _runs_sql() -> str:
    return (
        "INSERT INTO wh.runs (run_id, task, model, created, epochs) VALUES "
        "('r-a', 't', 'm', TIMESTAMPTZ '2026-01-01', 1), "
        "('r-b', 't', 'm', TIMESTAMPTZ '2026-01-02', 3), "
        "('r-c', 't2', 'm', TIMESTAMPTZ '2026-01-03', 2)"
    )


def _dedupe(rows: list[dict]) -> list[dict]:
    seen, out = set(), []
    for r in rows:
        key = (r["run_id"], r["sample_id"], r["epoch"], r["scorer"], r["fingerprint"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(current warehouse path, v4 warehouse path) holding the same history."""
    d = tmp_path_factory.mktemp("views")
    rows = _dedupe(_history())
    rng = random.Random(3)

    current = Warehouse(d / "current.duckdb")
    with current.write() as con:
        con.execute(_runs_sql())
        # registered in an order that differs from when each fingerprint first scored
        con.execute(
            "INSERT INTO wh.verifiers (name, fingerprint, label, source, params, first_seen) "
            "VALUES ('math', 'fp-new', 'n', '', '{}', "
            "TIMESTAMPTZ '2025-12-01'), ('math', 'fp-old', 'o', '', '{}', TIMESTAMPTZ '2025-12-02')"
        )
    shuffled = rows[:]
    rng.shuffle(shuffled)
    # half in batches mixing fingerprints, half one (scorer, fingerprint) per batch like a
    # re-score, then a rewrite of rows already stored (must add nothing)
    half = len(shuffled) // 2
    for start in range(0, half, 50):
        current.write_scores(
            pa.Table.from_pylist(shuffled[start : min(start + 50, half)], SCORE_SCHEMA)
        )
    for scorer, fp in sorted({(r["scorer"], r["fingerprint"]) for r in shuffled[half:]}):
        same = [r for r in shuffled[half:] if (r["scorer"], r["fingerprint"]) == (scorer, fp)]
        current.write_scores(pa.Table.from_pylist(same, SCORE_SCHEMA))
    assert current.write_scores(pa.Table.from_pylist(shuffled[:200], SCORE_SCHEMA)) == 0

    old_path = d / "v4.duckdb"
    con = duckdb.connect(str(old_path))
    migrate(con, str(old_path), target=4)
    con.execute(_runs_sql())
    con.execute(
        "INSERT INTO wh.verifiers VALUES ('math', 'fp-new', 'n', '', '{}', "
        "TIMESTAMPTZ '2025-12-01'), ('math', 'fp-old', 'o', '', '{}', TIMESTAMPTZ '2025-12-02')"
    )
    con.register("incoming", pa.Table.from_pylist(rows, SCORE_SCHEMA))
    con.execute("INSERT INTO wh.scores SELECT * EXCLUDE (attempt, image_id) FROM incoming")  # v4
    con.close()
    return current.path, old_path


def _rows(path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _assert_same(new: list[tuple], old: list[tuple]) -> None:
    assert len(new) == len(old) > 0
    for n, o in zip(new, old, strict=True):
        assert all(_close(x, y) for x, y in zip(n, o, strict=True)), (n, o)


def test_run_metrics_match_the_v4_definition(pair):
    current, old = pair
    sql = "SELECT * FROM run_metrics ORDER BY run_id, scorer, fingerprint"
    new_rows, old_rows = _rows(current, sql), _rows(old, sql)
    _assert_same(new_rows, old_rows)
    # the variety compared: multi-epoch pass@k lists, single-epoch runs, a run with no runs row
    epochs = {r[0]: r[14] for r in new_rows}
    assert epochs["r-b"] == 3 and epochs["r-a"] == 1 and epochs["r-orphan"] == 1
    assert {len(r[15]) for r in new_rows if r[0] == "r-b"} == {3}
    names = [d[0] for d in duckdb.connect(str(current), read_only=True).sql(sql).description]
    assert names[-2:] == ["epochs", "pass_at_k"]


def test_run_pass_at_k_and_score_history_match_the_v4_definition(pair):
    current, old = pair
    for sql in (
        "SELECT * FROM run_pass_at_k ORDER BY ALL",
        "SELECT * FROM score_history ORDER BY run_id, scorer, fingerprint",
        "SELECT * FROM run_metrics_base ORDER BY run_id, scorer, fingerprint",
    ):
        _assert_same(_rows(current, sql), _rows(old, sql))


def test_grade_flips_match_the_v4_self_join(pair):
    current, old = pair
    sql = "SELECT * FROM grade_flips ORDER BY ALL"
    new_rows = _rows(current, sql)
    assert new_rows == _rows(old, sql)
    # registration order, not scoring order, decides which fingerprint is older
    directions = {(r[4], r[5]) for r in new_rows if r[0] == "math"}
    assert ("fp-new", "fp-old") in directions and ("fp-old", "fp-new") not in directions


def test_migrating_a_v4_file_fills_flip_pairs(pair, tmp_path):
    current, old = pair
    copy = tmp_path / "upgraded.duckdb"
    copy.write_bytes(old.read_bytes())
    wh = Warehouse(copy)
    with wh.read() as con:  # opening upgrades it
        upgraded = con.sql("SELECT * FROM grade_flips ORDER BY ALL").fetchall()
    assert upgraded == _rows(current, "SELECT * FROM grade_flips ORDER BY ALL")


def test_gate_lookups_leave_the_connection_usable_for_sql(pair):
    # DuckDB 2.0 refuses con.sql() after an execute() whose result was read with fetchone()
    from gates.records import GateRules, _find_baseline, resolve_run_id

    current, _ = pair
    with Warehouse(current).read() as con:
        assert resolve_run_id(con, "r-b") == "r-b"
        assert con.sql("SELECT count(*) FROM runs").fetchall() == [(3,)]
        later = T0 + timedelta(days=5)
        # the columns evaluate_gate reads from `runs` for the run being gated
        run = {"task": "t", "model": "m", "run_id": "r-b", "created": later,
               "first_ingested_at": later}  # fmt: skip
        assert _find_baseline(con, run, GateRules()) == (None, None)
        assert con.sql("SELECT count(*) FROM runs").fetchall() == [(3,)]
