"""The report's charts: the score history (one chart per task) and the coverage bars.

Pure: plotly figures from `ReportData`; flows/cli/report/html.py puts them on the page.

The history reads as accuracy against model. By default its x-axis is the models in the order
they first ran (a sweep runs its config's models in order, so a checkpoint sweep reads as
accuracy against checkpoint), each model's runs oldest to newest inside the model's own slot,
so no two models' lines ever cross. The page's toggle draws the same points against the time
each run was created instead. Either axis spans the chart's runs, not a fixed margin.

A model keeps one look on every chart: its colour, and past the palette a marker shape too, so
two models on one chart never look alike (up to `DISTINCT_LOOKS` models; past that the page
says so). Past `SMALL_MULTIPLES_AFTER` models the task charts are small multiples in a grid.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import plotly.graph_objects as go
import plotly.io as pio

from flows.cli.report.data import CoverageRow, FingerprintChange, HistoryPoint, ReportData

__all__ = [
    "DISTINCT_LOOKS",
    "SMALL_MULTIPLES_AFTER",
    "X_MODES",
    "HistoryChart",
    "Look",
    "XMode",
    "coverage_figure",
    "history_charts",
    "model_looks",
    "models_in_order",
]

XMode = Literal["models", "time"]
X_MODES: tuple[XMode, ...] = ("models", "time")  # the first is the page's default

# Okabe-Ito (readable by colour-blind readers) without its yellow, faint on white, then a
# purple, an olive and a brown apart from those: ten models before a marker shape has to tell
# two apart.
PALETTE = [
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#000000",
    "#6A3D9A",
    "#999933",
    "#8C564B",
]
# No triangle-down: it marks a verifier change.
_SHAPES = [
    "circle",
    "square",
    "diamond",
    "triangle-up",
    "cross",
    "x",
    "pentagon",
    "star",
    "hexagon",
    "hourglass",
    "triangle-left",
    "triangle-right",
]
SYMBOLS = _SHAPES + [f"{s}-open" for s in _SHAPES]
DISTINCT_LOOKS = len(PALETTE) * len(SYMBOLS)
DASHES = ["solid", "dash", "longdash", "dashdot"]  # one per verifier, when a chart has several
SMALL_MULTIPLES_AFTER = 6  # models: more, and the task charts go side by side in a grid

_STATUS_COLOURS = {
    "correct": "#009E73",
    "wrong": "#56B4E9",
    "unscored": "#E69F00",
    "errored": "#D55E00",
}
_CHANGE_COLOUR = "#555555"
_CHANGE_LINE = "#8a8a8a"
_MAX_CHANGE_LINES = 8  # per chart; past it, the markers alone
_SLOT_SEPARATOR = "#e3e3e3"
_CHANGE_Y = 1.08  # where change markers sit: above every accuracy, below the chart's title
_SLOT = 0.8  # the share of a model's slot its runs spread over; the rest parts it from the next
# Time axis: the runs' span plus a small margin; runs all stamped the same second get an hour
# around them (there is no span to fit), so the ticks are minutes, not milliseconds.
_PAD_SHARE = 0.04
_MIN_PAD = timedelta(seconds=1)
_ONE_INSTANT_PAD = timedelta(minutes=30)
# Chart heights (px): the plot, and the room a legend entry takes (the chart grows to show
# every entry, up to a cap; past it plotly scrolls the legend).
_HEIGHT = {"wide": 340, "small": 360}
_LEGEND_ENTRY_PX = 21
_AROUND_LEGEND_PX = 200  # the chart's title, the legend's, the x-axis's rotated model names
_MAX_HEIGHT = 760


# plotly_white's layout only: the whole template (defaults for every kind of trace) is 7 kB a
# figure, and the page carries two figures per task
_TEMPLATE = go.layout.Template(
    layout={
        k: v
        for k, v in pio.templates["plotly_white"].layout.to_plotly_json().items()
        if k in {"font", "hoverlabel", "paper_bgcolor", "plot_bgcolor", "xaxis", "yaxis", "title"}
    }
)


@dataclass(frozen=True)
class Look:
    colour: str
    symbol: str


@dataclass(frozen=True)
class HistoryChart:
    """One task's chart, drawn once per x-axis mode (the page switches between them)."""

    task: str
    figures: dict[XMode, go.Figure]


def _e(text: object) -> str:
    """Text from a log or a model, for plotly's HTML-like labels."""
    return html.escape(str(text))


