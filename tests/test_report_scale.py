"""The report reads at one run, at one model, at ten models, at two hundred and five hundred
runs: what headless chromium DRAWS is checked.

The warehouses are written straight into their tables (tests/report_world.py); the report is
the real `gradebook report`; the page is drawn by Debian's chromium, and a script measures the
drawn history charts: where each run's points are, what each chart's legend lists, each
model's colour and marker, where the titles, the verifier-change markers and the tick labels
are, what the ticks say, and whether the page is wider than the window.
"""

from __future__ import annotations

import math
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
MARGIN = 24  # the page's body margin (px)
LINE_PX = 11  # a line of tick-label text
CHECKPOINTS = [f"ckpt-{100 * (i + 1)}" for i in range(8)]


def _measure_script(x_axis: str | None) -> str:
    """Everything the assertions need, read off the drawn SVG (and plotly's data bound to it),
    after switching the history's x-axis to `x_axis` with the page's toggle (None: as opened)."""
    return (
        WAIT_FOR
        + f"const mode = {x_axis!r};".replace("None", "null")
        + """
await waitFor(() => document.body.dataset.charts === "drawn", "the charts");
if (mode) {
  const input = document.querySelector('input[name="x-axis"][value="' + mode + '"]');
  if (!input) throw new Error("the page has no x-axis toggle for " + mode);
  input.click();
  await waitFor(() => document.body.dataset.xaxis === mode, "the " + mode + " axis");
}
const box = (el) => { const r = el.getBoundingClientRect();
  return {x0: r.left, x1: r.right, y0: r.top, y1: r.bottom, w: r.width, h: r.height}; };
// which run a point is: its customdata (the report's hover), or the run its hover text names
const run = (t, i) => t.customdata ? t.customdata[i][0]
  : (((t.hovertext || [])[i] || "").match(/run (\\S+?)<br>/) || [])[1] || null;
const charts = [...document.querySelectorAll(".js-plotly-plot")]
  .filter((gd) => gd.id.startsWith("history-chart"))
  .map((gd) => {
    const traces = [...gd.querySelectorAll("g.trace.scatter")].map((el) => {
      const t = el.__data__[0].trace;
      const points = [...el.querySelectorAll("path.point")];
      return {
        meta: t.meta, model: t.legendgroup, subplot: t.xaxis + t.yaxis,
        symbol: t.marker ? t.marker.symbol : null,
        fill: points.length ? getComputedStyle(points[0]).fill : null,
        points: points.map((p) => ({run: run(t, p.__data__.i), ...box(p)})),
      };
    });
    const ticks = {};
    for (const cls of ["xtick", "x2tick", "x3tick"]) {
      const labels = [...gd.querySelectorAll("g." + cls + " text")];
      if (labels.length) ticks[cls] = labels.map((el) => ({
        text: [...el.querySelectorAll("tspan")].map((t) => t.textContent).join(" | ")
              || el.textContent,
        angle: Number(((el.getAttribute("transform") || "").match(/rotate\\((-?[\\d.]+)/)
                       || [0, 0])[1]),
        ...box(el) }));
    }
    const full = gd._fullLayout;
    return {
      task: gd.dataset.task || null,
      box: box(gd),
      traces,
      ticks,
      legend: [...gd.querySelectorAll("g.legend g.traces")].map((el) => el.textContent),
      titles: [...gd.querySelectorAll("g.annotation text, g.g-gtitle text")].map((el) => ({
        text: el.textContent, ...box(el) })),
      plots: Object.fromEntries([...gd.querySelectorAll("g.cartesianlayer > g.subplot")]
        .map((el) => [el.classList[1], box(el.querySelector("rect.nsewdrag") || el)])),
      range: full.xaxis.range,
    };
  });
return {charts,
        coverageBars: document.querySelectorAll("#coverage-chart g.point").length,
        bytes: document.documentElement.outerHTML.length,
        pageWidth: document.documentElement.scrollWidth, window: window.innerWidth};
"""
    )


