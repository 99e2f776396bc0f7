"""Re-scoring: a verifier changed, so every saved sample it graded is graded again; no model calls.

`rescore` compares the fingerprints of the installed verifiers with what the warehouse has
scored under, and for each changed verifier re-scores exactly the samples of the runs it scored
before, under the new fingerprint. Old rows stay (history is append-only); the `grade_flips`
view then shows every sample whose verdict changed. With `retry_unscored` it also grades again,
under the current fingerprint, every sample whose latest attempt was unscored for a retryable
infrastructure reason (a new row with the next attempt number; never a flip).
`watch_verifiers` is the fingerprint check as a flow that `gradebook serve` runs on a short
interval; it also emits the Prefect event `gradebook.verifier.changed`, and grades again the
samples an infrastructure failure left unscored (`retry_infrastructure`) once the failure is
over, up to WATCH_MAX_ATTEMPT attempts per sample.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE as NO_CACHE

from flows.runtime.console import console
from flows.runtime.interrupts import finished_result, stop_on_signals, stop_signal
from flows.runtime.run_names import count, label_run, listed, parameter, tag
from flows.runtime.run_owner import record_owner
from flows.score import RunScore, ScoreOptions, ScoringStopped, score_runs, stop_line, stopped_run
from verifiers.rescore_plan import (
    RescorePlan,
    import_verifier_modules,
    plan_rescore,
    record_current,
)
from warehouse.commands import command
from warehouse.schema import RECORDED_PREFIX

__all__ = [
    "EVENT_VERIFIER_CHANGED",
    "WATCH_MAX_ATTEMPT",
    "InfraRetry",
    "RescorePlan",
    "WatchResult",
    "plan_rescore",
    "rescore",
    "rescore_flow",
    "retry_infrastructure",
    "run_rescore",
    "watch_verifiers",
]

EVENT_VERIFIER_CHANGED = "gradebook.verifier.changed"
# The watcher grades a sample again only while its latest attempt is below this. It runs every
# minute, and a failure can outlast any one check: a sample whose grading kills the worker
# every time, or a sandbox that answers the check but fails the run, would otherwise gain an
# unscored row a minute forever. 3 = a sweep's first grading, the sweep's own immediate retry,
# and one more once the watcher sees the service back; `--retry-unscored` has no cap.
WATCH_MAX_ATTEMPT = 3


def _flips(warehouse: str | Path, plan: RescorePlan, since: datetime) -> list[dict[str, Any]]:
    """The grade flips of the samples this pass graded (their current row under the plan's
    fingerprint was written `since`), against every older verdict: gradebook's own and the
    scores the logs recorded (`old_fingerprint` starting with RECORDED_PREFIX)."""
    from warehouse import Warehouse

    with Warehouse(warehouse).read() as con:
        cur = con.execute(
            "SELECT f.* FROM grade_flips f SEMI JOIN current_scores c "
            "  ON c.scorer = f.scorer AND c.run_id = f.run_id AND c.sample_id = f.sample_id "
            " AND c.epoch = f.epoch AND c.fingerprint = f.new_fingerprint AND c.scored_at >= ? "
            "WHERE f.scorer = ? AND f.new_fingerprint = ? "
            "AND f.run_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY run_id, sample_id, epoch",
            [since, plan.scorer, plan.digest, plan.run_ids],
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _totals(warehouse: str | Path, plan: RescorePlan) -> dict[str, Any]:
    """Where the plan's runs stand now under its fingerprint (all their samples, not only those
    this pass graded): scored, unscored, errored, correct, samples."""
    from warehouse import Warehouse

    with Warehouse(warehouse).read() as con:
        row = con.execute(
            "SELECT sum(n_scored), sum(n_unscored + n_pending), sum(n_error), "
            "sum(round(coalesce(accuracy, 0) * n_scored)), sum(n_samples) FROM run_metrics "
            "WHERE scorer = ? AND fingerprint = ? AND run_id IN (SELECT unnest(?::VARCHAR[]))",
            [plan.scorer, plan.digest, plan.run_ids],
        ).fetchone()
    keys = ("scored", "unscored", "errored", "correct", "samples")
    return {k: int(v or 0) for k, v in zip(keys, row or (), strict=False)}


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
    record_current(warehouse, plans)
    for i, plan in enumerate(plans):
        if not plan.changed:
            continue
        since = datetime.now(UTC)
        try:
            plan.written = score_runs(
                warehouse,
                {r: [plan.scorer] for r in plan.run_ids},
                opts,
                retry="all" if retry_unscored else None,
            )
        except ScoringStopped as stop:
            # what was graded is written: its flips are real; the later verifiers wait
            plan.written, plan.left, plan.stopped = stop.summaries, stop.left, stop.signum
            _record_outcome(warehouse, plan, since)
            for later in plans[i + 1 :]:
                if later.changed:
                    later.left, later.stopped = later.pending, stop.signum
            return plans
        _record_outcome(warehouse, plan, since)
    return plans


def _record_outcome(warehouse: str | Path, plan: RescorePlan, since: datetime) -> None:
    """The plan's flips (against gradebook's own verdicts, and apart, against the logs'
    recorded scores) and where its runs stand now, after a pass that began `since`."""
    flips = _flips(warehouse, plan, since)
    plan.flips = [f for f in flips if not f["old_fingerprint"].startswith(RECORDED_PREFIX)]
    plan.recorded_flips = [f for f in flips if f["old_fingerprint"].startswith(RECORDED_PREFIX)]
    plan.totals = _totals(warehouse, plan)


def _stopped(plans: list[RescorePlan]) -> int | None:
    """The signal that cut the re-score of `plans` short, if one did."""
    return next((p.stopped for p in plans if p.stopped is not None), None)


def rescore_stop_line(plans: list[RescorePlan]) -> str:
    """What a stopped re-score did, for the terminal (`flows.score.stop_line`)."""
    written = sum(w.written for p in plans for w in p.written)
    lefts = [p.left for p in plans if p.stopped is not None]
    counted = lefts and all(n is not None for n in lefts)
    left = sum(n for n in lefts if n is not None) if counted else None
    return stop_line(written, left, "gradebook rescore")


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
            key=_flips_artifact_key(plan.scorer), table=rows, description=_flips_description(plan)
        )


def _flips_artifact_key(scorer: str) -> str:
    """The key of a verifier's grade-flips artifact. Prefect takes lowercase letters, digits and
    dashes only; a variant's name (`math_verifier[timeout_s=2.0]`) has other characters, so it
    is spelled with those, plus 6 hex digits of the name that keep two variants apart."""
    slug = re.sub(r"[^a-z0-9]+", "-", scorer.lower()).strip("-")
    if re.fullmatch(r"[a-z0-9_-]+", scorer):
        return f"grade-flips-{slug}"  # as before: a plain name's artifact keeps its history
    return f"grade-flips-{slug}-{hashlib.sha256(scorer.encode()).hexdigest()[:6]}"


def _flips_description(plan: RescorePlan) -> str:
    n = plan.flipped_samples
    text = f"{plan.scorer}: {n} sample{'s' if n != 1 else ''} flipped under {plan.digest[:12]}"
    if len(plan.flips) != n:
        text += f" ({len(plan.flips)} flips against older fingerprints)"
    return text


def _rescore_what(scorers: Sequence[str] | None) -> str:
    return listed(scorers) if scorers else "changed verifiers"


@task(
    name="rescore",
    task_run_name=lambda parameters: f"rescore {_rescore_what(parameters.get('scorers'))}",
    cache_policy=NO_CACHE,
)
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


def _label_rescore_run(plans: Sequence[RescorePlan]) -> None:
    """`rescore math @eed6147ab1 (52 samples)`, tagged with each verifier re-scored."""
    done = [p for p in plans if p.changed]
    if not done:
        label_run("rescore: nothing to re-score")
        return
    what = listed(f"{p.scorer} @{p.digest[:10]}" for p in done)
    samples = count(sum(p.pending + p.retries for p in done), "sample")
    label_run(f"rescore {what} ({samples})", [tag("verifier", p.scorer) for p in done])


@flow(
    name="rescore",
    flow_run_name=lambda: f"rescore {_rescore_what(parameter('scorers'))}",
    log_prints=False,
    on_running=[record_owner],
)
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
            (grader_failed, sandbox_unavailable, timeout, verifier_error) under the current
            fingerprint.
    """
    import_verifier_modules(verifier_modules or [], warehouse)
    opts = ScoreOptions(workers=workers, progress=progress)
    # SIGINT/SIGTERM stop it in order (inside the flow run: Prefect's engine installs its own
    # SIGTERM handler): what was graded is written and the run ends Cancelled
    with stop_on_signals():
        try:
            plans = rescore_task(warehouse, scorers, dry_run, opts, retry_unscored)
        except KeyboardInterrupt:
            signum = stop_signal()
            if signum is None:
                raise
            return stopped_run(signum, "nothing re-scored", [])  # before any grading
    signum = _stopped(plans)
    if signum is not None:
        return stopped_run(signum, rescore_stop_line(plans), plans)
    if not dry_run:
        _label_rescore_run(plans)
    return plans