def _t(text: object) -> str:
    """Text from a log or a model inside a hover template, where `%{...}` is a placeholder."""
    return _e(text).replace("%", "&#37;")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _short(fp: str) -> str:
    return fp[:10]


def models_in_order(history: list[HistoryPoint]) -> list[str]:
    """The models in the order they first ran (`history` is in run order)."""
    return list(dict.fromkeys(p.model for p in history))


def model_looks(models: list[str]) -> dict[str, Look]:
    """One look per model, in the order given: the palette's colours, then the same colours
    with the next marker shape; no two alike for up to `DISTINCT_LOOKS` models."""
    n = len(PALETTE)
    return {m: Look(PALETTE[i % n], SYMBOLS[(i // n) % len(SYMBOLS)]) for i, m in enumerate(models)}


def history_charts(data: ReportData) -> list[HistoryChart]:
    """One chart per task, in each x-axis mode; empty without history."""
    by_task: dict[str, list[HistoryPoint]] = defaultdict(list)
    for p in data.history:
        by_task[p.task].append(p)
    order = models_in_order(data.history)
    looks = model_looks(order)
    small = len(order) > SMALL_MULTIPLES_AFTER
    scorers = sorted({p.scorer for p in data.history})
    numbers = {id(c): i for i, c in enumerate(data.fingerprint_changes, start=1)}
    charts = []
    for task in sorted(by_task):
        points = by_task[task]
        chart = _TaskChart(data, task, points, looks, scorers, numbers, small)
        charts.append(HistoryChart(task, {m: chart.figure(m) for m in X_MODES}))
    return charts


class _TaskChart:
    """The traces of one task's chart, and where each run sits on either x-axis."""

    def __init__(
        self,
        data: ReportData,
        task: str,
        points: list[HistoryPoint],
        looks: dict[str, Look],
        scorers: list[str],
        numbers: dict[int, int],
        small: bool,
    ) -> None:
        self.data, self.task, self.points, self.looks = data, task, points, looks
        self.numbers, self.small = numbers, small
        self.dash = {s: DASHES[i % len(DASHES)] for i, s in enumerate(scorers)}
        self.several_scorers = len(scorers) > 1
        self.models = models_in_order(points)
        self.run_order = {r: i for i, r in enumerate(dict.fromkeys(p.run_id for p in points))}
        # each model's runs, oldest first, and when each was created
        self.runs: dict[str, dict[str, datetime]] = defaultdict(dict)
        for p in points:
            self.runs[p.model].setdefault(p.run_id, p.created)
        self.slots, self.slot_x = self._slots()
        scorers_here = {p.scorer for p in points}
        self.changes = [
            c for c in data.fingerprint_changes if c.scorer in scorers_here and c.registered
        ]

    def _slots(self) -> tuple[list[tuple[float, float]], dict[str, float]]:
        """Each model's slot on the model axis, as (start, end), and run id -> x.

        A model with more runs gets a wider slot (its width grows with the square root of its
        runs: a checkpoint run once stays readable beside a model run every night); its runs
        spread over `_SLOT` of it, oldest on the left (one run: the centre)."""
        slots: list[tuple[float, float]] = []
        x: dict[str, float] = {}
        start = 0.0
        for model in self.models:
            runs = list(self.runs[model])
            width = math.sqrt(len(runs))
            centre, spread = start + width / 2, _SLOT * width
            for j, run in enumerate(runs):
                x[run] = (
                    centre if len(runs) == 1 else centre - spread / 2 + spread * j / (len(runs) - 1)
                )
            slots.append((start, start + width))
            start += width
        return slots, x

    def _current(self, scorer: str, fp: str) -> bool:
        """Graded by the scorer's current code (a scorer the warehouse has no newest for: yes)."""
        return self.data.newest.get(scorer, fp) == fp

    def _name(self, model: str, scorer: str) -> str:
        return f"{model} · {scorer}" if self.several_scorers else model

    def figure(self, mode: XMode) -> go.Figure:
        x_of: Callable[[HistoryPoint], object] = (
            (lambda p: self.slot_x[p.run_id]) if mode == "models" else (lambda p: p.created)
        )
        fig = go.Figure()
        series: dict[tuple[str, str, str], list[HistoryPoint]] = defaultdict(list)
        for p in self.points:
            series[(p.model, p.scorer, p.fingerprint)].append(p)
        # the current code's lines last, so they are drawn over the faded older versions
        order = sorted(
            series, key=lambda k: (self._current(k[1], k[2]), self.models.index(k[0]), k[1:])
        )
        legend_on: dict[str, tuple[str, str, str]] = {}
        for key in order:  # one legend entry per model: on its current line where it has one
            name = self._name(key[0], key[1])
            if self._current(key[1], key[2]) or name not in legend_on:
                legend_on[name] = key
        for key in order:
            model, scorer, fp = key
            name = self._name(model, scorer)
            points = sorted(series[key], key=lambda p: self.run_order[p.run_id])
            self._add_series(fig, points, key, name, legend_on[name] == key, x_of)
        if mode == "models":
            groups = self._changes_between_runs()
        else:
            groups = [(g[0].registered, g) for g in self._nearby(self._changes_in_span())]
        _draw_changes(fig, groups, self.numbers)
        self._axes(fig, mode)
        return fig

    def _add_series(
        self,
        fig: go.Figure,
        points: list[HistoryPoint],
        key: tuple[str, str, str],
        name: str,
        in_legend: bool,
        x_of: Callable[[HistoryPoint], object],
    ) -> None:
        model, scorer, fp = key
        look = self.looks[model]
        current = self._current(scorer, fp)
        version = "current verifier" if current else "older verifier version"
        # what a point's hover says: the series' part once per trace, the run's part per point
        hover = (
            f"{_t(model)} · run %{{customdata[0]}}<br>%{{customdata[1]}}<br>"
            "strict %{customdata[2]} · over scored %{customdata[3]}<br>"
            f"%{{customdata[4]}} samples · {_t(scorer)} @ {_t(_short(fp))} ({version})"
            "<extra></extra>"
        )
        runs = [
            [
                _e(p.run_id),
                f"{p.created:%Y-%m-%d %H:%M}",
                _pct(p.accuracy_strict),
                _pct(p.accuracy),
                p.n_samples,
            ]
            for p in points
        ]
        opacity = 1.0 if current else 0.3
        dash = self.dash[scorer] if self.several_scorers else "solid"
        x = [x_of(p) for p in points]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[p.accuracy_strict for p in points],
                mode="lines+markers",
                name=_t(name),
                legendgroup=name,
                showlegend=in_legend,
                line={"color": look.colour, "width": 2 if current else 1, "dash": dash},
                marker={
                    "symbol": look.symbol,
                    "color": look.colour,
                    "size": 7 if len(points) > 1 else 10,
                },
                opacity=opacity,
                customdata=runs,
                hovertemplate=hover,
                meta="strict" if current else "strict-older",
            )
        )
        if any(p.accuracy != p.accuracy_strict for p in points):
            # dotted beside solid: an outage that leaves samples unscored shows as the gap
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[p.accuracy for p in points],
                    mode="lines",
                    name=_t(f"{name} (over scored)"),
                    legendgroup=name,
                    showlegend=False,
                    line={"color": look.colour, "dash": "dot", "width": 1.5},
                    opacity=opacity,
                    hoverinfo="skip",  # the solid line's points say both accuracies
                    meta="over-scored",
                )
            )

    def _time_range(self) -> tuple[datetime, datetime]:
        times = [p.created for p in self.points]
        lo, hi = min(times), max(times)
        if lo == hi:
            return lo - _ONE_INSTANT_PAD, hi + _ONE_INSTANT_PAD
        pad = max((hi - lo) * _PAD_SHARE, _MIN_PAD)
        return lo - pad, hi + pad

    def _changes_in_span(self) -> list[FingerprintChange]:
        """Changes between the chart's first run and its last: the axis spans the runs, and
        the table under the charts lists every change."""
        lo, hi = min(p.created for p in self.points), max(p.created for p in self.points)
        return [c for c in self.changes if c.registered and lo <= c.registered <= hi]

    def _nearby(self, changes: list[FingerprintChange]) -> list[list[FingerprintChange]]:
        """Changes closer than a hundredth of the axis to the previous one share a marker (an
        edit and its revert a minute apart would draw one marker over the other)."""
        lo, hi = self._time_range()
        close = (hi - lo) / 100
        groups: list[list[FingerprintChange]] = []
        for c in sorted(changes, key=lambda c: c.registered or datetime.min):
            last = groups[-1][-1].registered if groups else None
            if last is not None and c.registered is not None and c.registered - last <= close:
                groups[-1].append(c)
            else:
                groups.append([c])
        return groups

    def _changes_between_runs(self) -> list[tuple[object, list[FingerprintChange]]]:
        """On the model axis, a change sits in each model's slot between the last run created
        before it and the first after it; changes between the same two runs share a marker."""
        at: dict[float, list[FingerprintChange]] = {}
        for model in self.models:
            runs = list(self.runs[model].items())
            for c in self.changes:
                if c.registered is None:
                    continue
                before = sum(created <= c.registered for _, created in runs)
                if 0 < before < len(runs):
                    x = (self.slot_x[runs[before - 1][0]] + self.slot_x[runs[before][0]]) / 2
                    at.setdefault(x, []).append(c)
        return sorted(at.items(), key=lambda g: g[0])

    def _axes(self, fig: go.Figure, mode: XMode) -> None:
        fig.update_yaxes(
            range=[-0.03, _CHANGE_Y + 0.06],
            tickvals=[0, 0.25, 0.5, 0.75, 1],
            tickformat=".0%",
            title_text="accuracy",
        )
        if mode == "models":
            fig.update_xaxes(
                tickmode="array",
                tickvals=[(a + b) / 2 for a, b in self.slots],
                ticktext=[_e(m) for m in self.models],
                range=[0, self.slots[-1][1]],
                showgrid=False,
                zeroline=False,
                automargin=True,
                title_text="model, in the order they first ran · its runs oldest → newest",
            )
            for _, end in self.slots[:-1]:
                fig.add_vline(x=end, layer="below", line={"color": _SLOT_SEPARATOR, "width": 1})
        else:
            fig.update_xaxes(
                type="date",
                range=list(self._time_range()),
                hoverformat="%Y-%m-%d %H:%M:%S",
                automargin=True,
                title_text="when the run was created",
            )
        entries = sum(1 for t in fig.data if t.showlegend)
        base = _HEIGHT["small" if self.small else "wide"]
        fig.update_layout(
            title={"text": _t(self.task), "x": 0.01, "xanchor": "left"},
            height=min(_MAX_HEIGHT, max(base, entries * _LEGEND_ENTRY_PX + _AROUND_LEGEND_PX)),
            margin={"l": 60, "r": 10, "t": 40, "b": 10},
            showlegend=True,
            legend={"title": {"text": "model"}, "tracegroupgap": 2},
            hovermode="closest",
            template=_TEMPLATE,
        )


