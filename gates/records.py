"""Release gates over the warehouse: read a run's metrics, decide, record the decision.

The decision itself is pure (gates.rules); this module is the I/O around it. The gate
evaluates each scorer under the fingerprint the caller says is *current* (computed from the
verifier's code by scorers.identity.fingerprint; passed in so the warehouse never imports scorers).
A run whose scores exist only under an older fingerprint cannot be evaluated: comparing a
release against a verifier that has since changed is exactly what design principle 7 forbids,
so the result names the `gradebook rescore` command to run instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from gates.rules import (
    GateResult,
    GateRules,
    RuleResult,
    ScorerStats,
    evaluate_rules,
    verdict_of,
)
from gates.stats import PairedComparison, paired_comparison
from warehouse.commands import command
from warehouse.connection import one

if TYPE_CHECKING:
    from warehouse.store import Warehouse

__all__ = [
    "GateResult",
    "GateRules",
    "evaluate_gate",
    "gate_run",
    "newest_runs",
    "record_gate",
    "resolve_run_id",
]


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> list[dict]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def resolve_run_id(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The full run id for `run_id` or a unique prefix of it (>= 6 characters); None if unknown."""
    exact = one(con.execute("SELECT run_id FROM runs WHERE run_id = ?", [run_id]))
    if exact:
        return exact[0]
    if len(run_id) < 6:
        return None
    hits = con.execute(
        "SELECT run_id FROM runs WHERE starts_with(run_id, ?) LIMIT 2", [run_id]
    ).fetchall()
    return hits[0][0] if len(hits) == 1 else None


def newest_runs(con: duckdb.DuckDBPyConnection, *, sweep: str | None = None) -> list[str]:
    """The newest run of each task x model, optionally only runs of a given sweep.

    A run belongs to a sweep when its log says so (Inspect eval metadata `sweep`, or a tag
    `sweep:<name>`) or when that sweep's gate step already recorded it in `gates`.
    """
    where, params = "", []
    if sweep is not None:
        where = (
            "WHERE json_extract_string(eval_spec, '$.metadata.sweep') = ? "
            "OR list_contains(CAST(json_extract(eval_spec, '$.tags') AS VARCHAR[]), ?) "
            "OR run_id IN (SELECT run_id FROM wh.gates WHERE sweep = ?)"
        )
        params = [sweep, f"sweep:{sweep}", sweep]
    rows = con.execute(
        f"SELECT run_id FROM runs {where} "
        # `created` is to the second: runs of one sweep can tie, the one ingested last is newer
        "QUALIFY row_number() OVER (PARTITION BY task, model "
        "  ORDER BY created DESC, first_ingested_at DESC, run_id DESC) = 1 "
        "ORDER BY task, model",
        params,
    ).fetchall()
    return [r[0] for r in rows]


