"""`gradebook score` reports every log (and sample) it could not read, one line each, exits 2,
and still scores everything it could read: the good logs, and a damaged log's readable samples.
Its Prefect flow run ends Failed, as the command does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warehouse_logs import bomb_member, damage_member, lie_about_size, make_log, truncated, variant

from warehouse import Warehouse

GRADEBOOK = [sys.executable, "-m", "flows.cli"]


@pytest.mark.slow
def test_score_names_unreadable_logs_and_samples_and_scores_the_rest(prefect_api, tmp_path):
    base = make_log(tmp_path / "logs")  # 6 samples x 2 epochs
    good = base.location
    damaged = damage_member(
        variant(base, tmp_path / "d.eval", eval_id="damaged-run"),
        tmp_path / "corrupt-member.eval",
        "samples/q2_epoch_1.json",
    )
    cut = truncated(variant(base, tmp_path / "t.eval", eval_id="cut-run"), tmp_path / "trunc.eval")
    db = tmp_path / "g.duckdb"

    proc = subprocess.run(
        [*GRADEBOOK, "score", good, str(cut), str(damaged), "--db", str(db), "--verifier", "math"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in proc.stderr.splitlines() if line.strip()], proc.stderr
    assert errors[0].startswith(f"error: {cut}: unreadable Inspect log (")
    assert errors[1].startswith(f"error: {damaged}: sample q2 epoch 1: unreadable (")
    assert errors[2].startswith(f"error: {damaged}: 1 unreadable sample(s); 11 stored")
    assert len(errors) == 3

    wh = Warehouse(db)
    with wh.read() as con:
        runs = con.execute("SELECT run_id, ingest_state, n_samples FROM runs ORDER BY 1").fetchall()
        scored = con.execute(
            "SELECT run_id, count(*) FROM scores WHERE scorer = 'math' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert runs == sorted([(base.eval.eval_id, "complete", 12), ("damaged-run", "partial", 11)])
    assert scored == sorted([(base.eval.eval_id, 12), ("damaged-run", 11)])
    # the command failed (exit 2): so did its run, in the Prefect UI
    [run] = _score_runs(tmp_path)
    assert run.state_type.value == "FAILED", run.state


@pytest.mark.slow
def test_a_directory_of_one_truncated_log_is_one_line_and_a_failed_run(prefect_api, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    cut = truncated(Path(make_log(tmp_path / "made").location), logs / "copied-half-way.eval")
    proc = subprocess.run(
        [*GRADEBOOK, "score", str(logs), "--db", str(tmp_path / "g.duckdb"), "--verifier", "math"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # what it could not read, and nothing else: no empty "scores written" table before it
    assert proc.stdout.strip() == "", proc.stdout
    [line] = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith(f"error: {cut}: unreadable Inspect log ("), line
    [run] = _score_runs(tmp_path)
    assert run.state_type.value == "FAILED"
    assert str(cut) in run.state.message


def _score_runs(where: Path) -> list:
    """The latest `score` flow runs whose parameters name `where` (the session's server holds
    other tests' runs too)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["score"])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=20,
        )
    return [r for r in runs if str(where) in json.dumps(r.parameters)]


@pytest.mark.slow
def test_score_refuses_zip_bombs_in_one_line_and_scores_the_rest(prefect_api, tmp_path):
    # a sample that inflates to 1.5 GB (its directory entry lying about it), and a log whose
    # header does: each refused in one line, everything else ingested and scored
    base = make_log(tmp_path / "logs")
    good = base.location
    bomb = "samples/q2_epoch_1.json"
    sample_bomb = lie_about_size(
        bomb_member(variant(base, tmp_path / "s.eval", eval_id="sample-bomb-run"),
                    tmp_path / "sample-bomb.eval", bomb, 3 << 29),
        bomb, 5000,
    )  # fmt: skip
    header_bomb = bomb_member(variant(base, tmp_path / "h.eval", eval_id="header-bomb-run"),
                              tmp_path / "header-bomb.eval", "header.json", 3 << 29)  # fmt: skip
    db = tmp_path / "g.duckdb"

    proc = subprocess.run(
        [*GRADEBOOK, "score", good, str(header_bomb), str(sample_bomb), "--db", str(db),
         "--verifier", "math"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors[0].startswith(f"error: {header_bomb}: refused (header.json declares 1,536 MB")
    assert errors[1].startswith(f"error: {sample_bomb}: sample q2 epoch 1: refused ({bomb} ")
    assert "(a zip bomb?)" in errors[1]
    assert errors[2].startswith(f"error: {sample_bomb}: 1 refused sample(s); 11 stored")
    assert len(errors) == 3, errors

    with Warehouse(db).read() as con:
        scored = con.execute(
            "SELECT run_id, count(*) FROM scores WHERE scorer = 'math' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert scored == sorted([(base.eval.eval_id, 12), ("sample-bomb-run", 11)])
