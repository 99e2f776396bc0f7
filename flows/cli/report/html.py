"""Render the score-history report: one self-contained HTML file that opens offline.

Pure rendering from `ReportData` (flows/cli/report/data.py); the queries that fill it live in
flows/cli/report/summary.py, the charts in flows/cli/report/charts.py. Every string that came
from a model or a log is escaped here: model output is hostile, and a report is opened in a
browser.

Why the page is the size it is: plotly.js is 4.8 MB minified, the bulk of any page that inlines
it (the data of a few hundred runs is a few hundred kilobytes). It is inlined gzip-compressed and
base64-encoded (about 2 MB) and unpacked by the browser's own `DecompressionStream`, so the page
still needs no network and no server, and always carries the plotly.js of the installed plotly.
"""

from __future__ import annotations

import base64
import gzip
import html
from collections import defaultdict
from functools import cache

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from flows.cli.report.charts import (
    DISTINCT_LOOKS,
    SMALL_MULTIPLES_AFTER,
    X_MODES,
    HistoryChart,
    coverage_figure,
    history_charts,
    models_in_order,
)
from flows.cli.report.data import ReportData

__all__ = ["render_report"]

_VERDICT_CLASS = {"pass": "pass", "fail": "fail", "cannot_evaluate": "na"}
_X_LABELS = {"models": "model order", "time": "time"}


def _short(fp: str) -> str:
    return fp[:10]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _figure_html(fig: go.Figure | None, div_id: str, empty: str) -> str:
    """A chart's div and its figure as JSON; the loader at the end of the page draws it."""
    if fig is None:
        return f'<p class="empty">{html.escape(empty)}</p>'
    # plotly's JSON escapes "<" and ">", so no string in it can close the script element
    return (
        f'<div id="{div_id}" class="chart"></div>'
        f'<script type="application/json" data-chart="{div_id}">{fig.to_json()}</script>'
    )


def _gates_table(data: ReportData) -> str:
    if not data.gates:
        return (
            '<p class="empty">No gate has been evaluated yet: run <code>gradebook gate</code>.</p>'
        )
    head = (
        "<tr><th>verdict</th><th>task</th><th>model</th><th>run</th><th>accuracy (strict)</th>"
        "<th>accuracy (over scored)</th><th>failing rules</th><th>evaluated</th></tr>"
    )
    rows = []
    for g in sorted(data.gates, key=lambda g: (g.task, g.model)):
        cls = _VERDICT_CLASS.get(g.verdict, "na")
        rows.append(
            "<tr>"
            f'<td class="{cls}">{html.escape(g.verdict)}</td>'
            f"<td>{html.escape(g.task)}</td><td>{html.escape(g.model)}</td>"
            f"<td><code>{html.escape(g.run_id)}</code></td>"
            f"<td>{_pct(g.accuracy_strict)}</td><td>{_pct(g.accuracy)}</td>"
            f"<td>{html.escape('; '.join(g.failing)) or '–'}</td>"
            f"<td>{g.created:%Y-%m-%d %H:%M}</td>"
            "</tr>"
        )
    return f'<table id="gates">{head}{"".join(rows)}</table>'


def _verdict(value: float | None, status: str) -> str:
    if status != "scored" or value is None:
        return status
    return {1.0: "right", 0.0: "wrong"}.get(value, f"{value:g}")


def _changes_table(data: ReportData) -> str:
    if not data.fingerprint_changes:
        return ""
    head = (
        "<tr><th>#</th><th>when</th><th>verifier</th><th>change</th><th>label</th>"
        "<th>samples flipped</th></tr>"
    )
    rows = []
    for i, c in enumerate(data.fingerprint_changes, start=1):
        kind = "revert to" if c.revert else "edit to"
        when = f"{c.registered:%Y-%m-%d %H:%M:%S}" if c.registered else "–"
        if c.n_both:
            flips = f'<a href="#flips-{i}">{c.n_flips}</a>'
        else:
            flips = "not re-scored yet (<code>gradebook rescore</code>)"
        rows.append(
            f"<tr><td>{i}</td><td>{when}</td><td>{html.escape(c.scorer)}</td>"
            f"<td><code>{html.escape(_short(c.previous or '?'))}</code> → {kind} "
            f"<code>{html.escape(_short(c.fingerprint))}</code></td>"
            f"<td>{html.escape(c.label) or '–'}</td><td>{flips}</td></tr>"
        )
    return (
        '<p class="meta">Each ▼ on the charts is a verifier change; hover it, or read it here.</p>'
        f'<table id="changes">{head}{"".join(rows)}</table>'
    )


