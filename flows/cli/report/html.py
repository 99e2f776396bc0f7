"""Render the score-history report: one self-contained HTML file that opens offline.

Pure rendering from `ReportData`; the queries that fill it live in flows/cli/report/summary.py. Every
string that came from a model or a log is escaped here: model output is hostile, and a
report is opened in a browser.

Why the page is the size it is: plotly.js is 4.8 MB minified, the bulk of any page that inlines
it (the data of a few hundred runs is tens of kilobytes). It is inlined gzip-compressed and
base64-encoded (about 2 MB) and unpacked by the browser's own `DecompressionStream`, so the page
still needs no network and no server, and always carries the plotly.js of the installed plotly.
"""

from __future__ import annotations

import base64
import gzip
import html
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

__all__ = [
    "CoverageRow",
    "FingerprintChange",
    "FlipRow",
    "GateRow",
    "HistoryPoint",
    "ReportData",
    "render_report",
]

# Okabe-Ito: distinguishable for colour-blind readers, and in greyscale print.
_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
_STATUS_COLOURS = {
    "correct": "#009E73",
    "wrong": "#56B4E9",
    "unscored": "#E69F00",
    "errored": "#D55E00",
}
_VERDICT_CLASS = {"pass": "pass", "fail": "fail", "cannot_evaluate": "na"}
_CHANGE_COLOUR = "#555555"


@dataclass(frozen=True)
class HistoryPoint:
    task: str
    model: str
    scorer: str
    fingerprint: str
    created: datetime
    run_id: str
    accuracy: float | None
    accuracy_strict: float | None
    n_samples: int


@dataclass(frozen=True)
class FlipRow:
    """One sample whose verdict differs between the two fingerprints of a verifier change,
    read from the version before the change (`old_*`) to the one after it (`new_*`)."""

    scorer: str
    run_id: str
    sample_id: str
    epoch: int
    old_fingerprint: str
    new_fingerprint: str
    old_value: float | None
    new_value: float | None
    old_status: str
    new_status: str
    old_answer: str | None
    new_answer: str | None
    new_explanation: str | None
    task: str = "?"
    model: str = "?"


@dataclass
class FingerprintChange:
    """A verifier's code changed (an edit, a revert): from `previous` to `fingerprint`.

    Attributes:
        registered: when a command first found the code at `fingerprint`.
        revert: `fingerprint` was current before (an edit was undone).
        flips: the samples whose verdict differs between the two versions (the first few).
        n_flips: how many there are in all.
        n_both: samples graded by both versions (0: no re-score since the change).
    """

    scorer: str
    fingerprint: str
    label: str
    registered: datetime | None
    previous: str | None = None
    revert: bool = False
    flips: list[FlipRow] = field(default_factory=list)
    n_flips: int = 0
    n_both: int = 0


@dataclass(frozen=True)
class GateRow:
    run_id: str
    task: str
    model: str
    verdict: str
    created: datetime
    failing: list[str]
    accuracy: float | None
    accuracy_strict: float | None
    baseline_run_id: str | None = None


@dataclass(frozen=True)
class CoverageRow:
    run_id: str
    task: str
    model: str
    scorer: str
    fingerprint: str
    n_samples: int
    n_correct: int
    n_scored: int
    n_unscored: int
    n_error: int
    accuracy: float | None
    accuracy_strict: float | None

    @property
    def n_missing(self) -> int:
        return max(0, self.n_samples - self.n_scored - self.n_unscored - self.n_error)


@dataclass
class ReportData:
    """Everything the report shows; each list may be empty (the section then says so).

    `newest`: each scorer's newest fingerprint (the current code's), drawn in full colour;
    older versions' history is drawn faded.
    """

    title: str = "gradebook report"
    generated: datetime | None = None
    warehouse: str = ""
    history: list[HistoryPoint] = field(default_factory=list)
    fingerprint_changes: list[FingerprintChange] = field(default_factory=list)
    gates: list[GateRow] = field(default_factory=list)
    coverage: list[CoverageRow] = field(default_factory=list)
    newest: dict[str, str] = field(default_factory=dict)


