"""Re-scoring: a verifier changed, so every saved sample it graded is graded again; no model calls.

`rescore` compares the fingerprints of the installed verifiers with what the warehouse has
scored under, and for each changed verifier re-scores exactly the samples of the runs it scored
before, under the new fingerprint. Old rows stay (history is append-only); the `grade_flips`
view then shows every sample whose verdict changed. With `retry_unscored` it also grades again,
under the current fingerprint, every sample whose latest attempt was unscored for a retryable
infrastructure reason (a new row with the next attempt number; never a flip).
`watch_verifiers` is the fingerprint check (without retries) as a flow that `gradebook serve`
runs on a short interval; it also emits the Prefect event `gradebook.verifier.changed`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE as NO_CACHE

from flows.score import RunScore, ScoreOptions, score_runs
from warehouse.schema import RETRYABLE_REASONS

__all__ = [
    "EVENT_VERIFIER_CHANGED",
    "RescorePlan",
    "plan_rescore",
    "rescore",
    "rescore_flow",
    "watch_verifiers",
]

EVENT_VERIFIER_CHANGED = "gradebook.verifier.changed"
MAX_FLIPS_SHOWN = 20


@dataclass
class RescorePlan:
    """What re-scoring one verifier means.

    Attributes:
        scorer: the verifier name.
        digest: its current fingerprint.
        old_digests: fingerprints it has scored under before.
        run_ids: runs with scores from an older fingerprint and samples not yet scored under
            the current one, and with `retry_unscored` runs with retryable unscored samples
            under the current one (what gets re-scored).
        pending: those samples.
        is_new: the current fingerprint was not registered in the warehouse yet.
        retries: how many of the pending samples are retries of an unscored attempt.
    """

    scorer: str
    digest: str
    old_digests: list[str]
    run_ids: list[str]
    pending: int
    is_new: bool
    retries: int = 0
    written: list[RunScore] = field(default_factory=list)
    flips: list[dict[str, Any]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.run_ids)


def import_verifier_modules(modules: list[str]) -> None:
    for mod in modules:
        importlib.import_module(mod)


def plan_rescore(
    warehouse: str | Path, scorers: list[str] | None = None, *, retry_unscored: bool = False
) -> list[RescorePlan]:
    """For each verifier (default: every registered one that has scores), what is stale; with
    `retry_unscored` also what is unscored for a retryable reason under its current fingerprint."""
    from scorers.fingerprint import fingerprint
    from scorers.registry import all_verifiers, get_verifier
    from warehouse import Warehouse

    wh = Warehouse(warehouse)
    names = scorers if scorers is not None else sorted(all_verifiers())
    plans = []
    with wh.read() as con:
        for name in names:
            fp = fingerprint(get_verifier(name))
            rows = con.execute(
                "SELECT fingerprint, list(DISTINCT run_id ORDER BY run_id) FROM scores "
                "WHERE scorer = ? AND fingerprint <> ? GROUP BY fingerprint ORDER BY fingerprint",
                [name, fp.digest],
            ).fetchall()
            run_ids = {r for _, runs in rows for r in runs}
            if retry_unscored:
                run_ids.update(
                    r
                    for (r,) in con.execute(
                        "SELECT DISTINCT run_id FROM current_scores WHERE scorer = ? "
                        "AND fingerprint = ? AND status = 'unscored' "
                        "AND list_contains(?::VARCHAR[], reason)",
                        [name, fp.digest, list(RETRYABLE_REASONS)],
                    ).fetchall()
                )
            known = con.execute(
                "SELECT count(*) FROM verifiers WHERE name = ? AND fingerprint = ?",
                [name, fp.digest],
            ).fetchone()[0]
            plans.append(
                RescorePlan(name, fp.digest, [d for d, _ in rows], sorted(run_ids), 0, not known)
            )
    for plan in plans:
        if plan.run_ids:
            todo = wh.samples_to_score(
                plan.scorer,
                plan.digest,
                run_ids=plan.run_ids,
                retry="all" if retry_unscored else None,
            )
            # runs already re-scored keep their old rows but have nothing pending
            plan.run_ids = sorted(set(todo.column("run_id").to_pylist()))
            plan.pending = todo.num_rows
            plan.retries = sum(a > 1 for a in todo.column("attempt").to_pylist())
    return plans


def _flips(warehouse: str | Path, plan: RescorePlan) -> list[dict[str, Any]]:
    from warehouse import Warehouse

    with Warehouse(warehouse).read() as con:
        cur = con.execute(
            "SELECT * FROM grade_flips WHERE scorer = ? AND new_fingerprint = ? "
            "AND run_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY run_id, sample_id, epoch",
            [plan.scorer, plan.digest, plan.run_ids],
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def rescore(
    warehouse: str | Path,
    scorers: list[str] | None = None,
    *,
    dry_run: bool = False,
    opts: ScoreOptions | None = None,
    retry_unscored: bool = False,
) -> list[RescorePlan]:
    """Re-score every run a changed verifier scored before; returns the plans with results.

    Args:
        warehouse: the DuckDB file.
        scorers: limit to these verifier names (default: all registered).
        dry_run: only report what would be re-scored; write nothing.
        opts: scoring pool options.
        retry_unscored: also grade again samples whose latest attempt under the current
            fingerprint is unscored for a retryable reason.
    """
    plans = plan_rescore(warehouse, scorers, retry_unscored=retry_unscored)
    if dry_run:
        return plans
    for plan in plans:
        if not plan.changed:
            continue
        written = score_runs(
            warehouse,
            {r: [plan.scorer] for r in plan.run_ids},
            opts,
            retry="all" if retry_unscored else None,
        )
        plan.written = written
        plan.flips = _flips(warehouse, plan)
    return plans


def _publish_flips(plans: list[RescorePlan]) -> None:
    """Record the flips as a Prefect table artifact, so the UI shows what changed."""
    from prefect.artifacts import create_table_artifact

    for plan in plans:
        if not plan.changed:
            continue
        rows = [
            {
                "run_id": f["run_id"],
                "sample_id": f["sample_id"],
                "epoch": f["epoch"],
                "old": f"{f['old_status']} {f['old_value']}",
                "new": f"{f['new_status']} {f['new_value']}",
                "new_explanation": f["new_explanation"],
            }
            for f in plan.flips[:500]
        ]
        create_table_artifact(
            key=f"grade-flips-{plan.scorer}".lower().replace("_", "-"),
            table=rows,
            description=f"{plan.scorer}: {len(plan.flips)} grade flips under {plan.digest[:12]}",
        )


@task(name="rescore", cache_policy=NO_CACHE)
def rescore_task(
    warehouse: str,
    scorers: list[str] | None,
    dry_run: bool,
    opts: ScoreOptions,
    retry_unscored: bool = False,
) -> list[RescorePlan]:
    plans = rescore(warehouse, scorers, dry_run=dry_run, opts=opts, retry_unscored=retry_unscored)
    if not dry_run:
        _publish_flips(plans)
    return plans


@flow(name="rescore", log_prints=False)
def rescore_flow(
    warehouse: str = "gradebook.duckdb",
    scorers: list[str] | None = None,
    dry_run: bool = False,
    verifier_modules: list[str] | None = None,
    workers: int | None = None,
    progress: bool = True,
    retry_unscored: bool = False,
) -> list[RescorePlan]:
    """Re-score saved samples whose verifier fingerprint changed (zero model calls).

    Args:
        warehouse: the DuckDB file.
        scorers: limit to these verifier names.
        dry_run: report only.
        verifier_modules: extra modules to import so their verifiers are registered.
        workers: scoring worker processes.
        progress: show progress bars.
        retry_unscored: also grade again samples left unscored for a retryable reason
            (sandbox_unavailable, timeout, verifier_error) under the current fingerprint.
    """
    import_verifier_modules(verifier_modules or [])
    opts = ScoreOptions(workers=workers, progress=progress)
    return rescore_task(warehouse, scorers, dry_run, opts, retry_unscored)


@flow(name="verifier-watcher", log_prints=False)
def watch_verifiers(
    warehouse: str = "gradebook.duckdb",
    verifier_modules: list[str] | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> list[RescorePlan]:
    """Check every registered verifier's fingerprint; re-score those that changed.

    Emits `gradebook.verifier.changed` (resource `gradebook.verifier.<name>`) for each changed
    verifier, so automations can react too.
    """
    from prefect.events import emit_event

    import_verifier_modules(verifier_modules or [])
    if not Path(warehouse).exists():
        return []
    plans = [p for p in plan_rescore(warehouse) if p.changed]
    for plan in plans:
        emit_event(
            event=EVENT_VERIFIER_CHANGED,
            resource={"prefect.resource.id": f"gradebook.verifier.{plan.scorer}"},
            payload={
                "scorer": plan.scorer,
                "new_fingerprint": plan.digest,
                "old_fingerprints": plan.old_digests,
                "runs": len(plan.run_ids),
                "warehouse": str(warehouse),
            },
        )
    if not plans:
        return []
    return rescore_task(
        warehouse,
        [p.scorer for p in plans],
        False,
        ScoreOptions(workers=workers, progress=progress),
    )
