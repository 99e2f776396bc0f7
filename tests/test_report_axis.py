"""The score-history chart of a single run has a readable time axis, not a sub-millisecond one."""

from __future__ import annotations

import json
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
    [figures] = re.findall(r'data-chart="history-chart-1">(.*?)</script>', html)
    # on the time axis (the page's toggle), an hour around the run: nothing to fit
    start, end = json.loads(figures)["time"]["layout"]["xaxis"]["range"]
    span = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    assert span >= timedelta(hours=1)