# The time axis is the data's span plus a margin; one run (or one sweep's runs, stamped within
# seconds) gets an hour around it, so its ticks are minutes, not milliseconds or a whole day.
_MIN_PAD = timedelta(minutes=30)
_PAD_SHARE = 0.04
# Pixel sizes of the history chart: a task's plot, and the room between two plots for the
# lower one's title and the upper one's two-line date ticks.
_PLOT_PX = 240
_GAP_PX = 90
_CHANGE_Y = 1.08  # where change markers sit: above every accuracy, below the chart's title
FLIPS_SHOWN = 50  # per verifier change; the rest are one SQL query away


def _short(fp: str) -> str:
    return fp[:10]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _e(text: object) -> str:
    """Text from a log or a model, for plotly's HTML-like labels and for the page."""
    return html.escape(str(text))


def _change_number(data: ReportData) -> dict[int, int]:
    """id(change) -> its number in the changes table (1 = the oldest)."""
    return {id(c): i for i, c in enumerate(data.fingerprint_changes, start=1)}


def _time_range(data: ReportData) -> tuple[datetime, datetime] | None:
    times = [p.created for p in data.history]
    times += [c.registered for c in data.fingerprint_changes if c.registered is not None]
    if not times:
        return None
    lo, hi = min(times), max(times)
    pad = max((hi - lo) * _PAD_SHARE, _MIN_PAD)
    return lo - pad, hi + pad


def _history_figure(data: ReportData) -> go.Figure | None:
    if not data.history:
        return None
    by_task: dict[str, list[HistoryPoint]] = defaultdict(list)
    for p in data.history:
        by_task[p.task].append(p)
    tasks = sorted(by_task)
    rows = len(tasks)
    area = rows * _PLOT_PX + (rows - 1) * _GAP_PX
    fig = make_subplots(
        rows=rows,
        cols=1,
        subplot_titles=[_e(t) for t in tasks],
        vertical_spacing=_GAP_PX / area if rows > 1 else 0.0,
    )
    several_scorers = len({p.scorer for p in data.history}) > 1
    colour: dict[tuple[str, str], str] = {}
    in_legend: set[str] = set()
    numbers = _change_number(data)
    x_range = _time_range(data)
    for row, task in enumerate(tasks, start=1):
        series: dict[tuple[str, str, str], list[HistoryPoint]] = defaultdict(list)
        for p in by_task[task]:
            series[(p.model, p.scorer, p.fingerprint)].append(p)
        # the current code's lines last, so they are drawn over the faded older versions
        order = sorted(series, key=lambda k: (data.newest.get(k[1]) == k[2], k))
        for model, scorer, fp in order:
            points = sorted(series[(model, scorer, fp)], key=lambda p: p.created)
            c = colour.setdefault((model, scorer), _PALETTE[len(colour) % len(_PALETTE)])
            name = f"{model} · {scorer}" if several_scorers else model
            current = data.newest.get(scorer, fp) == fp
            version = "current verifier" if current else "older verifier version"
            hover = [
                f"{_e(model)} · run {_e(p.run_id)}<br>{p.created:%Y-%m-%d %H:%M}<br>"
                f"strict {_pct(p.accuracy_strict)} · over scored {_pct(p.accuracy)}<br>"
                f"{p.n_samples} samples · {_e(scorer)} @ {_e(_short(fp))} ({version})"
                for p in points
            ]
            opacity = 1.0 if current else 0.3
            fig.add_trace(
                go.Scatter(
                    x=[p.created for p in points],
                    y=[p.accuracy_strict for p in points],
                    mode="lines+markers",
                    name=_e(name),
                    legendgroup=name,
                    showlegend=name not in in_legend,
                    line={"color": c, "width": 2 if current else 1},
                    marker={"size": 6 if len(points) > 1 else 9},
                    opacity=opacity,
                    hovertext=hover,
                    hoverinfo="text",
                    meta="strict" if current else "strict-older",
                ),
                row=row,
                col=1,
            )
            in_legend.add(name)
            if any(p.accuracy != p.accuracy_strict for p in points):
                # dotted beside solid: an outage that leaves samples unscored shows as the gap
                fig.add_trace(
                    go.Scatter(
                        x=[p.created for p in points],
                        y=[p.accuracy for p in points],
                        mode="lines",
                        name=_e(f"{name} (over scored)"),
                        legendgroup=name,
                        showlegend=False,
                        line={"color": c, "dash": "dot", "width": 1.5},
                        opacity=opacity,
                        hovertext=hover,
                        hoverinfo="text",
                        meta="over-scored",
                    ),
                    row=row,
                    col=1,
                )
        _draw_changes(fig, data, row, {p.scorer for p in by_task[task]}, numbers)
        fig.update_yaxes(
            range=[-0.03, _CHANGE_Y + 0.06],
            tickvals=[0, 0.25, 0.5, 0.75, 1],
            tickformat=".0%",
            title_text="accuracy",
            row=row,
            col=1,
        )
        fig.update_xaxes(
            type="date",
            range=list(x_range) if x_range else None,
            showticklabels=True,
            hoverformat="%Y-%m-%d %H:%M:%S",
            row=row,
            col=1,
        )
    fig.update_layout(
        height=area + 100,
        margin={"l": 70, "r": 20, "t": 40, "b": 60},
        legend={"title": {"text": "model"}, "tracegroupgap": 4},
        hovermode="closest",
        template="plotly_white",
    )
    return fig