def run_rescore(warehouse: str = "gradebook.duckdb", **options: Any) -> list[RescorePlan]:
    """Run `rescore_flow` and return its plans, also when a signal stopped it (the flow run
    then ends Cancelled; a plan's `stopped` and `left` say so); other failures raise as the
    flow did."""
    return finished_result(rescore_flow(warehouse, **options, return_state=True), list)


@dataclass
class InfraRetry:
    """What one watcher run did about samples an infrastructure failure left unscored.

    Attributes:
        written: per (run, verifier), the rows the retry wrote (attempt > 1).
        waiting_for_sandbox: `sandbox_unavailable` samples not retried: the sandbox is still down.
        sandbox_down: why the sandbox check failed (None: not needed, or the sandbox is up).
        waiting_for_judge: `grader_failed` samples not retried: their judge does not answer.
        judge_down: per verifier, why its judge's health check failed.
        at_cap: samples left unscored at WATCH_MAX_ATTEMPT attempts after this run; only
            `gradebook rescore --retry-unscored` grades them again.
    """

    written: list[RunScore] = field(default_factory=list)
    waiting_for_sandbox: int = 0
    sandbox_down: str | None = None
    waiting_for_judge: int = 0
    judge_down: dict[str, str] = field(default_factory=dict)
    at_cap: int = 0

    @property
    def retried(self) -> int:
        return sum(w.written for w in self.written)

    def summary(self, warehouse: str | Path = "gradebook.duckdb") -> str | None:
        """One line for the watcher's output, or None when nothing was graded again."""
        if not self.retried:
            return None
        scorers = ", ".join(sorted({w.scorer for w in self.written if w.written}))
        scored = sum(w.scored for w in self.written)
        line = (
            f"retried {self.retried} sample(s) left unscored by an infrastructure failure "
            f"({scorers}): {scored} scored, {self.retried - scored} not"
        )
        if self.waiting_for_sandbox:
            line += f"; {self.waiting_for_sandbox} wait for the sandbox"
        if self.waiting_for_judge:
            line += f"; {self.waiting_for_judge} wait for the judge"
        if self.at_cap:
            line += (
                f"; {self.at_cap} unscored after {WATCH_MAX_ATTEMPT} attempts "
                f"({command('rescore', '--db', warehouse, '--retry-unscored')})"
            )
        return line


