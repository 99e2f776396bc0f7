"""The sweep flow: generate -> ingest -> score -> gate for every (model, task) of a config.

It reads like the pipeline diagram in DESIGN.md; each step is a Prefect task (or a few) so the
run shows up step by step in the Prefect UI, and the result carries what the summary table and
the exit code need.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Cancelled

from flows.generate import GenerationResult, config_tags, config_title, generate_models
from flows.runtime.interrupts import (
    exit_code,
    finished_result,
    signal_name,
    stop_on_signals,
    stop_signal,
)
from flows.runtime.run_names import label_run, parameter
from flows.runtime.run_owner import record_owner
from flows.score import (
    GradingPool,
    RunScore,
    ScoreOptions,
    ScoringStopped,
    ingest_task,
    score_runs,
    scoring_pool,
    start_early,
)
from gates.evaluate import current_fingerprints
from sweeps.config import SweepConfig, load_config
from sweeps.tasks import check_tasks
from verifiers.specs import check_verifiers, task_verifier_names

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_GATE_FAILED",
    "EXIT_OK",
    "SummaryRow",
    "SweepResult",
    "current_fingerprints",
    "retry_pass",
    "run_gates",
    "run_sweep",
    "sweep_flow",
]

EXIT_OK, EXIT_GATE_FAILED, EXIT_BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class SummaryRow:
    """One line of the end-of-sweep table: a (model, task, scorer) under the current fingerprint."""

    model: str
    task: str
    run_id: str | None
    scorer: str | None
    samples: int
    errored: int
    scored: int
    unscored: int
    correct: int
    accuracy: float | None
    accuracy_strict: float | None
    unscored_reasons: dict[str, int]
    gate: str | None
    note: str | None = None
    # where the pair got to: "done", "cancelled" (a stop cut its generation short), "failed",
    # "not started"; ", not scored" when a stop came before its scoring
    state: str = "done"


@dataclass
class SweepResult:
    name: str
    generations: list[GenerationResult]
    # one per (run, verifier) of the first pass, then one per (run, verifier) the retry pass wrote
    scores: list[RunScore]
    gates: dict[str, Any] = field(default_factory=dict)  # run_id -> GateResult
    rows: list[SummaryRow] = field(default_factory=list)
    dispatch: Any = None  # cluster mode: flows.cluster.dispatch.DispatchReport, per stage
    stopped: int | None = None  # the signal that stopped the sweep (flows.runtime.interrupts)
    # the scored copies written for `inspect view` (config `scored_logs`), and why any is not
    scored_logs: list[str] = field(default_factory=list)
    scored_problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.stopped is not None:
            return exit_code(self.stopped)
        verdicts = {getattr(g, "verdict", None) for g in self.gates.values()}
        if "fail" in verdicts:
            return EXIT_GATE_FAILED
        if "cannot_evaluate" in verdicts or any(g.log is None for g in self.generations):
            return EXIT_BAD_INPUT
        return EXIT_OK


def _generate_and_score(
    cfg: SweepConfig, workers: int | None, progress: bool, expected: int
) -> tuple[list[GenerationResult], dict[str, list[str]], list[RunScore]]:
    """The embedded stages: generate, ingest, score (and the retry pass), in this process.

    A stop (SIGINT, SIGTERM: flows.runtime.interrupts) cancels the eval in flight; what was generated,
    cancelled logs included, is still ingested, and scoring is skipped (or, once it has begun,
    stops handing out chunks and writes what was graded: `flows.score.ScoringStopped`).
    """
    names = sorted({n for t in cfg.tasks for n in task_verifier_names(t, cfg.model_roles)})
    loaded = current_fingerprints(names)
    opts = ScoreOptions(workers=workers, progress=progress)
    # The scoring workers start and the verifiers' helpers (math: sympy, seconds of CPU) boot
    # while the models generate, so scoring starts warm -- when there is more than a chunk or
    # two (`expected` samples) to score: a small sweep grades in this process, and booting
    # them would only take CPU from the generation.
    pool = start_early(names, opts) if expected > 2 * opts.chunk_size else scoring_pool(opts)
    scores: list[RunScore] = []
    try:
        generations = generate_models(cfg)
        logs = [g.log for g in generations if g.log]
        try:
            plan, _ = ingest_task(str(cfg.warehouse), logs, None, cfg.ingest.limits())
        except KeyboardInterrupt:
            if stop_signal() is None:
                raise
            # stopped mid-ingest: finish it (idempotent); a second signal exits at once
            plan, _ = ingest_task(str(cfg.warehouse), logs, None, cfg.ingest.limits())
        if stop_signal() is not None:
            return generations, plan, scores
        if current_fingerprints(names) != loaded:
            # a verifier was edited during generation: what the early workers imported is
            # stale. The stage would find out from their first chunks (it never writes a
            # chunk graded by other code than the files hold) and grade them again; starting
            # fresh workers now saves that pass.
            pool.close()
            pool = scoring_pool(opts)
        try:
            scores = score_runs(cfg.warehouse, plan, opts, pool)
            scores += retry_pass(cfg.warehouse, scores, opts, pool)
        except KeyboardInterrupt as exc:
            if stop_signal() is None:
                raise
            if isinstance(exc, ScoringStopped):  # what it graded is written
                scores += exc.summaries
    finally:
        pool.close()
    return generations, plan, scores


def retry_pass(
    warehouse: str | Path,
    first: list[RunScore],
    opts: ScoreOptions,
    pool: GradingPool | None = None,
) -> list[RunScore]:
    """The score step's automatic retry: grade again, once, the samples the first pass left
    unscored for an infrastructure failure (the sandbox unreachable, a judge's calls failing, a
    grading worker process that died), so a transient outage does not reach the gate as unscored samples.

    Not timeouts or verifier exceptions: those come from the verifier on that input and would
    most likely fail the same way again, at the cost of another time limit per sample; a user
    retries them with `gradebook rescore --retry-unscored` once the cause is fixed. Once, not
    until it works: a failure that persists (Docker stays down) costs one more attempt row per
    sample and is then counted and shown as unscored.

    Returns:
        The retry's summaries for the (run, verifier) pairs it wrote rows for.
    """
    candidates = {
        (s.run_id, s.scorer)
        for s in first
        if any(s.reasons.get(r) for r in ("sandbox_unavailable", "verifier_error", "grader_failed"))
    }
    if not candidates:
        return []
    retry_plan: dict[str, list[str]] = {}
    for run_id, scorer in sorted(candidates):
        retry_plan.setdefault(run_id, []).append(scorer)
    retried = score_runs(warehouse, retry_plan, opts, pool, retry="infrastructure")
    return [s for s in retried if s.written]


def run_gates(
    cfg: SweepConfig, run_ids: list[str], fingerprints: Mapping[str, str]
) -> dict[str, Any]:
    """The gate step: evaluate and record each run's gate under the current fingerprints.

    Delegates to the gate stage (`flows.gate_stage.run_gates`, a Prefect task that also publishes a
    markdown artifact) with the config's `[gates]` rules; returns run_id -> GateResult.
    """
    from flows.gate_stage import run_gates as gate_stage

    results = gate_stage(
        str(cfg.warehouse), run_ids, rules=cfg.gates, sweep=cfg.name, fingerprints=fingerprints
    )
    return {r.run_id: r for r in results}


def summarise(
    cfg: SweepConfig,
    generations: list[GenerationResult],
    fingerprints: Mapping[str, str],
    gates: Mapping[str, Any],
    *,
    stopped: bool = False,
) -> list[SummaryRow]:
    """Read the sweep's numbers back from the warehouse (run_metrics under current prints);
    `stopped`: a signal stopped the sweep (rows with no scores say "not scored")."""
    from warehouse import Warehouse

    metrics: dict[tuple[str, str], dict[str, Any]] = {}
    reasons: dict[tuple[str, str], dict[str, int]] = {}
    run_ids = [g.run_id for g in generations if g.run_id]
    if run_ids and cfg.warehouse.exists():
        with Warehouse(cfg.warehouse).read() as con:
            for scorer, digest in fingerprints.items():
                for row in _dicts(
                    con.execute(
                        "SELECT * FROM run_metrics WHERE scorer = ? AND fingerprint = ? "
                        "AND run_id IN (SELECT unnest(?::VARCHAR[]))",
                        [scorer, digest, run_ids],
                    )
                ):
                    metrics[(row["run_id"], scorer)] = row
                for run_id, reason, n in con.execute(
                    "SELECT run_id, reason, count(*) FROM current_scores WHERE scorer = ? "
                    "AND fingerprint = ? AND status = 'unscored' "
                    "AND run_id IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL ORDER BY ALL",
                    [scorer, digest, run_ids],
                ).fetchall():
                    reasons.setdefault((run_id, scorer), {})[reason] = n
    verifiers_of = {t.label: task_verifier_names(t, cfg.model_roles) for t in cfg.tasks}
    rows: list[SummaryRow] = []
    for gen in generations:
        gate = gates.get(gen.run_id) if gen.run_id else None
        verdict = getattr(gate, "verdict", None)
        if gen.run_id is None:
            rows.append(
                SummaryRow(
                    gen.model,
                    gen.task,
                    None,
                    None,
                    0,
                    0,
                    0,
                    0,
                    0,
                    None,
                    None,
                    {},
                    None,
                    note=gen.error,
                    state="not started" if gen.status == "not started" else "failed",
                )  # fmt: skip
            )
            continue
        for scorer in verifiers_of.get(gen.task, []):
            m = metrics.get((gen.run_id, scorer), {})
            state = "cancelled" if gen.status == "cancelled" else "done"
            if stopped and not m.get("n_scored") and not m.get("n_unscored"):
                state += ", not scored"
            rows.append(
                SummaryRow(
                    model=gen.model,
                    task=gen.task,
                    run_id=gen.run_id,
                    scorer=scorer,
                    samples=gen.samples,
                    errored=gen.errored,
                    scored=int(m.get("n_scored") or 0),
                    unscored=int(m.get("n_unscored") or 0),
                    correct=round((m.get("accuracy") or 0.0) * int(m.get("n_scored") or 0)),
                    accuracy=m.get("accuracy"),
                    accuracy_strict=m.get("accuracy_strict"),
                    unscored_reasons=reasons.get((gen.run_id, scorer), {}),
                    gate=verdict,
                    note=gen.error,
                    state=state,
                )
            )
    return rows


def _dicts(cursor: Any) -> list[dict[str, Any]]:
    cols = [d[0] for d in cursor.description]
    return [dict(zip(cols, r, strict=True)) for r in cursor.fetchall()]


def _sweep_run_name() -> str:
    return f"sweep {config_title(parameter('config'))}"


@flow(name="sweep", flow_run_name=_sweep_run_name, log_prints=False, on_running=[record_owner])
def sweep_flow(
    config: SweepConfig | str,
    workers: int | None = None,
    progress: bool = True,
    gate: bool = True,
) -> SweepResult:
    """Generate, ingest, score and gate every (model, task) of a sweep.

    Args:
        config: a SweepConfig or the path of a sweep TOML file.
        workers: scoring worker processes (default: CPU count).
        progress: show progress bars.
        gate: run the gate step.

    A config with a `[cluster]` section dispatches generation and scoring to Prefect work
    pools (`flows.cluster.dispatch`); without one everything runs in this process.
    """
    cfg = config if isinstance(config, SweepConfig) else load_config(config)
    label_run(tags=config_tags(cfg))
    # a task that cannot load is bad input: stop before any model is called
    expected = check_tasks(cfg)
    check_verifiers(cfg)  # so is a scorer that cannot be resolved
    dispatch = None
    # SIGINT/SIGTERM stop the sweep in order (inside the flow run: Prefect's engine installs
    # its own SIGTERM handler, which Inspect would take for a sample error)
    with stop_on_signals():
        if cfg.cluster is not None:  # [cluster]: the stages run on Prefect work pools
            from flows.cluster.dispatch import run_cluster_stages

            generations, plan, scores, dispatch = run_cluster_stages(cfg, progress=progress)
        else:
            generations, plan, scores = _generate_and_score(cfg, workers, progress, expected)
        stopped = stop_signal()
        names = sorted({n for t in cfg.tasks for n in task_verifier_names(t, cfg.model_roles)})
        fingerprints = current_fingerprints(names)
        run_ids = [g.run_id for g in generations if g.run_id and g.run_id in plan]
        gates = run_gates(cfg, run_ids, fingerprints) if gate and run_ids and not stopped else {}
        result = SweepResult(cfg.name, generations, scores, gates, dispatch=dispatch)
        result.stopped = stopped
        if cfg.scored_logs and cfg.cluster is None and not stopped:
            result.scored_logs = _scored_copies(cfg, generations, result.scored_problems)
        result.rows = summarise(cfg, generations, fingerprints, gates, stopped=bool(stopped))
    if stopped is not None:
        # the run ends Cancelled; `run_sweep` hands its result back all the same
        done = sum(g.status == "success" for g in generations)
        return Cancelled(  # type: ignore[return-value]
            message=f"stopped by {signal_name(stopped)} after {done} of "
            f"{len(generations)} (model, task) generations",
            data=result,
        )
    return result


def _scored_copies(
    cfg: SweepConfig, generations: list[GenerationResult], problems: list[str]
) -> list[str]:
    """A scored copy of each log the sweep generated, in `cfg.scored_log_dir`: what `inspect
    view` shows with gradebook's scores (warehouse.scored_logs); a copy that cannot be made is
    one line in `problems`, never a failed sweep (the scores are in the warehouse)."""
    from warehouse.scored_logs import write_scored_logs

    logs = [g.log for g in generations if g.log and g.run_id]
    if not logs or cfg.scored_log_dir is None:
        return []
    try:
        return write_scored_logs(cfg.warehouse, logs, cfg.scored_log_dir, problems)
    except (OSError, ValueError) as exc:
        problems.append(f"{cfg.scored_log_dir}: no scored copies written ({exc})")
        return []


def run_sweep(config: SweepConfig | str, **options: Any) -> SweepResult:
    """Run `sweep_flow` and return its result, also when a signal stopped it (the flow run
    then ends Cancelled, with the partial result); other failures raise as the flow did."""
    return finished_result(sweep_flow(config, **options, return_state=True), SweepResult)