def _draw_changes(
    fig: go.Figure, data: ReportData, row: int, scorers: set[str], numbers: dict[int, int]
) -> None:
    """A dashed vertical line and a marker (hover: what changed) per verifier change.

    Markers, not text labels: an edit and its revert a minute apart would stack their labels
    on each other and on the chart's title; the table under the chart says the rest.
    """
    changes = [c for c in data.fingerprint_changes if c.scorer in scorers and c.registered]
    if not changes:
        return
    xref = "x" if row == 1 else f"x{row}"
    yref = "y domain" if row == 1 else f"y{row} domain"
    for change in changes:
        # add_vline's annotation arithmetic breaks on datetime axes; draw it by hand
        fig.add_shape(
            type="line",
            x0=change.registered,
            x1=change.registered,
            y0=0,
            y1=1,
            xref=xref,
            yref=yref,
            layer="below",
            line={"color": _CHANGE_COLOUR, "dash": "dash", "width": 1},
        )
    groups = _nearby(changes, _time_range(data))
    fig.add_trace(
        go.Scatter(
            x=[g[0].registered for g in groups],
            y=[_CHANGE_Y] * len(groups),
            mode="markers",
            name="verifier changed",
            legendgroup="verifier changed",
            showlegend=not any(t.legendgroup == "verifier changed" for t in fig.data),
            marker={"symbol": "triangle-down", "size": 11, "color": _CHANGE_COLOUR},
            hovertext=["<br>".join(_change_hover(c, numbers[id(c)]) for c in g) for g in groups],
            hoverinfo="text",
            meta="changes",
        ),
        row=row,
        col=1,
    )