@dataclass
class WatchResult:
    """What one watcher run did: verifiers re-scored for a new fingerprint, and retries."""

    rescored: list[RescorePlan]
    retry: InfraRetry


def _infra_unscored(warehouse: str | Path) -> dict[str, list[tuple[str, str, int, int]]]:
    """verifier -> (run_id, reason, latest attempt, samples) unscored by an infrastructure
    failure under its current fingerprint."""
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import all_verifiers, get_verifier
    from warehouse import Warehouse

    wh = Warehouse(warehouse)
    found = {}
    for name in sorted(all_verifiers()):
        rows = wh.unscored_to_retry(name, fingerprint(get_verifier(name)).digest, "infrastructure")
        if rows:
            found[name] = rows
    return found


def retry_infrastructure(warehouse: str | Path, opts: ScoreOptions | None = None) -> InfraRetry:
    """Grade again, under the current fingerprints, the samples whose latest attempt is unscored
    for an infrastructure failure (scope "infrastructure": never an answer a verifier judged).

    `sandbox_unavailable` samples are retried only when the sandbox check passes now, and
    `grader_failed` ones only when their judge answers a health check (one GET of its
    `/models`), so an outage does not write a new unscored row per sample per call; no sample
    is retried past attempt WATCH_MAX_ATTEMPT.
    """
    from scorers.registry import get_verifier
    from scorers.sandbox.pool import sandbox_down
    from sweeps.model_servers import judge_problem

    cap = WATCH_MAX_ATTEMPT
    found = _infra_unscored(warehouse)
    due = [(n, r, why, k) for n, rows in found.items() for r, why, a, k in rows if a < cap]
    result = InfraRetry(at_cap=_at_cap(found))
    if not due:
        return result
    skip: tuple[str, ...] = ()
    if any(why == "sandbox_unavailable" for *_, why, _ in due):
        result.sandbox_down = sandbox_down()
        if result.sandbox_down:
            skip = ("sandbox_unavailable",)
            result.waiting_for_sandbox = sum(k for *_, why, k in due if why in skip)
    judges_down = {
        name: problem
        for name in sorted({n for n, _, why, _ in due if why == "grader_failed"})
        if (problem := judge_problem(get_verifier(name).spec)) is not None
    }
    result.judge_down = judges_down
    result.waiting_for_judge = sum(
        k for n, _, why, k in due if why == "grader_failed" and n in judges_down
    )
    # a verifier whose judge is down is retried without its grader_failed samples
    plans: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for name, run_id, why, _ in due:
        without = skip + (("grader_failed",) if name in judges_down else ())
        if why in without:
            continue
        names = plans.setdefault(without, {}).setdefault(run_id, [])
        if name not in names:
            names.append(name)
    if not plans:
        return result
    result.written = [
        w
        for without, plan in plans.items()
        for w in score_runs(
            warehouse,
            plan,
            opts,
            retry="infrastructure",
            max_attempt=cap,
            skip_reasons=without,
        )
        if w.written
    ]
    result.at_cap = _at_cap(_infra_unscored(warehouse))
    return result


