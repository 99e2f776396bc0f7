"""The HTML report from a real warehouse, rendered by headless Debian chromium."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from browser_kit import FLAGS, need_chromium
from gate_world import exact, ingest, lenient, outage_judge, run_eval, score_run
from inspect_ai.log import read_eval_log, write_eval_log
from PIL import Image
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.report.summary import collect_report
from gates.evaluate import evaluate_gates
from warehouse import Warehouse

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = [*FLAGS, "--window-size=1400,2000", "--virtual-time-budget=5000"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Warehouse]:
    root = tmp_path_factory.mktemp("report")
    wh = Warehouse(root / "g.duckdb")
    logs = root / "logs"
    # Two runs of one task, then a verifier change (v2 accepts "7.0" for 7) re-grades both.
    first = ingest(wh, run_eval(logs, ["0", "1", "2", "x", "4", "5", "6", "7.0"], task_name="hist"))
    second = ingest(
        wh, run_eval(logs, ["0", "1", "2", "3", "4", "x", "6", "7.0"], task_name="hist")
    )
    for rid in (first, second):
        score_run(wh, rid, exact, fingerprint="fp-v1")
    evaluate_gates(wh, [first, second], fingerprints={"exact": "fp-v1"})
    for rid in (first, second):
        score_run(wh, rid, lenient, fingerprint="fp-v2")
    # The outage: 20 right of 30, the judge fails on exactly the 10 wrong ones.
    outage = ingest(
        wh, run_eval(logs, [str(i) if i < 20 else "x" for i in range(30)], task_name="outage")
    )
    score_run(wh, outage, outage_judge, fingerprint="fp-v2")
    evaluate_gates(wh, [second, outage], fingerprints={"exact": "fp-v2"})
    out = root / "report.html"
    res = CliRunner().invoke(app, ["report", "--db", str(wh.path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, wh


def test_report_is_self_contained_and_shows_the_outage(report) -> None:
    out, _ = report
    html = out.read_text(encoding="utf-8")
    # no network: plotly.js inline (compressed), no external script or stylesheet
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<link[^>]+href=", html)
    assert 'id="plotly-js-gzip"' in html and "Plotly.newPlot" in html
    # both accuracies of the outage run, and its failing rule, in the gate table
    gates = html[html.index('<table id="gates">') : html.index("</table>")]
    row = next(r for r in gates.split("<tr>") if ">outage<" in r)
    assert ">fail<" in row
    assert "<td>0.667</td><td>1.000</td>" in row
    assert "max_unscored_rate[exact]" in row
    # the flip the verifier change caused: "7.0" was wrong under v1, right under v2
    flips = html[html.index('<details id="flips-') :]
    assert "fp-v1 → fp-v2" in flips
    assert "wrong → right" in flips and "<td>7.0</td>" in flips


def test_report_renders_in_headless_chromium(report, tmp_path: Path) -> None:
    chromium = need_chromium()
    out, _ = report
    png = tmp_path / "report.png"
    base = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run(
        [*base, f"--screenshot={png}", out.as_uri()], check=True, capture_output=True, timeout=120
    )
    dom = subprocess.run(
        [*base, "--dump-dom", out.as_uri()], check=True, capture_output=True, timeout=120, text=True
    ).stdout
    assert png.is_file() and png.stat().st_size > 20_000
    with Image.open(png) as img:
        assert img.size == (1400, 2000)
        colours = img.convert("RGB").getcolors(maxcolors=1_000_000) or []
    # A blank or error page has a handful of colours; charts and text have hundreds.
    assert len(colours) > 200
    # plotly drew: one main SVG per chart (coverage, history), with plotted paths in them
    svgs = re.findall(r'<svg class="main-svg"', dom)
    assert len(svgs) >= 2
    assert dom.count('class="point"') + dom.count('class="js-line"') > 5
    for div in ("coverage-chart", "history-chart"):
        start = dom.index(f'id="{div}"')
        assert "main-svg" in dom[start : start + 200_000], f"{div} has no svg"


def test_runs_started_in_the_same_second_show_the_one_ingested_last(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "g.duckdb")
    # Inspect stamps `created` to the second, so two runs of one sweep can carry the same one.
    # The eval ids sort against ingest order, so a run-id tie-break alone picks the wrong run.
    plan = [("zz-ingested-first", ["0", "1", "2"]), ("aa-ingested-last", ["0", "x", "x"])]
    created, runs = None, []
    for eval_id, answers in plan:
        log = read_eval_log(str(run_eval(tmp_path / "logs", answers, task_name="tie")))
        created = created or log.eval.created
        log.eval.eval_id, log.eval.created = eval_id, created
        write_eval_log(log, str(tmp_path / f"{eval_id}.eval"))
        runs.append(ingest(wh, tmp_path / f"{eval_id}.eval"))
        score_run(wh, runs[-1], exact)
    first, last = runs
    with wh.read() as con:
        assert con.sql("SELECT count(DISTINCT created) FROM runs").fetchall() == [(1,)]
        data = collect_report(con)
    [coverage] = data.coverage
    assert (coverage.run_id, coverage.n_correct) == (last, 1)
    # the history line ends on the run ingested last
    assert [p.run_id for p in data.history] == [first, last]
