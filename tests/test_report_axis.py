"""The score-history chart of a single run has a readable time axis, not a sub-millisecond one."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from gate_world import exact, ingest, run_eval, score_run
from typer.testing import CliRunner

from flows.cli import app
from warehouse import Warehouse


def test_a_single_runs_history_spans_hours_not_microseconds(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "one.duckdb")
    run = ingest(wh, run_eval(tmp_path / "logs", ["0", "1", "x"], task_name="once"))
    score_run(wh, run, exact)
    out = tmp_path / "report.html"
    res = CliRunner().invoke(app, ["report", "--db", str(wh.path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    history = html[html.index('"history-chart"') :]
    [(start, end)] = re.findall(r'"xaxis":\{[^}]*"range":\["([^"]+)","([^"]+)"\]', history)[:1]
    span = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    assert span >= timedelta(hours=1)
