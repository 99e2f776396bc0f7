"""Render the score-history report: one self-contained HTML file, plotly.js inlined.

Pure rendering from `ReportData`; the queries that fill it live in flows/report/summary.py. Every
string that came from a model or a log is escaped here: model output is hostile, and a
report is opened in a browser.
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

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
class FingerprintChange:
    scorer: str
    fingerprint: str
    label: str
    registered: datetime | None


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


@dataclass(frozen=True)
class FlipRow:
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


@dataclass
class ReportData:
    """Everything the report shows; each list may be empty (the section then says so)."""

    title: str = "gradebook report"
    generated: datetime | None = None
    warehouse: str = ""
    history: list[HistoryPoint] = field(default_factory=list)
    fingerprint_changes: list[FingerprintChange] = field(default_factory=list)
    gates: list[GateRow] = field(default_factory=list)
    coverage: list[CoverageRow] = field(default_factory=list)
    flips: list[FlipRow] = field(default_factory=list)


# The narrowest time axis a history chart gets: narrower, its tick labels are milliseconds.
_MIN_SPAN = timedelta(days=1)


def _short(fp: str) -> str:
    return fp[:10]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _history_figure(data: ReportData) -> go.Figure | None:
    if not data.history:
        return None
    groups: dict[tuple[str, str], list[HistoryPoint]] = defaultdict(list)
    for p in data.history:
        groups[(p.task, p.model)].append(p)
    keys = sorted(groups)
    fig = make_subplots(
        rows=len(keys),
        cols=1,
        shared_xaxes=False,
        subplot_titles=[f"{task} · {model}" for task, model in keys],
        vertical_spacing=min(0.12, 0.3 / max(1, len(keys))),
    )
    colour: dict[tuple[str, str], str] = {}
    shown: set[tuple[str, str]] = set()
    for row, key in enumerate(keys, start=1):
        series: dict[tuple[str, str], list[HistoryPoint]] = defaultdict(list)
        for p in groups[key]:
            series[(p.scorer, p.fingerprint)].append(p)
        for (scorer, fp), points in sorted(series.items()):
            points.sort(key=lambda p: p.created)
            c = colour.setdefault((scorer, fp), _PALETTE[len(colour) % len(_PALETTE)])
            name = f"{scorer} @ {_short(fp)}"
            hover = [
                f"run {p.run_id}<br>strict {_pct(p.accuracy_strict)} · over scored "
                f"{_pct(p.accuracy)}<br>{p.n_samples} samples"
                for p in points
            ]
            legend = (scorer, fp) not in shown
            shown.add((scorer, fp))
            # strict (solid) next to over scored (dotted): an outage shows as the gap
            for label, values, line, marker in (
                ("strict", [p.accuracy_strict for p in points], {"color": c}, None),
                ("over scored", [p.accuracy for p in points], {"color": c, "dash": "dot"},
                 {"symbol": "circle-open"}),
            ):  # fmt: skip
                fig.add_trace(
                    go.Scatter(
                        x=[p.created for p in points],
                        y=values,
                        mode="lines+markers",
                        name=f"{name} {label}",
                        legendgroup=name,
                        showlegend=legend,
                        line=line,
                        marker=marker,
                        hovertext=hover,
                        hoverinfo="text",
                    ),
                    row=row,
                    col=1,
                )
        fig.update_yaxes(range=[-0.02, 1.02], title_text="accuracy", row=row, col=1)
        times = [p.created for p in groups[key]]
        if max(times) - min(times) < _MIN_SPAN:
            # one run (or runs of one sweep, stamped the same second): plotly would zoom to a
            # sub-millisecond axis; show the day around it instead
            half = _MIN_SPAN / 2
            fig.update_xaxes(range=[min(times) - half, max(times) + half], row=row, col=1)
        scorers_here = {p.scorer for p in groups[key]}
        for change in data.fingerprint_changes:
            if change.scorer not in scorers_here or change.registered is None:
                continue
            # add_vline's annotation arithmetic breaks on datetime axes; draw it by hand.
            xref = "x" if row == 1 else f"x{row}"
            yref = "y domain" if row == 1 else f"y{row} domain"
            fig.add_shape(
                type="line",
                x0=change.registered,
                x1=change.registered,
                y0=0,
                y1=1,
                xref=xref,
                yref=yref,
                line={
                    "color": colour.get((change.scorer, change.fingerprint), "#555"),
                    "dash": "dash",
                },
            )
            fig.add_annotation(
                x=change.registered,
                y=1,
                xref=xref,
                yref=yref,
                text=f"{change.scorer} → {_short(change.fingerprint)}",
                showarrow=False,
                yanchor="bottom",
                font={"size": 10},
            )
    fig.update_layout(
        height=max(340, 300 * len(keys)),
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
        legend={"orientation": "h", "y": -0.08},
        template="plotly_white",
    )
    return fig


def _coverage_figure(data: ReportData) -> go.Figure | None:
    if not data.coverage:
        return None
    rows = sorted(data.coverage, key=lambda r: (r.task, r.model, r.scorer))
    labels = [f"{r.task} · {r.model} · {r.scorer}" for r in rows]
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
        height=max(220, 60 * len(rows) + 120),
        margin={"l": 20, "r": 20, "t": 30, "b": 40},
        xaxis_title="samples",
        yaxis={"automargin": True},
        template="plotly_white",
        legend={"orientation": "h", "y": 1.1, "traceorder": "normal"},
    )
    return fig


def _figure_html(fig: go.Figure | None, div_id: str, empty: str) -> str:
    if fig is None:
        return f'<p class="empty">{html.escape(empty)}</p>'
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


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


def _value(v: float | None, status: str) -> str:
    return html.escape(status) if v is None else f"{v:g}"


def _flips_table(data: ReportData) -> str:
    if not data.flips:
        return '<p class="empty">No grade changed under the newest verifier fingerprint.</p>'
    head = (
        "<tr><th>scorer</th><th>run</th><th>sample</th><th>epoch</th><th>old → new value</th>"
        "<th>old answer</th><th>new answer</th><th>new explanation</th></tr>"
    )
    rows = []
    for f in data.flips:
        rows.append(
            "<tr>"
            f"<td>{html.escape(f.scorer)}</td><td><code>{html.escape(f.run_id)}</code></td>"
            f"<td>{html.escape(f.sample_id)}</td><td>{f.epoch}</td>"
            f"<td>{_value(f.old_value, f.old_status)} → {_value(f.new_value, f.new_status)}</td>"
            f"<td>{html.escape(_clip(f.old_answer))}</td>"
            f"<td>{html.escape(_clip(f.new_answer))}</td>"
            f"<td>{html.escape(_clip(f.new_explanation, 160))}</td>"
            "</tr>"
        )
    fps = sorted(
        {
            f"{f.scorer} {_short(f.old_fingerprint)} → {_short(f.new_fingerprint)}"
            for f in data.flips
        }
    )
    caption = html.escape(", ".join(fps))
    return f'<table id="flips"><caption>{caption}</caption>{head}{"".join(rows)}</table>'


def _clip(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "–"
    return text if len(text) <= limit else text[: limit - 1] + "…"


_CSS = """
body{font-family:system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:24px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}caption{text-align:left;color:#555;padding:4px 0}
td.pass{background:#d9f2e4;font-weight:bold}td.fail{background:#f8d7d3;font-weight:bold}
td.na{background:#fdebc8;font-weight:bold}.empty{color:#777;font-style:italic}
.meta{color:#666;font-size:.9em}code{font-size:.9em}
"""


def render_report(data: ReportData) -> str:
    """The whole report as one HTML document that needs no server and no network."""
    generated = f"{data.generated:%Y-%m-%d %H:%M %Z}" if data.generated else ""
    sections = [
        "<h2>Latest gate verdicts</h2>",
        _gates_table(data),
        "<h2>Coverage of the newest run per task × model</h2>",
        '<p class="meta">Accuracy is only meaningful next to coverage: unscored and errored '
        "samples count as wrong in the strict accuracy.</p>",
        _figure_html(_coverage_figure(data), "coverage-chart", "No scored run yet."),
        "<h2>Score history</h2>",
        '<p class="meta">Solid: strict accuracy (correct / samples). Dotted: accuracy over '
        "scored samples. Dashed verticals: a verifier's code changed (an edit or a revert).</p>",
        _figure_html(_history_figure(data), "history-chart", "No score history yet."),
        "<h2>Top grade flips of the newest fingerprint</h2>",
        _flips_table(data),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(data.title)}</title><style>{_CSS}</style>"
        # plotly.js inline: the file must open from disk with no network.
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f"<h1>{html.escape(data.title)}</h1>"
        f'<p class="meta">warehouse {html.escape(data.warehouse)} · generated {generated}</p>'
        + "".join(sections)
        + "</body></html>\n"
    )
