"""The report reads at one run and at two hundred: what headless chromium DRAWS is checked.

The warehouses are written straight into their tables (tests/report_world.py); the report is
the real `gradebook report`; the page is drawn by Debian's chromium, and a script measures the
drawn chart: how many points, where the titles, the verifier-change markers and the tick
labels are, and what the ticks say.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import report_world
from browser_kit import WAIT_FOR, measure, need_chromium, screenshot
from typer.testing import CliRunner

from flows.cli import app

pytestmark = pytest.mark.slow

WIDTH = 1400

# Everything the assertions need, read off the drawn SVG (and plotly's data bound to it).
MEASURE = (
    WAIT_FOR
    + """
await waitFor(() => document.body.dataset.charts === "drawn", "the charts");
const box = (el) => { const r = el.getBoundingClientRect();
  return {x0: r.left, x1: r.right, y0: r.top, y1: r.bottom, w: r.width, h: r.height}; };
const gd = document.getElementById("history-chart");
const traces = [...gd.querySelectorAll("g.trace.scatter")].map((el) => ({
  meta: el.__data__[0].trace.meta,
  subplot: el.__data__[0].trace.xaxis,
  points: [...el.querySelectorAll("path.point")].map(box),
}));
const titles = [...gd.querySelectorAll("g.annotation")].map((el) => ({
  text: el.textContent, ...box(el.querySelector("text")) }));
const ticks = {};
for (const cls of ["xtick", "x2tick"]) {
  ticks[cls] = [...gd.querySelectorAll("g." + cls + " text")].map((el) => ({
    text: [...el.querySelectorAll("tspan")].map((t) => t.textContent).join(" | ")
          || el.textContent, ...box(el) }));
}
const plots = [...gd.querySelectorAll("g.cartesianlayer > g.subplot")].map((el) =>
  box(el.querySelector("rect.nsewdrag") || el));
const full = gd._fullLayout;
return {traces, titles, ticks, plots,
        ranges: [full.xaxis.range, full.xaxis2 ? full.xaxis2.range : null],
        coverageBars: document.querySelectorAll("#coverage-chart g.point").length,
        bytes: document.documentElement.outerHTML.length};
"""
)


def _report(world: report_world.World, out: Path) -> Path:
    res = CliRunner().invoke(app, ["report", "--db", str(world.db), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _overlap(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def _assert_apart(boxes: list[dict], what: str) -> None:
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not _overlap(a, b), f"{what} overlap: {a} and {b}"


def _assert_readable_layout(drawn: dict) -> None:
    """Titles, change markers and tick labels never overlap one another."""
    titles = drawn["titles"]
    markers = [p for t in drawn["traces"] if t["meta"] == "changes" for p in t["points"]]
    _assert_apart(titles, "chart titles")
    for t in titles:
        for m in markers:
            assert not _overlap(t, m), f"change marker over title {t['text']!r}"
    for axis, labels in drawn["ticks"].items():
        _assert_apart(labels, f"{axis} tick labels")
        assert 3 <= len(labels) <= 15, (axis, [x["text"] for x in labels])
        for t in titles:
            for label in labels:
                assert not _overlap(t, label), f"tick {label['text']!r} over title {t['text']!r}"
    by_subplot: dict[str, list[dict]] = {}
    for t in drawn["traces"]:
        if t["meta"] == "changes":
            by_subplot.setdefault(t["subplot"], []).extend(t["points"])
    for subplot, points in by_subplot.items():
        _assert_apart(points, f"change markers of {subplot}")


def _span(drawn: dict) -> timedelta:
    start, end = (datetime.fromisoformat(v.replace(" ", "T")) for v in drawn["ranges"][0])
    return end - start


def _points(drawn: dict, meta: str) -> int:
    return sum(len(t["points"]) for t in drawn["traces"] if t["meta"] == meta)


def test_one_run_per_task_and_model_reads_on_an_axis_of_minutes(tmp_path: Path) -> None:
    need_chromium()
    world = report_world.build(
        tmp_path, nights=1, models=["ckpt-a", "ckpt-b"], tasks=["arith", "algebra"]
    )
    out = _report(world, tmp_path / "one-run.html")
    page = out.read_text(encoding="utf-8")
    assert "4 runs of 2 tasks × 2 models" in page
    assert 'id="one-run"' in page  # says why there is no line yet

    drawn = measure(out, MEASURE, width=WIDTH, height=1600, profile=tmp_path / "p1")
    # one dot per (task, model): 2 per task chart, 4 in all, none faded
    assert _points(drawn, "strict") == 4
    assert _points(drawn, "strict-older") == 0
    assert sorted(t["text"] for t in drawn["titles"]) == ["algebra", "arith"]
    # an axis of about an hour around the runs (was a whole day), ticked in minutes
    assert timedelta(minutes=30) <= _span(drawn) <= timedelta(hours=2)
    for label in drawn["ticks"]["xtick"]:
        assert re.match(r"^\d\d:\d\d", label["text"]), label["text"]
    _assert_readable_layout(drawn)
    assert drawn["coverageBars"] >= 4

    screenshot(
        out.as_uri(),
        tmp_path / "report-1-run.png",
        width=WIDTH,
        height=1400,
        profile=tmp_path / "p2",
        min_colours=200,
    )


def test_two_hundred_runs_read_on_a_date_axis_with_every_change_marked(tmp_path: Path) -> None:
    need_chromium()
    nights = 50
    world = report_world.build(
        tmp_path, nights=nights, models=["ckpt-a", "ckpt-b"], tasks=["arith", "algebra"]
    )
    assert len(world.runs) == 200
    out = _report(world, tmp_path / "history.html")
    page = out.read_text(encoding="utf-8")
    assert "200 runs of 2 tasks × 2 models" in page
    # the page is smaller than plotly.js alone (4.8 MB): it is inlined compressed
    assert out.stat().st_size < 3_000_000

    drawn = measure(out, MEASURE, width=WIDTH, height=2400, profile=tmp_path / "p1")
    # every run is drawn once under the current verifier (C re-graded them all) ...
    assert _points(drawn, "strict") == 200
    # ... and faded under the older versions that graded it: A (before the second edit), B
    # (the edit that was reverted: every run up to it)
    a_runs = sum(r.night < int(nights * 0.8) for r in world.runs)
    b_runs = sum(r.night <= int(nights * 0.6) for r in world.runs)
    assert _points(drawn, "strict-older") == a_runs + b_runs
    # three changes; the edit and its revert 40 s apart share one marker: 2 per task chart
    assert _points(drawn, "changes") == 2 * 2
    assert (world.revert_at - world.edit_at) < timedelta(minutes=1)
    # the axis spans the 50 nights, ticked in dates
    assert timedelta(days=49) <= _span(drawn) <= timedelta(days=60)
    for label in drawn["ticks"]["xtick"] + drawn["ticks"]["x2tick"]:
        assert re.match(r"^(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d", label["text"])
    _assert_readable_layout(drawn)

    # the changes table and the per-sample flips under each change, the revert marked
    changes = page[
        page.index('<table id="changes">') : page.index(
            "</table>", page.index('<table id="changes">')
        )
    ]
    assert changes.count("<tr>") == 4  # header + 3 changes
    assert "revert to" in changes
    flips = page[page.index("Samples that flipped") :]
    assert len(re.findall(r'<details id="flips-\d"', flips)) == 3
    assert "(revert)" in flips and "wrong → right" in flips and "right → wrong" in flips

    screenshot(
        out.as_uri(),
        tmp_path / "report-200-runs.png",
        width=WIDTH,
        height=1800,
        profile=tmp_path / "p2",
        min_colours=200,
    )