def _at_cap(found: dict[str, list[tuple[str, str, int, int]]]) -> int:
    return sum(k for rows in found.values() for *_, a, k in rows if a >= WATCH_MAX_ATTEMPT)


@flow(
    name="verifier-watcher",
    flow_run_name=lambda: f"watch verifiers · {Path(str(parameter('warehouse'))).name}",
    log_prints=False,
    on_running=[record_owner],
)
def watch_verifiers(
    warehouse: str = "gradebook.duckdb",
    verifier_modules: list[str] | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> WatchResult:
    """Check every registered verifier's fingerprint; re-score those that changed; then grade
    again the samples an infrastructure failure left unscored (`retry_infrastructure`).

    Emits `gradebook.verifier.changed` (resource `gradebook.verifier.<name>`) for each changed
    verifier, so automations can react too. Prints one line when a retry wrote rows, and
    nothing otherwise (it runs every minute).
    """
    import_verifier_modules(verifier_modules or [], warehouse)
    if not Path(warehouse).exists():
        return WatchResult([], InfraRetry())
    opts = ScoreOptions(workers=workers, progress=progress)
    # `gradebook serve` stops its runs with SIGTERM: what was graded is written and the run
    # ends Cancelled (inside the flow run: Prefect's engine installs its own SIGTERM handler)
    rescored: list[RescorePlan] = []
    with stop_on_signals():
        try:
            rescored = _rescore_changed(warehouse, opts)
            signum = _stopped(rescored)
            if signum is not None:
                result = WatchResult(rescored, InfraRetry())
                return stopped_run(signum, rescore_stop_line(rescored), result)
            # not a task of its own: a task run a minute with nothing to do would fill the
            # UI; the scores it writes are task runs (write-scores) like any stage's
            retry = retry_infrastructure(warehouse, opts)
        except KeyboardInterrupt as exc:
            signum = stop_signal()
            if signum is None:
                raise
            retry = InfraRetry(written=exc.summaries if isinstance(exc, ScoringStopped) else [])
            line = stop_line(retry.retried, getattr(exc, "left", None), "gradebook rescore")
            return stopped_run(signum, line, WatchResult(rescored, retry))
    line = retry.summary(warehouse)
    if line:
        console.print(f"verifier watcher: {line}", soft_wrap=True)
    return WatchResult(rescored, retry)


def _rescore_changed(warehouse: str, opts: ScoreOptions) -> list[RescorePlan]:
    from prefect.events import emit_event

    every = plan_rescore(warehouse)
    record_current(warehouse, every)
    plans = [p for p in every if p.changed]
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
    return rescore_task(warehouse, [p.scorer for p in plans], False, opts)