def _flips_section(data: ReportData) -> str:
    """Per verifier change, the samples whose verdict it changed (newest change first)."""
    numbered = [(i, c) for i, c in enumerate(data.fingerprint_changes, start=1) if c.n_both]
    if not numbered:
        return (
            '<p class="empty">No verifier change has been re-scored yet, so no verdict has '
            "changed (<code>gradebook rescore</code> grades the saved samples again).</p>"
        )
    parts = []
    for i, c in reversed(numbered):
        summary = (
            f"#{i} {html.escape(c.scorer)}: {html.escape(_short(c.previous or '?'))} → "
            f"{html.escape(_short(c.fingerprint))}{' (revert)' if c.revert else ''}"
            f"{f' on {c.registered:%Y-%m-%d %H:%M}' if c.registered else ''}: "
            f"{c.n_flips} of {c.n_both} samples flipped"
        )
        if not c.flips:
            parts.append(f'<details id="flips-{i}"><summary>{summary}</summary></details>')
            continue
        head = (
            "<tr><th>task</th><th>model</th><th>run</th><th>sample</th><th>epoch</th>"
            "<th>before → after</th><th>answer before</th><th>answer after</th>"
            "<th>explanation after</th></tr>"
        )
        rows = []
        for f in c.flips:
            before, after = _verdict(f.old_value, f.old_status), _verdict(f.new_value, f.new_status)
            rows.append(
                "<tr>"
                f"<td>{html.escape(f.task)}</td><td>{html.escape(f.model)}</td>"
                f"<td><code>{html.escape(f.run_id)}</code></td>"
                f"<td>{html.escape(f.sample_id)}</td><td>{f.epoch}</td>"
                f'<td class="flip-{after}">{before} → {after}</td>'
                f"<td>{html.escape(_clip(f.old_answer))}</td>"
                f"<td>{html.escape(_clip(f.new_answer))}</td>"
                f"<td>{html.escape(_clip(f.new_explanation, 160))}</td>"
                "</tr>"
            )
        more = ""
        if c.n_flips > len(c.flips):
            scorer, new, old = (_sql(x) for x in (c.scorer, c.fingerprint, c.previous or ""))
            query = (
                f"SELECT * FROM grade_flips WHERE scorer = {scorer} AND "
                f"{new} IN (old_fingerprint, new_fingerprint) AND "
                f"{old} IN (old_fingerprint, new_fingerprint)"
            )
            more = (
                f'<p class="meta">… and {c.n_flips - len(c.flips)} more: '
                f"<code>gradebook sql &quot;{html.escape(query)}&quot;</code></p>"
            )
        opened = " open" if i == numbered[-1][0] else ""
        parts.append(
            f'<details id="flips-{i}"{opened}><summary>{summary}</summary>'
            f'<table class="flips">{head}{"".join(rows)}</table>{more}</details>'
        )
    return "".join(parts)


def _sql(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _clip(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "–"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _overview(data: ReportData) -> str:
    runs = {p.run_id for p in data.history}
    if not runs:
        return ""
    tasks = {p.task for p in data.history}
    models = {p.model for p in data.history}
    first = min(p.created for p in data.history)
    last = max(p.created for p in data.history)
    span = f"{first:%Y-%m-%d %H:%M}" + (f" to {last:%Y-%m-%d %H:%M}" if last != first else "")
    n = len(data.fingerprint_changes)
    return (
        f'<p class="meta" id="overview">{len(runs)} run{"s" if len(runs) != 1 else ""} of '
        f"{len(tasks)} task{'s' if len(tasks) != 1 else ''} × {len(models)} "
        f"model{'s' if len(models) != 1 else ''}, {span}; {n} verifier "
        f"change{'s' if n != 1 else ''}</p>"
    )


def _history_note(data: ReportData) -> str:
    runs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for p in data.history:
        runs[(p.task, p.model)].add(p.run_id)
    if runs and max(len(r) for r in runs.values()) == 1:
        return (
            '<p class="meta" id="one-run">Each task × model has one run so far: one point '
            "per model; a model's line starts with its second run.</p>"
        )
    return ""


def _history_section(data: ReportData, charts: list[HistoryChart]) -> str:
    """The x-axis toggle and one chart per task (each carrying a figure per x-axis mode); past
    a handful of models, the charts sit side by side as small multiples."""
    if not charts:
        return '<p class="empty">No score history yet.</p>'
    models = models_in_order(data.history)
    toggle = "".join(
        f'<label><input type="radio" name="x-axis" value="{m}"'
        f"{' checked' if m == X_MODES[0] else ''}> {_X_LABELS[m]}</label>"
        for m in X_MODES
    )
    note = ""
    if len(models) > DISTINCT_LOOKS:
        note = (
            f'<p class="meta" id="looks-repeat">{len(models)} models: more than the '
            f"{DISTINCT_LOOKS} distinct colour × marker pairs, so some models share a look; "
            "hover a point for its model.</p>"
        )
    layout = "grid" if len(models) > SMALL_MULTIPLES_AFTER else "stack"
    divs = []
    for i, chart in enumerate(charts, start=1):
        figures = ",".join(f'"{m}":{fig.to_json()}' for m, fig in chart.figures.items())
        div_id = f"history-chart-{i}"
        divs.append(
            f'<div id="{div_id}" class="chart" data-task="{html.escape(chart.task)}"></div>'
            f'<script type="application/json" data-chart="{div_id}">{{{figures}}}</script>'
        )
    return (
        f'<fieldset class="x-axis"><legend>x-axis:</legend>{toggle}</fieldset>{note}'
        f'<div id="history-chart" class="charts {layout}">{"".join(divs)}</div>'
    )


@cache
def _plotly_gzip_b64() -> str:
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), mtime=0)).decode()