def _report(world: report_world.World, out: Path) -> Path:
    res = CliRunner().invoke(app, ["report", "--db", str(world.db), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _draw(out: Path, tmp_path: Path, x_axis: str | None = None, height: int = 1600) -> dict:
    profile = tmp_path / f"p-{x_axis or 'default'}-{height}"
    return measure(out, _measure_script(x_axis), width=WIDTH, height=height, profile=profile)


def _overlap(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def _assert_apart(boxes: list[dict], what: str) -> None:
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not _overlap(a, b), f"{what} overlap: {a} and {b}"


def _assert_labels_apart(labels: list[dict], axis: str) -> None:
    """Tick labels do not overlap. Rotated ones (plotly turns crowded names) have overlapping
    bounding boxes even when their text is apart: there, the gap between two neighbours
    across their slant is at least a line of text."""
    if not any(label["angle"] for label in labels):
        _assert_apart(labels, f"{axis} tick labels")
        return
    slant = abs(math.sin(math.radians(labels[0]["angle"])))
    centres = sorted((a["x0"] + a["x1"]) / 2 for a in labels)
    for a, b in zip(centres, centres[1:], strict=False):
        assert (b - a) * slant >= LINE_PX, f"{axis} tick labels {b - a:.0f} px apart"


def _assert_readable_layout(chart: dict, max_ticks: int = 15) -> None:
    """Titles, change markers and tick labels never overlap one another."""
    titles = chart["titles"]
    markers = [p for t in chart["traces"] if t["meta"] == "changes" for p in t["points"]]
    _assert_apart(titles, "chart titles")
    for t in titles:
        for m in markers:
            assert not _overlap(t, m), f"change marker over title {t['text']!r}"
    for axis, labels in chart["ticks"].items():
        _assert_labels_apart(labels, axis)
        assert 1 <= len(labels) <= max_ticks, (axis, [x["text"] for x in labels])
        for t in titles:
            for label in labels:
                assert not _overlap(t, label), f"tick {label['text']!r} over title {t['text']!r}"
    _assert_apart(markers, f"change markers of {chart['task']}")


def _span(chart: dict) -> timedelta:
    start, end = (datetime.fromisoformat(v.replace(" ", "T")) for v in chart["range"])
    return end - start


def _points(drawn: dict, meta: str) -> int:
    return sum(len(t["points"]) for c in drawn["charts"] for t in c["traces"] if t["meta"] == meta)


def _models_by_task(world: report_world.World) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in world.runs:
        out.setdefault(r.task, set()).add(r.model)
    return out


def _assert_one_chart_per_task_with_its_own_legend(drawn: dict, world: report_world.World):
    """One chart per task; each chart's legend lists the models on that chart, once each."""
    expected = _models_by_task(world)
    assert sorted(str(c["task"]) for c in drawn["charts"]) == sorted(expected)
    for chart in drawn["charts"]:
        assert sorted(chart["legend"]) == sorted(expected[chart["task"]]), chart["task"]


def _assert_one_look_per_model(drawn: dict) -> None:
    """Each model has one colour and marker, the same on every chart, and no two models on a
    chart share them."""
    looks: dict[str, set[tuple[str, str]]] = {}
    for chart in drawn["charts"]:
        on_chart: dict[tuple[str, str], str] = {}
        for t in chart["traces"]:
            if t["meta"] not in ("strict", "strict-older") or not t["points"]:
                continue
            look = (t["fill"], t["symbol"])
            looks.setdefault(t["model"], set()).add(look)
            other = on_chart.setdefault(look, t["model"])
            assert other == t["model"], f"{other} and {t['model']} look alike on {chart['task']}"
    for model, seen in looks.items():
        assert len(seen) == 1, f"{model} changes its look between charts: {seen}"


def _assert_runs_spread(chart: dict, share: float = 0.6, apart_px: float = 2.0) -> None:
    """The chart's runs are spread over its plot's width, not a sliver of it, and no two runs
    are drawn at the same x. n runs evenly spaced, each in the middle of its own n-th of the
    width, span (n - 1) / n of it: the runs must span `share` of that."""
    xs: dict[str, float] = {}
    for t in chart["traces"]:
        if t["meta"] in ("strict", "strict-older"):
            for p in t["points"]:
                xs.setdefault(p["run"], (p["x0"] + p["x1"]) / 2)
    [plot] = chart["plots"].values()
    assert len(xs) >= 2
    extent = max(xs.values()) - min(xs.values())
    assert extent >= share * plot["w"] * (len(xs) - 1) / len(xs), (
        f"{chart['task']}: {len(xs)} runs over {extent:.0f} of {plot['w']:.0f} px"
    )
    ordered = sorted(xs.values())
    closest = min(b - a for a, b in zip(ordered, ordered[1:], strict=False))
    assert closest >= apart_px, f"{chart['task']}: two runs {closest:.1f} px apart"


def _rows(drawn: dict) -> list[list[dict]]:
    """The charts grouped by the row of the page they are drawn in."""
    rows: list[list[dict]] = []
    for chart in sorted(drawn["charts"], key=lambda c: (c["box"]["y0"], c["box"]["x0"])):
        if rows and abs(rows[-1][0]["box"]["y0"] - chart["box"]["y0"]) < 2:
            rows[-1].append(chart)
        else:
            rows.append([chart])
    return rows


def _assert_stacked_full_width(drawn: dict) -> None:
    content = drawn["window"] - 2 * MARGIN
    for row in _rows(drawn):
        assert len(row) == 1, [c["task"] for c in row]
        assert row[0]["box"]["w"] >= 0.95 * content, row[0]["box"]


def _assert_small_multiples(drawn: dict) -> None:
    """Charts side by side in a grid, each a fraction of the page's width, none past it."""
    rows = _rows(drawn)
    assert max(len(r) for r in rows) >= 2, "no two charts side by side"
    for chart in drawn["charts"]:
        assert chart["box"]["w"] <= 0.6 * drawn["window"], chart["box"]


def _assert_within_the_window(drawn: dict) -> None:
    assert drawn["pageWidth"] <= drawn["window"], "the page scrolls sideways"
    for chart in drawn["charts"]:
        assert 0 <= chart["box"]["x0"] and chart["box"]["x1"] <= drawn["window"], chart["box"]


def test_one_run_per_task_and_model_reads_on_an_axis_fitted_to_it(tmp_path: Path) -> None:
    need_chromium()
    world = report_world.build(
        tmp_path, nights=1, models=["ckpt-a", "ckpt-b"], tasks=["arith", "algebra"]
    )
    out = _report(world, tmp_path / "one-run.html")
    page = out.read_text(encoding="utf-8")
    assert "4 runs of 2 tasks × 2 models" in page
    assert 'id="one-run"' in page  # says why there is no line yet

    drawn = _draw(out, tmp_path)
    # one dot per (task, model): 2 per task chart, 4 in all, none faded
    assert _points(drawn, "strict") == 4
    assert _points(drawn, "strict-older") == 0
    _assert_one_chart_per_task_with_its_own_legend(drawn, world)
    _assert_stacked_full_width(drawn)
    for chart in drawn["charts"]:
        assert [t["text"] for t in chart["titles"]] == [chart["task"]]
        # model order: the two models, named under their points, spread over the chart
        assert [t["text"] for t in chart["ticks"]["xtick"]] == ["ckpt-a", "ckpt-b"]
        _assert_runs_spread(chart)
        _assert_readable_layout(chart)
    assert drawn["coverageBars"] >= 4

    # on the time axis: fitted to the runs a minute apart, ticked in minutes and seconds
    timed = _draw(out, tmp_path, "time")
    for chart in timed["charts"]:
        assert _span(chart) <= timedelta(minutes=2)
        for label in chart["ticks"]["xtick"]:
            assert re.match(r"^\d\d:\d\d", label["text"]), label["text"]
        _assert_runs_spread(chart, share=0.8)
        _assert_readable_layout(chart)

    screenshot(
        out.as_uri(),
        tmp_path / "report-1-run.png",
        width=WIDTH,
        height=1400,
        profile=tmp_path / "p2",
        min_colours=200,
    )


def test_one_model_on_three_tasks_has_a_chart_and_a_legend_each(tmp_path: Path) -> None:
    """Names are shown as they are, wherever they are drawn: "%{...}" is a placeholder in
    plotly's legend, title and hover texts, "<b>" markup."""
    need_chromium()
    name, task = "ckpt 50%{y} <b>a</b>", "geometry %{x} <i>"
    world = report_world.build(tmp_path, nights=5, models=[name], tasks=["arith", "algebra", task])
    out = _report(world, tmp_path / "one-model.html")
    drawn = _draw(out, tmp_path)
    _assert_one_chart_per_task_with_its_own_legend(drawn, world)
    _assert_stacked_full_width(drawn)
    _assert_one_look_per_model(drawn)
    for chart in drawn["charts"]:
        assert [t["text"] for t in chart["titles"]] == [chart["task"]]
        assert chart["legend"] == [name]
        assert [t["text"] for t in chart["ticks"]["xtick"]] == [name]
        _assert_runs_spread(chart, share=0.7)
        _assert_readable_layout(chart)


def test_ten_models_on_three_tasks_read_as_accuracy_against_checkpoint(tmp_path: Path) -> None:
    """The issue's report: two models run every night, then a sweep of eight checkpoints
    (one of them not on every task), all on three tasks."""
    need_chromium()
    world = report_world.build(
        tmp_path,
        nights=10,
        models=["demo-v1", "demo-v2"],
        tasks=["arith", "algebra", "geometry"],
        sweep=CHECKPOINTS,
        sweep_skips={("ckpt-800", "geometry")},
    )
    assert len(world.models) == 10 and len(world.runs) == 83
    out = _report(world, tmp_path / "ten-models.html")

    drawn = _draw(out, tmp_path, height=1800)
    _assert_one_chart_per_task_with_its_own_legend(drawn, world)
    _assert_one_look_per_model(drawn)
    _assert_small_multiples(drawn)
    _assert_within_the_window(drawn)
    for chart in drawn["charts"]:
        # the x-axis names the models in the order they first ran: the checkpoints in order
        models = [m for m in world.models if m in _models_by_task(world)[chart["task"]]]
        assert [t["text"] for t in chart["ticks"]["xtick"]] == models
        _assert_runs_spread(chart)
        _assert_readable_layout(chart, max_ticks=10)
        # one point per checkpoint, left to right in checkpoint order
        at = {
            t["model"]: [(p["x0"] + p["x1"]) / 2 for p in t["points"]]
            for t in chart["traces"]
            if t["meta"] == "strict" and t["model"].startswith("ckpt-")
        }
        assert all(len(xs) == 1 for xs in at.values()), at
        assert sorted(at, key=lambda m: at[m][0]) == [m for m in models if m in at]

    timed = _draw(out, tmp_path, "time", height=1800)
    _assert_one_chart_per_task_with_its_own_legend(timed, world)
    _assert_one_look_per_model(timed)

    for name, anchor in (("report-10-models.png", ""), ("report-10-models-time.png", "#x=time")):
        screenshot(
            out.as_uri() + anchor,
            tmp_path / name,
            width=WIDTH,
            height=2400,
            profile=tmp_path / f"shot-{name}",
            min_colours=200,
        )


def test_five_hundred_runs_of_25_models_fit_the_window(tmp_path: Path) -> None:
    """25 models × 4 tasks × 5 nights: more models than colours, so markers tell them apart."""
    need_chromium()
    models = [f"ckpt-{100 * (i + 1)}" for i in range(25)]
    world = report_world.build(
        tmp_path, nights=5, models=models, tasks=["arith", "algebra", "geometry", "logic"]
    )
    assert len(world.runs) == 500
    out = _report(world, tmp_path / "500-runs.html")
    assert out.stat().st_size < 5_000_000

    drawn = _draw(out, tmp_path, height=2000)
    _assert_within_the_window(drawn)
    _assert_one_chart_per_task_with_its_own_legend(drawn, world)
    _assert_one_look_per_model(drawn)
    _assert_small_multiples(drawn)
    assert _points(drawn, "strict") == 500
    for chart in drawn["charts"]:
        assert [t["text"] for t in chart["ticks"]["xtick"]] == models
        _assert_runs_spread(chart, share=0.8)
        _assert_readable_layout(chart, max_ticks=25)

    # narrower: the grid folds to one column, still within the window
    narrow = measure(
        out, _measure_script(None), width=800, height=2000, profile=tmp_path / "p-narrow"
    )
    _assert_within_the_window(narrow)
    _assert_stacked_full_width(narrow)

    screenshot(
        out.as_uri(),
        tmp_path / "report-500-runs.png",
        width=WIDTH,
        height=5600,  # the coverage bars (a hundred) come first
        profile=tmp_path / "shot",
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

    # model order: each model's 50 nights in its own slot, the changes marked in each slot
    drawn = _draw(out, tmp_path, height=2400)
    _assert_one_chart_per_task_with_its_own_legend(drawn, world)
    _assert_stacked_full_width(drawn)
    for chart in drawn["charts"]:
        assert [t["text"] for t in chart["ticks"]["xtick"]] == ["ckpt-a", "ckpt-b"]
        _assert_runs_spread(chart, share=0.8)
        _assert_readable_layout(chart)
    # the edit and its revert 40 s apart fall between the same two nights: one marker per
    # slot; the second edit another: 2 per model, 2 models, 2 task charts
    assert _points(drawn, "changes") == 2 * 2 * 2

    timed = _draw(out, tmp_path, "time", height=2400)
    # every run is drawn once under the current verifier (C re-graded them all) ...
    assert _points(timed, "strict") == 200
    # ... and faded under the older versions that graded it: A (before the second edit), B
    # (the edit that was reverted: every run up to it)
    a_runs = sum(r.night < int(nights * 0.8) for r in world.runs)
    b_runs = sum(r.night <= int(nights * 0.6) for r in world.runs)
    assert _points(timed, "strict-older") == a_runs + b_runs
    # three changes; the edit and its revert 40 s apart share one marker: 2 per task chart
    assert _points(timed, "changes") == 2 * 2
    assert (world.revert_at - world.edit_at) < timedelta(minutes=1)
    for chart in timed["charts"]:
        # the axis spans the 50 nights, ticked in dates
        assert timedelta(days=49) <= _span(chart) <= timedelta(days=55)
        for label in chart["ticks"]["xtick"]:
            assert re.match(r"^(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d", label["text"])
        _assert_readable_layout(chart)

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

    for name, anchor in (("report-200-runs.png", ""), ("report-200-runs-time.png", "#x=time")):
        screenshot(
            out.as_uri() + anchor,
            tmp_path / name,
            width=WIDTH,
            height=1800,
            profile=tmp_path / f"shot-{name}",
            min_colours=200,
        )