def _nearby(
    changes: list[FingerprintChange], x_range: tuple[datetime, datetime] | None
) -> list[list[FingerprintChange]]:
    """Changes closer than a hundredth of the axis to the previous one share a marker (an edit
    and its revert a minute apart would draw one marker over the other and hover as one)."""
    close = (x_range[1] - x_range[0]) / 100 if x_range else timedelta(0)
    groups: list[list[FingerprintChange]] = []
    for c in sorted(changes, key=lambda c: c.registered or datetime.min):
        last = groups[-1][-1].registered if groups else None
        if last is not None and c.registered is not None and c.registered - last <= close:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _change_hover(change: FingerprintChange, number: int) -> str:
    kind = "revert" if change.revert else "edit"
    flips = (
        f"{change.n_flips} sample(s) flipped"
        if change.n_both
        else "not re-scored yet: no sample graded by both versions"
    )
    when = f"{change.registered:%Y-%m-%d %H:%M:%S}" if change.registered else "?"
    return (
        f"#{number} {_e(change.scorer)} {kind}: {_e(_short(change.previous or '?'))} → "
        f"{_e(_short(change.fingerprint))} · {when} · {flips}"
    )


def _coverage_figure(data: ReportData) -> go.Figure | None:
    if not data.coverage:
        return None
    rows = sorted(data.coverage, key=lambda r: (r.task, r.model, r.scorer))
    labels = [_e(f"{r.task} · {r.model} · {r.scorer}") for r in rows]
    parts = [
        ("correct", [r.n_correct for r in rows]),
        ("wrong", [r.n_scored - r.n_correct for r in rows]),
        ("unscored", [r.n_unscored + r.n_missing for r in rows]),
        ("errored", [r.n_error for r in rows]),
    ]
    fig = go.Figure()
    for name, values in parts:
        fig.add_trace(
            go.Bar(
                y=labels,
                x=values,
                name=name,
                orientation="h",
                marker={"color": _STATUS_COLOURS[name]},
                text=[str(v) if v else "" for v in values],
                textposition="inside",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=max(220, 32 * len(rows) + 120),
        margin={"l": 20, "r": 20, "t": 30, "b": 40},
        xaxis_title="samples",
        yaxis={"automargin": True, "autorange": "reversed"},
        template="plotly_white",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "traceorder": "normal"},
    )
    return fig


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
            '<p class="meta" id="one-run">Each task × model has one run so far: its line starts '
            "with its second run.</p>"
        )
    return ""


@cache
def _plotly_gzip_b64() -> str:
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), mtime=0)).decode()


# Unpack plotly.js (gzip, base64) with the browser's own DecompressionStream, then draw every
# chart whose figure the page carries. `document.body.dataset.charts` says when it is done.
_LOADER = """
(async () => {
  const packed = document.getElementById("plotly-js-gzip").textContent;
  const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const code = await new Response(stream).text();
  const tag = document.createElement("script");
  tag.textContent = code;
  document.head.appendChild(tag);
  for (const el of document.querySelectorAll("script[data-chart]")) {
    const fig = JSON.parse(el.textContent);
    await Plotly.newPlot(el.dataset.chart, fig.data, fig.layout,
                         {responsive: true, displaylogo: false});
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
"""


def render_report(data: ReportData) -> str:
    """The whole report as one HTML document that needs no server and no network."""
    generated = f"{data.generated:%Y-%m-%d %H:%M %Z}" if data.generated else ""
    history = _history_figure(data)
    coverage = _coverage_figure(data)
    sections = [
        "<h2>Latest gate verdicts</h2>",
        _gates_table(data),
        "<h2>Coverage of the newest run per task × model</h2>",
        '<p class="meta">Accuracy is only meaningful next to coverage: unscored and errored '
        "samples count as wrong in the strict accuracy.</p>",
        _figure_html(coverage, "coverage-chart", "No scored run yet."),
        "<h2>Score history</h2>",
        '<p class="meta">One chart per task, one colour per model. Solid: strict accuracy '
        "(correct / samples); dotted, where it differs: accuracy over scored samples. Faded: "
        "grades by an older version of the verifier. ▼ and a dashed line: the verifier's code "
        "changed (an edit or a revert).</p>",
        _history_note(data),
        _figure_html(history, "history-chart", "No score history yet."),
        _changes_table(data),
        "<h2>Samples that flipped at each verifier change</h2>",
        _flips_section(data),
    ]
    charts = history is not None or coverage is not None
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