# Unpack plotly.js (gzip, base64) with the browser's own DecompressionStream, then draw every
# chart whose figure the page carries. A history chart carries one figure per x-axis mode: the
# toggle (or the address's #x=time) picks one. `document.body.dataset.charts` says when the
# page is drawn, `dataset.xaxis` which mode the history charts show.
_LOADER = """
(async () => {
  const packed = document.getElementById("plotly-js-gzip").textContent;
  const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const code = await new Response(stream).text();
  const tag = document.createElement("script");
  tag.textContent = code;
  document.head.appendChild(tag);
  const config = {responsive: true, displaylogo: false};
  const modal = [];
  for (const el of document.querySelectorAll("script[data-chart]")) {
    const fig = JSON.parse(el.textContent);
    if (fig.data) await Plotly.newPlot(el.dataset.chart, fig.data, fig.layout, config);
    else modal.push([el.dataset.chart, fig]);
  }
  const inputs = [...document.querySelectorAll('input[name="x-axis"]')];
  const modes = inputs.map((i) => i.value);
  const draw = async (mode) => {
    for (const [id, figs] of modal) await Plotly.react(id, figs[mode].data, figs[mode].layout, config);
    for (const i of inputs) i.checked = i.value === mode;
    document.body.dataset.xaxis = mode;
  };
  const asked = (location.hash.match(/x=(\\w+)/) || [])[1];
  await draw(modes.includes(asked) ? asked : modes[0]);
  for (const i of inputs) {
    i.addEventListener("change", () => {
      try { history.replaceState(null, "", "#x=" + i.value); } catch (e) { /* file: URL */ }
      draw(i.value);
    });
  }
  document.body.dataset.charts = "drawn";
})().catch((err) => {
  document.body.dataset.charts = "failed";
  for (const el of document.querySelectorAll("div.chart")) {
    el.innerHTML = '<p class="empty">This browser could not draw the chart (' +
      String(err).replace(/[<&]/g, "") + '): it needs DecompressionStream (Chrome 80, ' +
      'Firefox 113, Safari 16.4 or newer). The tables are complete.</p>';
  }
});
"""

_CSS = """
body{font-family:system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:24px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}caption{text-align:left;color:#555;padding:4px 0}
td.pass{background:#d9f2e4;font-weight:bold}td.fail{background:#f8d7d3;font-weight:bold}
td.na{background:#fdebc8;font-weight:bold}.empty{color:#777;font-style:italic}
td.flip-right{background:#d9f2e4}td.flip-wrong{background:#f8d7d3}
td.flip-unscored,td.flip-error{background:#fdebc8}
details{margin:.4em 0}summary{cursor:pointer}
.meta{color:#666;font-size:.9em}code{font-size:.9em}
fieldset.x-axis{border:0;padding:0;margin:.4em 0;font-size:.9em}
fieldset.x-axis legend{float:left;padding:0 .5em 0 0}fieldset.x-axis label{margin-right:1em}
.charts.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(560px,100%),1fr));
gap:12px 20px}.charts>.chart{min-width:0;margin-bottom:8px}
"""


def render_report(data: ReportData) -> str:
    """The whole report as one HTML document that needs no server and no network."""
    generated = f"{data.generated:%Y-%m-%d %H:%M %Z}" if data.generated else ""
    history = history_charts(data)
    coverage = coverage_figure(data.coverage, models_in_order(data.history))
    sections = [
        "<h2>Latest gate verdicts</h2>",
        _gates_table(data),
        "<h2>Coverage of the newest run per task × model</h2>",
        '<p class="meta">Accuracy is only meaningful next to coverage: unscored and errored '
        "samples count as wrong in the strict accuracy.</p>",
        _figure_html(coverage, "coverage-chart", "No scored run yet."),
        "<h2>Score history</h2>",
        '<p class="meta">One chart per task; each model keeps its colour (and marker) on every '
        "chart. x-axis: the models in the order they first ran, each model's runs oldest to "
        "newest in its own slot, or (toggle) the time each run was created. Solid: strict "
        "accuracy (correct / samples); dotted, where it differs: accuracy over scored samples. "
        "Faded: grades by an older version of the verifier. ▼ (and a dashed line, on a chart "
        "with few): the verifier's code changed (an edit or a revert) between two runs.</p>",
        _history_note(data),
        _history_section(data, history),
        _changes_table(data),
        "<h2>Samples that flipped at each verifier change</h2>",
        _flips_section(data),
    ]
    charts = bool(history) or coverage is not None
    loader = (
        f'<script id="plotly-js-gzip" type="application/octet-stream">{_plotly_gzip_b64()}'
        f"</script><script>{_LOADER}</script>"
        if charts
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(data.title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(data.title)}</h1>"
        f'<p class="meta">warehouse {html.escape(data.warehouse)} · generated {generated}</p>'
        + _overview(data)
        + "".join(sections)
        + loader
        + "</body></html>\n"
    )
