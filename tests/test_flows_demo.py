"""`gradebook demo` end to end: two model versions that differ, a warehouse, gates, next steps."""

from __future__ import annotations

import os

import pytest

from flows.demo import DEMO_MODELS, _docker_available, run_demo
from warehouse import Warehouse


@pytest.mark.slow
def test_demo_runs_both_versions_and_tasks_and_explains_the_sandbox(
    prefect_api, tmp_path, capsys, monkeypatch
):
    # the demo points Inspect at its own server only while it runs: the caller's settings survive
    monkeypatch.setenv("LOCAL_API_KEY", "caller-key")
    monkeypatch.delenv("LOCAL_BASE_URL", raising=False)
    code = run_demo(tmp_path)
    out = capsys.readouterr().out
    assert code == 0
    assert os.environ["LOCAL_API_KEY"] == "caller-key" and "LOCAL_BASE_URL" not in os.environ
    with Warehouse(tmp_path / "demo.duckdb").read() as con:
        acc = dict(
            con.execute(
                "SELECT model, accuracy FROM run_metrics WHERE scorer = 'math' ORDER BY model"
            ).fetchall()
        )
        code_rows = con.execute(
            "SELECT status, reason, count(*) FROM scores WHERE scorer = 'unit_tests' GROUP BY ALL"
        ).fetchall()
        gates = con.execute("SELECT count(*) FROM gates").fetchone()[0]
    assert len(acc) == len(DEMO_MODELS)
    assert len(set(acc.values())) == 2  # the two versions answer differently
    assert gates == 2 * (1 + bool(code_rows))
    if code_rows and not _docker_available():
        assert code_rows == [("unscored", "sandbox_unavailable", 20)]
        assert "Docker Engine not reachable" in out and "make services" in out
    assert "gradebook rescore --db" in out and "grade_flips" in out
    assert (tmp_path / "demo.toml").read_text().startswith('name = "demo"')
