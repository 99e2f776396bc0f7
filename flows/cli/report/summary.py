"""`gradebook report`: read the warehouse views and write one self-contained HTML report.

The queries are here; the rendering is flows/cli/report/html.py (its charts: charts.py). Only
documented views are read (runs, score_history, fingerprint_order, fingerprint_changes,
latest_gates, run_metrics, grade_flips, current_scores), so the report shows exactly what a
user gets from SQL. "Newest"
fingerprint is `fingerprint_order.newest`: the current code's, as the gate uses.

Inspect stamps a run's `created` to the second, so runs of one sweep tie: wherever the report
orders runs by age, the one ingested later (`runs.first_ingested_at`) counts as newer, as the
gate does (gates/records.py).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from flows.cli.report.data import (
    FLIPS_SHOWN,
    CoverageRow,
    FingerprintChange,
    FlipRow,
    GateRow,
    HistoryPoint,
    ReportData,
)
from flows.cli.report.html import render_report
from warehouse import Warehouse

__all__ = ["collect_report", "write_report"]


def _rows(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


_NEWEST_FP = "SELECT scorer, fingerprint FROM fingerprint_order WHERE newest"


def _failing(results_json: str | None) -> list[str]:
    out = []
    for r in json.loads(results_json or "[]"):
        if r.get("passed") is False:
            label = f"{r['rule']}[{r['scorer']}]" if r.get("scorer") else r["rule"]
            value = "n/a" if r.get("value") is None else f"{r['value']:.3f}"
            out.append(f"{label} {value} (needs {r['op']} {r['threshold']:.3f})")
    return out


def _accuracies(metrics_json: str | None) -> tuple[float | None, float | None]:
    metrics = json.loads(metrics_json or "{}")
    if not metrics:
        return None, None
    first = metrics[sorted(metrics)[0]]
    return first.get("accuracy"), first.get("accuracy_strict")


def collect_report(
    con: duckdb.DuckDBPyConnection, *, title: str = "gradebook report"
) -> ReportData:
    """Read everything the report shows from an open warehouse connection."""
    data = ReportData(title=title, generated=datetime.now(UTC))
    data.history = [
        HistoryPoint(
            task=r["task"] or "?",
            model=r["model"] or "?",
            scorer=r["scorer"],
            fingerprint=r["fingerprint"],
            created=r["created"],
            run_id=r["run_id"],
            accuracy=r["accuracy"],
            accuracy_strict=r["accuracy_strict"],
            n_samples=int(r["n_samples"]),
        )
        for r in _rows(
            con,
            "SELECT h.task, h.model, h.scorer, h.fingerprint, h.created, h.run_id, h.accuracy, "
            "h.accuracy_strict, h.n_samples FROM score_history h "
            "LEFT JOIN runs r ON r.run_id = h.run_id WHERE h.created IS NOT NULL "
            "ORDER BY h.created, r.first_ingested_at, h.run_id",
        )
    ]
    data.newest = dict(con.execute(_NEWEST_FP).fetchall())
    data.fingerprint_changes = _changes(con)
    gates = _rows(
        con,
        "SELECT run_id, task, model, verdict, created, results::VARCHAR AS results, "
        "metrics::VARCHAR AS metrics, baseline_run_id FROM latest_gates "
        "QUALIFY row_number() OVER (PARTITION BY task, model ORDER BY created DESC) = 1 "
        "ORDER BY task, model",
    )
    data.gates = [
        GateRow(
            run_id=g["run_id"],
            task=g["task"] or "?",
            model=g["model"] or "?",
            verdict=g["verdict"],
            created=g["created"],
            failing=_failing(g["results"]),
            accuracy=_accuracies(g["metrics"])[0],
            accuracy_strict=_accuracies(g["metrics"])[1],
            baseline_run_id=g["baseline_run_id"],
        )
        for g in gates
    ]
    data.coverage = [
        CoverageRow(
            run_id=r["run_id"],
            task=r["task"] or "?",
            model=r["model"] or "?",
            scorer=r["scorer"],
            fingerprint=r["fingerprint"],
            n_samples=int(r["n_samples"]),
            n_correct=round((r["accuracy_strict"] or 0.0) * int(r["n_samples"])),
            n_scored=int(r["n_scored"]),
            n_unscored=int(r["n_unscored"]),
            n_error=int(r["n_error"]),
            accuracy=r["accuracy"],
            accuracy_strict=r["accuracy_strict"],
        )
        for r in _rows(
            con,
            f"""
            WITH newest_fp AS ({_NEWEST_FP}),
            current AS (
                SELECT m.* FROM run_metrics m
                SEMI JOIN newest_fp n ON n.scorer = m.scorer AND n.fingerprint = m.fingerprint
            )
            SELECT c.* FROM current c
            LEFT JOIN runs r ON r.run_id = c.run_id
            QUALIFY row_number() OVER (
                PARTITION BY c.task, c.model, c.scorer
                ORDER BY c.created DESC, r.first_ingested_at DESC, c.run_id DESC) = 1
            ORDER BY c.task, c.model, c.scorer
            """,
        )
    ]
    return data


def _changes(con: duckdb.DuckDBPyConnection) -> list[FingerprintChange]:
    """Each time a scorer's current code changed (an edit, a revert), oldest first, with the
    samples whose verdict differs between the version before and the one after. A scorer's
    first fingerprint is where its history starts, not a change."""
    changes: list[FingerprintChange] = []
    seen: dict[str, list[str]] = {}
    for r in _rows(
        con,
        "SELECT c.scorer, c.fingerprint, v.label, c.since FROM fingerprint_changes c "
        "LEFT JOIN verifiers v ON v.name = c.scorer AND v.fingerprint = c.fingerprint "
        "ORDER BY c.since",
    ):
        before = seen.setdefault(r["scorer"], [])
        if before and before[-1] != r["fingerprint"]:
            change = FingerprintChange(
                r["scorer"],
                r["fingerprint"],
                r["label"] or "",
                r["since"],
                previous=before[-1],
                revert=r["fingerprint"] in before,
            )
            _fill_flips(con, change)
            changes.append(change)
        before.append(r["fingerprint"])
    return changes


def _fill_flips(con: duckdb.DuckDBPyConnection, change: FingerprintChange) -> None:
    """The change's flips read from its version before to its version after, whichever of
    the two `grade_flips` calls older; and how many samples both versions graded."""
    pair = [change.scorer, change.previous, change.fingerprint]
    change.n_both = con.execute(
        "SELECT count(*) FROM current_scores a JOIN current_scores b "
        "USING (run_id, sample_id, epoch, scorer) "
        "WHERE a.scorer = ? AND a.fingerprint = ? AND b.fingerprint = ?",
        pair,
    ).fetchone()[0]
    if not change.n_both:
        return
    found = _rows(
        con,
        f"""
        SELECT f.*, r.task, r.model, count(*) OVER () AS n_flips FROM grade_flips f
        LEFT JOIN runs r ON r.run_id = f.run_id
        WHERE f.scorer = $1 AND (
            (f.old_fingerprint = $2 AND f.new_fingerprint = $3)
            OR (f.old_fingerprint = $3 AND f.new_fingerprint = $2))
        -- right-to-wrong first: those are what a verifier change must justify
        ORDER BY CASE WHEN f.old_fingerprint = $2 THEN coalesce(f.old_value, 0)
                      - coalesce(f.new_value, 0) ELSE coalesce(f.new_value, 0)
                      - coalesce(f.old_value, 0) END DESC,
                 r.created DESC, r.first_ingested_at DESC, f.run_id, f.sample_id, f.epoch
        LIMIT {FLIPS_SHOWN}
        """,
        pair,
    )
    change.n_flips = int(found[0]["n_flips"]) if found else 0
    for r in found:
        forward = r["old_fingerprint"] == change.previous
        old, new = ("old", "new") if forward else ("new", "old")
        change.flips.append(
            FlipRow(
                scorer=r["scorer"],
                run_id=r["run_id"],
                sample_id=r["sample_id"],
                epoch=int(r["epoch"]),
                old_fingerprint=r[f"{old}_fingerprint"],
                new_fingerprint=r[f"{new}_fingerprint"],
                old_value=r[f"{old}_value"],
                new_value=r[f"{new}_value"],
                old_status=r[f"{old}_status"],
                new_status=r[f"{new}_status"],
                old_answer=r[f"{old}_answer"],
                new_answer=r[f"{new}_answer"],
                new_explanation=r[f"{new}_explanation"],
                task=r["task"] or "?",
                model=r["model"] or "?",
            )
        )


def write_report(
    db: str | Path | Warehouse, out: str | Path = "report.html", *, title: str | None = None
) -> Path:
    """Render the report of a warehouse to `out` (written atomically) and return its path."""
    wh = db if isinstance(db, Warehouse) else Warehouse(db)
    with wh.read() as con:
        data = collect_report(con, title=title or f"gradebook report: {wh.path.name}")
    data.warehouse = str(wh.path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(render_report(data), encoding="utf-8")
    tmp.replace(out)
    return out