def sweep_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every sweep a run belongs to (as `newest_runs` decides it)."""
    rows = con.execute(
        "SELECT json_extract_string(eval_spec, '$.metadata.sweep') FROM runs "
        "UNION SELECT substr(t, 7) FROM (SELECT unnest(CAST(json_extract(eval_spec, '$.tags') "
        "AS VARCHAR[])) AS t FROM runs) WHERE starts_with(t, 'sweep:') "
        "UNION SELECT sweep FROM wh.gates"
    ).fetchall()
    return sorted(r[0] for r in rows if r[0])


def planned_samples(dataset_samples: int | None, eval_spec: str | None) -> int | None:
    """How many dataset samples a run set out to generate: the dataset cut by the eval's
    `limit` (N, or a [start, end) range) or `sample_id` list, as Inspect applies them; None
    when unknown (id patterns).

    Coverage is measured against this, so a run with `limit = 2` that generated 2 samples is
    complete (its log header still reports the whole dataset's size).
    """
    if dataset_samples is None:
        return None
    try:
        config = json.loads(eval_spec or "{}").get("config") or {}
    except (json.JSONDecodeError, AttributeError):
        return dataset_samples
    chosen = config.get("sample_id")
    if chosen is not None:
        ids = chosen if isinstance(chosen, list) else [chosen]
        if any(isinstance(i, str) and any(c in i for c in "*?[") for i in ids):
            return None  # id patterns: how many matched is not recorded
        return min(dataset_samples, len(ids))
    limit = config.get("limit")
    if isinstance(limit, int):
        return min(dataset_samples, limit)
    if isinstance(limit, list) and len(limit) == 2:
        start, end = limit
        return max(0, min(dataset_samples, end) - start)
    return dataset_samples


def _scorer_stats(
    con: duckdb.DuckDBPyConnection, run_id: str, scorer: str, fingerprint: str
) -> ScorerStats | None:
    rows = _rows(
        con,
        "SELECT m.n_samples, m.n_scored, m.n_unscored, m.n_error, m.accuracy_strict, "
        "       m.epochs, m.pass_at_k, r.total_samples, r.dataset_samples, r.n_samples AS stored, "
        "       r.eval_spec "
        "FROM run_metrics m LEFT JOIN runs r USING (run_id) "
        "WHERE m.run_id = ? AND m.scorer = ? AND m.fingerprint = ?",
        [run_id, scorer, fingerprint],
    )
    if not rows:
        return None
    m = rows[0]
    epochs = int(m["epochs"] or 1)
    planned = planned_samples(m["dataset_samples"], m["eval_spec"])
    expected = m["total_samples"] or (planned * epochs if planned is not None else None)
    n_samples = int(m["n_samples"])
    pass_at_k = {k: v for k, v in enumerate(m["pass_at_k"] or [], start=1) if v is not None}
    return ScorerStats(
        scorer=scorer,
        fingerprint=fingerprint,
        n_samples=n_samples,
        n_expected=int(expected) if expected else None,
        n_scored=int(m["n_scored"]),
        n_unscored=int(m["n_unscored"]),
        n_error=int(m["n_error"]),
        n_correct=float(m["accuracy_strict"] or 0.0) * n_samples,
        epochs=epochs,
        pass_at_k=pass_at_k if epochs > 1 else {},
    )


def _outcomes(
    con: duckdb.DuckDBPyConnection, run_id: str, scorer: str, fingerprint: str
) -> dict[tuple[str, int], tuple[str | None, bool]]:
    """(sample_id, epoch) -> (status or None when unscored-yet, correct) for every sample."""
    rows = con.execute(
        "SELECT s.sample_id, s.epoch, c.status, coalesce(c.status = 'scored' AND c.value >= 1, false) "
        "FROM samples s LEFT JOIN current_scores c ON c.run_id = s.run_id "
        " AND c.sample_id = s.sample_id "
        " AND c.epoch = s.epoch AND c.scorer = ? AND c.fingerprint = ? "
        "WHERE s.run_id = ?",
        [scorer, fingerprint, run_id],
    ).fetchall()
    return {(sid, int(epoch)): (status, bool(ok)) for sid, epoch, status, ok in rows}


def _compare(
    cand: Mapping[tuple[str, int], tuple[str | None, bool]],
    base: Mapping[tuple[str, int], tuple[str | None, bool]],
    rules: GateRules,
) -> PairedComparison | None:
    shared = sorted(cand.keys() & base.keys())
    if rules.metric == "accuracy":
        # Accuracy over scored samples: compare only where both runs have a verdict.
        shared = [k for k in shared if cand[k][0] == "scored" and base[k][0] == "scored"]
    return paired_comparison(((cand[k][1], base[k][1]) for k in shared), alpha=rules.alpha)


def _db_path(con: duckdb.DuckDBPyConnection) -> str:
    """The file `con` reads (absolute), for the `--db` of a command the gate prints."""
    row = one(
        con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()")
    )
    return str(row[0]) if row and row[0] else "gradebook.duckdb"


def _score_it(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """How to score a run that has no scores: `gradebook score` on its log, with the verifiers
    when the log does not name them (a log gradebook's generate stage did not write)."""
    row = one(
        con.execute(
            "SELECT log_path, json_extract(eval_spec, '$.metadata.verifiers') FROM runs "
            "WHERE run_id = ?",
            [run_id],
        )
    )
    log, named = (row[0], row[1]) if row else (None, None)
    if not log:
        return "ingest its log, then score it with `gradebook score LOG --db ...`"
    fix = f"score it with `{command('score', log, '--db', _db_path(con))}`"
    if not named or not json.loads(named):
        fix = (
            f"score it with `{command('score', log, '--db', _db_path(con))} --verifier NAME` "
            f"(its log names no verifiers; NAME: one of `{command('verifiers')}`)"
        )
    if not Path(log).exists() and "://" not in log:
        fix += f" once its log is back at {log}"
    return fix


def _fingerprints_present(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, list[str]]:
    present: dict[str, list[str]] = {}
    for scorer, fp in con.execute(
        "SELECT scorer, fingerprint FROM scores WHERE run_id = ? GROUP BY ALL ORDER BY ALL",
        [run_id],
    ).fetchall():
        present.setdefault(scorer, []).append(fp)
    return present


def _find_baseline(
    con: duckdb.DuckDBPyConnection, run: Mapping[str, Any], rules: GateRules
) -> tuple[str | None, str | None]:
    """(baseline run id, problem) — the named baseline, or the newest earlier passing run."""
    if rules.baseline is not None:
        resolved = resolve_run_id(con, rules.baseline)
        if resolved is None:
            return None, (
                f"baseline run {rules.baseline!r} is not in the warehouse: pass an existing "
                "run id (see `SELECT run_id, task, model, created FROM runs`)"
            )
        return resolved, None
    row = one(
        con.execute(
            "SELECT g.run_id FROM latest_gates g JOIN runs r USING (run_id) "
            "WHERE g.verdict = 'pass' AND r.task = ? AND r.model = ? AND r.run_id <> ? "
            # Inspect stamps `created` to the second, so runs of one sweep can tie: the one
            # ingested first is the earlier run.
            "  AND (r.created, r.first_ingested_at) < (?, ?) "
            "ORDER BY r.created DESC, r.first_ingested_at DESC, r.run_id DESC LIMIT 1",
            [run["task"], run["model"], run["run_id"], run["created"], run["first_ingested_at"]],
        )
    )
    return (row[0] if row else None), None


def evaluate_gate(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    rules: GateRules,
    fingerprints: Mapping[str, str],
    *,
    sweep: str | None = None,
    unloaded: Mapping[str, str] | None = None,
) -> GateResult:
    """Decide one run's gate from the warehouse (read-only; nothing is written).

    Args:
        con: a connection to the warehouse (read-only is enough).
        run_id: the run (Inspect eval_id) or a unique prefix of it.
        rules: the thresholds.
        fingerprints: scorer name -> its current fingerprint; scorers not named are ignored.
        sweep: recorded with the result.
        unloaded: scorer -> how to load it, for verifiers that are not loaded in the caller
            (so have no current fingerprint): a run they scored cannot be evaluated.
    """
    result = GateResult(
        gate_id=uuid.uuid4().hex,
        created=datetime.now(UTC),
        run_id=run_id,
        verdict="cannot_evaluate",
        rules=rules,
        sweep=sweep,
    )
    resolved = resolve_run_id(con, run_id)
    if resolved is None:
        result.problems.append(
            f"unknown run {run_id!r}: no such run id in the warehouse; list runs with "
            "`SELECT run_id, task, model, created FROM runs` or ingest its log first"
        )
        return result
    run = _rows(
        con,
        "SELECT run_id, task, model, created, first_ingested_at FROM runs WHERE run_id = ?",
        [resolved],
    )[0]
    result.run_id, result.task, result.model = resolved, run["task"], run["model"]

    present = _fingerprints_present(con, resolved)
    scorers = [s for s in sorted(present) if s in fingerprints]
    missing = [s for s in sorted(present) if s not in fingerprints and s in (unloaded or {})]
    for scorer in missing:
        result.problems.append(
            f"run {resolved} was scored by verifier {scorer!r}, which is not loaded here: "
            f"{(unloaded or {})[scorer]}"
        )
    if not present:
        result.problems.append(f"run {resolved} has no scores yet: {_score_it(con, resolved)}")
    elif not scorers and not missing:
        result.problems.append(
            f"run {resolved} is scored only by {', '.join(sorted(present))}, none of which is a "
            f"registered verifier now ({', '.join(sorted(fingerprints)) or 'none'})"
        )

    baseline_id, problem = (None, None)
    if rules.max_regression is not None and scorers:
        baseline_id, problem = _find_baseline(con, run, rules)
        if problem:
            result.problems.append(problem)
    result.baseline_run_id = baseline_id

    results: list[RuleResult] = []
    for scorer in scorers:
        fp = fingerprints[scorer]
        result.fingerprints[scorer] = fp
        stats = _scorer_stats(con, resolved, scorer, fp)
        if stats is None:
            old = ", ".join(f[:12] for f in present[scorer])
            result.problems.append(
                f"run {resolved} has no {scorer} scores under the current fingerprint "
                f"{fp[:12]} (only under {old}): re-score it with "
                f"`{command('rescore', '--db', _db_path(con), '--scorer', scorer)}`"
            )
            continue
        result.metrics[scorer] = {
            "fingerprint": fp,
            "n_samples": stats.n_samples,
            "n_expected": stats.n_expected,
            "n_scored": stats.n_scored,
            "n_unscored": stats.n_unscored,
            "n_error": stats.n_error,
            "n_missing": stats.n_missing,
            "accuracy": stats.accuracy,
            "accuracy_strict": stats.accuracy_strict,
            "coverage": stats.coverage,
            "pass_at_k": {str(k): v for k, v in stats.pass_at_k.items()},
        }
        comparison = None
        if baseline_id is not None:
            base = _outcomes(con, baseline_id, scorer, fp)
            if not any(status is not None for status, _ in base.values()):
                result.problems.append(
                    f"baseline run {baseline_id} has no {scorer} scores under the current "
                    f"fingerprint {fp[:12]}: re-score it with "
                    f"`{command('rescore', '--db', _db_path(con), '--scorer', scorer)}`"
                )
                continue
            comparison = _compare(_outcomes(con, resolved, scorer, fp), base, rules)
        results.extend(
            evaluate_rules(rules, run["task"] or "", stats, comparison, baseline_run_id=baseline_id)
        )
    result.results = results
    result.verdict = verdict_of(results, result.problems)
    return result


def record_gate(con: duckdb.DuckDBPyConnection, result: GateResult) -> None:
    """Append one evaluation to the `gates` table (call inside a write transaction)."""
    con.execute(
        "INSERT INTO wh.gates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            result.gate_id,
            result.created,
            result.run_id,
            result.task,
            result.model,
            result.verdict,
            result.exit_code,
            result.rules.model_dump_json(),
            json.dumps([r.model_dump() for r in result.results]),
            json.dumps(result.fingerprints),
            result.baseline_run_id,
            json.dumps(result.metrics),
            json.dumps(result.problems),
            result.sweep,
        ],
    )


def gate_run(
    warehouse: Warehouse,
    run_id: str,
    rules: GateRules,
    fingerprints: Mapping[str, str],
    *,
    sweep: str | None = None,
    record: bool = True,
    unloaded: Mapping[str, str] | None = None,
) -> GateResult:
    """Evaluate one run's gate and append it to the `gates` table.

    An unknown run id is not recorded (there is no run to attach it to); every other
    evaluation, including one that cannot be decided, is.

    Args:
        warehouse: the warehouse to read from and record into.
        run_id: the run (or a unique prefix of its id).
        rules: the thresholds.
        fingerprints: scorer name -> its current fingerprint.
        sweep: the sweep this evaluation belongs to, if any.
        record: False to evaluate without writing (a dry run).
        unloaded: as for `evaluate_gate`.
    """
    with warehouse.read() as con:
        result = evaluate_gate(con, run_id, rules, fingerprints, sweep=sweep, unloaded=unloaded)
    if record and result.task is not None:
        with warehouse.write() as con:
            record_gate(con, result)
    return result