def _draw_changes(
    fig: go.Figure, groups: list[tuple[object, list[FingerprintChange]]], numbers: dict[int, int]
) -> None:
    """A marker (hover: what changed) per verifier change, and a dashed vertical line down the
    chart while there are few (on the model axis each model's slot has its own: 25 models
    would draw a barcode over the points).

    Markers, not text labels: an edit and its revert a minute apart would stack their labels
    on each other and on the chart's title; the table under the charts says the rest. Not in
    the legend, which lists models only: the text over the charts says what ▼ is.
    """
    if not groups:
        return
    for x, _ in groups if len(groups) <= _MAX_CHANGE_LINES else []:
        # add_vline's annotation arithmetic breaks on datetime axes; draw it by hand
        fig.add_shape(
            type="line",
            x0=x,
            x1=x,
            y0=0,
            y1=1,
            xref="x",
            yref="y domain",
            layer="below",
            line={"color": _CHANGE_LINE, "dash": "dash", "width": 1},
        )
    fig.add_trace(
        go.Scatter(
            x=[x for x, _ in groups],
            y=[_CHANGE_Y] * len(groups),
            mode="markers",
            name="verifier changed",
            showlegend=False,
            marker={"symbol": "triangle-down", "size": 11, "color": _CHANGE_COLOUR},
            hovertext=["<br>".join(_change_hover(c, numbers[id(c)]) for c in g) for _, g in groups],
            hoverinfo="text",
            meta="changes",
        )
    )


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


def coverage_figure(coverage: list[CoverageRow], models: list[str]) -> go.Figure | None:
    """Stacked bars (correct / wrong / unscored / errored) per task × model × verifier, the
    models of a task in the order given (the history's: the order they first ran)."""
    if not coverage:
        return None
    rank = {m: i for i, m in enumerate(models)}
    rows = sorted(coverage, key=lambda r: (r.task, rank.get(r.model, len(rank)), r.model, r.scorer))
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
