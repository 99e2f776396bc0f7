"""Cluster mode of the sweep: generation on the `gpu` pool, score chunks on the `cpu` pool.

The sweep's own process (next to the DuckDB file) is the dispatcher and the only warehouse
writer (principle 8). It starts one `cluster-generate/<pool>` flow run per model and one
`cluster-score/<pool>` flow run per chunk of samples with Prefect's `run_deployment`, waits for
them by polling the Prefect API, and reports per-stage status. Hand-over is by files or objects
(flows.cluster.staging), in a bucket (`s3://...`: the hosts share no path) or on shared storage:
generation writes .eval logs into the log dir and a manifest into the staging location; the
dispatcher ingests the logs, writes each chunk's samples as Parquet into the staging location,
and loads the score files the CPU workers stage there with `Warehouse.load_staged`
(idempotent). Every location a sweep names in a bucket is checked from this host before anything
is dispatched: a missing credential or endpoint is one line, not a stage of failed runs.

Every dispatch carries an idempotency key derived from the sweep's flow run and the work itself,
so a dispatcher that is retried by Prefect gets the same flow runs back instead of new ones. A
run that ends Crashed (its worker host died: Prefect's heartbeat automation says so, see
`flows.cluster.setup`) or Failed is dispatched again under a new attempt number, up to
`[cluster] chunk_retries` times; a chunk graded twice is loaded once.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flows.cluster import staging
from flows.cluster.setup import CLUSTER_TAG, GENERATE_FLOW, SCORE_FLOW, deployment_name
from flows.cluster.work import WORK_FAILED, read_manifest
from flows.generate import GenerationResult
from flows.runtime.console import waiting
from flows.runtime.run_names import count, tag
from flows.score import RunScore
from sweeps.config import ClusterConfig, ConfigError, ModelConfig, SweepConfig

__all__ = [
    "ClusterRun",
    "DispatchError",
    "DispatchReport",
    "dispatch_generation",
    "dispatch_scoring",
    "check_locations",
    "run_cluster_stages",
    "sweep_key",
]

POLL_S = 1.0
_RETRY_STATES = {"CRASHED", "FAILED"}


class DispatchError(RuntimeError):
    """A deployment the sweep needs is missing, or a stage did not finish in time."""


@dataclass
class ClusterRun:
    """One unit of work dispatched to a pool, across its attempts.

    Attributes:
        stage: "generate" or "score".
        label: the model (generate) or "scorer #chunk" (score).
        deployment: the `flow/deployment` it ran as.
        key: the idempotency key of its first attempt (later ones add "/attempt-N").
        parameters: what the flow run was given.
        flow_run_ids: one per attempt, in order.
        states: the final state type of each attempt ("COMPLETED", "CRASHED", ...).
        work_pool: the pool the last attempt ran on.
        message: the last attempt's state message (why it crashed or failed).
        title: the flow run's name in the Prefect UI (a retry adds "attempt N").
        tags: its tags besides `gradebook-cluster` (`model:...`, `verifier:...`).
    """

    stage: str
    label: str
    deployment: str
    key: str
    parameters: dict[str, Any]
    title: str = ""
    tags: list[str] = field(default_factory=list)
    flow_run_ids: list[Any] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    work_pool: str | None = None
    message: str | None = None
    started: float = 0.0
    finished: float | None = None

    @property
    def state(self) -> str:
        return self.states[-1] if self.states else "PENDING"

    @property
    def attempts(self) -> int:
        return len(self.flow_run_ids)

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


@dataclass
class DispatchReport:
    """Every flow run the sweep dispatched, for the per-stage status table."""

    runs: list[ClusterRun] = field(default_factory=list)
    loaded_rows: int = 0
    missing_scores: int = 0

    def stage(self, name: str) -> list[ClusterRun]:
        return [r for r in self.runs if r.stage == name]

    def summary(self) -> dict[str, dict[str, int]]:
        """stage -> counts: units, completed, failed, and attempts that ended in each state."""
        out: dict[str, dict[str, int]] = {}
        for name in ("generate", "score"):
            runs = self.stage(name)
            counts: Counter[str] = Counter()
            for r in runs:
                counts.update(s.lower() for s in r.states)
            out[name] = {
                "units": len(runs),
                "completed": sum(r.ok for r in runs),
                "failed": sum(not r.ok for r in runs),
                "retried": sum(max(0, r.attempts - 1) for r in runs),
                **{f"attempts_{k}": v for k, v in sorted(counts.items())},
            }
        return out


def sweep_key() -> str:
    """The id idempotency keys hang off: the sweep's flow run (stable across its retries)."""
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else f"adhoc-{uuid.uuid4().hex}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "x"


def _jsonable_model(model: ModelConfig, index: int) -> dict[str, Any]:
    import json

    from pydantic_core import PydanticSerializationError

    try:
        return json.loads(model.model_dump_json())
    except PydanticSerializationError:
        raise ConfigError(
            f"models[{index}] ({model.label}).args: a value is a Python object, which cannot be "
            "sent to a GPU worker; in cluster mode give it through args_from = "
            "'module:function' (called on the worker)"
        ) from None


# -- talking to Prefect --------------------------------------------------------------------------


def _work_failed(run: ClusterRun) -> bool:
    """The run failed because its work did (it said why per item), not because it crashed."""
    return (run.message or "").startswith(WORK_FAILED)


def _check_deployments(names: Sequence[str]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for name in dict.fromkeys(names):
            try:
                client.read_deployment_by_name(name)
            except ObjectNotFound:
                raise DispatchError(
                    f"deployment {name!r} not found on the Prefect server: run "
                    "`gradebook cluster setup` (infra/cluster/setup.sh) against it first"
                ) from None


def _submit(run: ClusterRun) -> None:
    from prefect.deployments import run_deployment

    key = run.key if not run.flow_run_ids else f"{run.key}/attempt-{run.attempts + 1}"
    title = run.title or f"{run.stage} {run.label}"
    flow_run = run_deployment(
        run.deployment,
        parameters=run.parameters,
        flow_run_name=title if not run.flow_run_ids else f"{title} (attempt {run.attempts + 1})",
        timeout=0,  # do not wait here: every unit is submitted first, then all are awaited
        idempotency_key=key,
        tags=[CLUSTER_TAG, *run.tags],
        as_subflow=False,
    )
    run.flow_run_ids.append(flow_run.id)
    run.states.append(flow_run.state.type.value if flow_run.state else "SCHEDULED")
    run.started = run.started or time.monotonic()


def _await_runs(
    runs: list[ClusterRun],
    *,
    retries: int,
    timeout_s: float,
    on_done: Callable[[ClusterRun], None] | None = None,
) -> None:
    """Poll the API until every run is final; resubmit Crashed/Failed ones up to `retries`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    pending = {r.flow_run_ids[-1]: r for r in runs}
    pools = ", ".join(sorted({r.deployment.split("/", 1)[1] for r in runs}))
    stage = runs[0].stage if runs else "the"
    with (
        get_client(sync_client=True) as client,
        waiting(
            f"{stage}: waiting for {len(runs)} flow run(s) on pool(s) {pools} (a worker must "
            "serve each: `gradebook cluster worker POOL`)"
        ) as shown,
    ):
        while pending:
            shown.update(
                f"{stage}: {len(runs) - len(pending)}/{len(runs)} flow run(s) done on pool(s) "
                f"{pools}"
            )
            found = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(pending)))
            )
            for fr in found:
                run = pending[fr.id]
                run.states[-1] = fr.state.type.value if fr.state else "PENDING"
                run.work_pool = fr.work_pool_name or run.work_pool
                if not (fr.state and fr.state.is_final()):
                    continue
                del pending[fr.id]
                run.message = fr.state.message
                if run.state in _RETRY_STATES and run.attempts <= retries and not _work_failed(run):
                    _submit(run)
                    pending[run.flow_run_ids[-1]] = run
                    continue
                run.finished = time.monotonic()
                if on_done is not None:
                    on_done(run)
            if not pending:
                break
            if time.monotonic() > deadline:
                waiting_on = sorted({r.deployment.split("/")[1] for r in pending.values()})
                raise DispatchError(
                    f"{len(pending)} flow run(s) not finished after {timeout_s:.0f}s "
                    f"(e.g. {next(iter(pending.values())).label}) on pool(s) "
                    f"{', '.join(waiting_on)}: start a worker there (`gradebook cluster worker "
                    f"{waiting_on[0]}`), or give a stage longer ([cluster] stage_timeout_s)"
                )
            time.sleep(POLL_S)


# -- the two stages ------------------------------------------------------------------------------


def dispatch_generation(
    cfg: SweepConfig, key: str, report: DispatchReport
) -> list[GenerationResult]:
    """One `cluster-generate` flow run per model on its `work_pool`; wait; read the manifests."""
    cluster = _cluster(cfg)
    tasks = [t.model_dump(mode="json") for t in cfg.tasks]
    runs = []
    for i, model in enumerate(cfg.models):
        manifest = staging.join(
            cluster.staging_dir, "manifests", f"{_slug(key)}-{i}-{_slug(model.label)}.json"
        )
        runs.append(
            ClusterRun(
                stage="generate",
                label=model.label,
                deployment=deployment_name(GENERATE_FLOW, model.work_pool),
                key=f"gradebook/{key}/generate/{i}/{_slug(model.label)}",
                parameters={
                    "model": _jsonable_model(model, i),
                    "tasks": tasks,
                    "log_dir": str(cfg.log_dir),
                    "manifest": manifest,
                    "sweep": cfg.name,
                    "workspaces": cfg.workspaces.model_dump(mode="json"),
                },
                title=f"generate {model.label} · {count(len(cfg.tasks), 'task')} "
                f"(sweep {cfg.name})",
                tags=[
                    tag("sweep", cfg.name),
                    tag("model", model.label),
                    *(tag("task", t.label) for t in cfg.tasks),
                ],
            )
        )
    _check_deployments([r.deployment for r in runs])
    for run in runs:
        _submit(run)
    report.runs += runs
    _await_runs(runs, retries=cluster.chunk_retries, timeout_s=cluster.stage_timeout_s)
    results: list[GenerationResult] = []
    for run in runs:
        if run.ok or _work_failed(run):
            try:
                # a run whose work failed still lists each pair: the ones with logs, and why
                # the others have none
                results += read_manifest(run.parameters["manifest"])
                continue
            except (OSError, ValueError) as exc:  # ObjectStoreError too: one line
                if not _work_failed(run):  # else its message says why already
                    run.message = f"manifest unreadable: {exc}"
        why = f"generation flow run ended {run.state}: {run.message or 'no message'}"
        results += [
            GenerationResult(run.label, t.label, None, None, "error", 0, 0, why) for t in cfg.tasks
        ]
    return results


def _chunk_key(scorer: str, digest: str, table: Any) -> str:
    h = hashlib.sha256(f"{scorer}\0{digest}".encode())
    for run_id, sample_id, epoch in zip(
        *(table.column(c).to_pylist() for c in ("run_id", "sample_id", "epoch")), strict=True
    ):
        h.update(f"\0{run_id}\0{sample_id}\0{epoch}".encode())
    return h.hexdigest()[:20]


def dispatch_scoring(
    cfg: SweepConfig, plan: dict[str, list[str]], key: str, report: DispatchReport
) -> list[RunScore]:
    """Cut the unscored samples of every (run, verifier) into chunks, score them on the cpu pool,
    and load what the workers staged; returns one RunScore per (run, verifier).

    Samples already scored under the verifier's current fingerprint are not dispatched again.
    """
    import pyarrow as pa

    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier
    from warehouse import Warehouse

    cluster = _cluster(cfg)
    wh = Warehouse(cfg.warehouse)
    staged = staging.join(cluster.staging_dir, staging.SCORES)
    by_scorer: dict[str, list[str]] = {}
    for run_id, names in plan.items():
        for name in names:
            by_scorer.setdefault(name, []).append(run_id)
    runs: list[ClusterRun] = []
    planned: dict[tuple[str, str], list[Any]] = {}  # (scorer, digest) -> key tables
    for name, run_ids in by_scorer.items():
        fp = fingerprint(get_verifier(name))
        wh.register_verifier(fp, current=True)
        todo = wh.samples_to_score(name, fp.digest, run_ids=run_ids)
        planned[(name, fp.digest)] = [todo.select(["run_id", "sample_id", "epoch"])]
        n_chunks = -(-todo.num_rows // cluster.chunk_size)
        for c in range(n_chunks):
            part = todo.slice(c * cluster.chunk_size, cluster.chunk_size)
            ck = _chunk_key(name, fp.digest, part)
            path = staging.join(cluster.staging_dir, "chunks", f"{_slug(name)}-{ck}.parquet")
            staging.write_parquet(part, path)  # whole or not at all
            runs.append(
                ClusterRun(
                    stage="score",
                    label=f"{name} #{c + 1}/{n_chunks}",
                    deployment=deployment_name(SCORE_FLOW, cluster.score_pool),
                    key=f"gradebook/{key}/score/{ck}",
                    parameters={
                        "chunk": path,
                        "scorer": name,
                        "digest": fp.digest,
                        "staging_dir": staged,
                        "verifier_modules": list(cfg.verifier_modules),
                        "workers": cluster.grading_workers,
                    },
                    title=f"score {name} #{c + 1}/{n_chunks} · "
                    f"{count(part.num_rows, 'sample')} (sweep {cfg.name})",
                    tags=[tag("sweep", cfg.name), tag("verifier", name)],
                )
            )
    if runs:
        _check_deployments([r.deployment for r in runs])
    for run in runs:
        _submit(run)
    report.runs += runs

    def load(run: ClusterRun) -> None:
        # the single writer loads each chunk's scores as soon as it is done
        if run.ok:
            report.loaded_rows += staging.load_staged(wh, staged)

    _await_runs(
        runs, retries=cluster.chunk_retries, timeout_s=cluster.stage_timeout_s, on_done=load
    )
    # files staged by an attempt reported failed
    report.loaded_rows += staging.load_staged(wh, staged)
    summaries: list[RunScore] = []
    for (name, digest), tables in planned.items():
        keys = pa.concat_tables(tables)
        found, missing = _scores_of(wh, name, digest, keys)
        report.missing_scores += missing
        for run_id in by_scorer[name]:
            summaries.append(found.get(run_id) or RunScore(run_id, name, digest))
    for run in runs:
        if run.ok:
            staging.remove(run.parameters["chunk"])
    return summaries


def _scores_of(wh: Any, scorer: str, digest: str, keys: Any) -> tuple[dict[str, RunScore], int]:
    """The score rows stored for the dispatched samples, per run; and how many have none."""
    out: dict[str, RunScore] = {}
    with wh.read() as con:
        con.register("_dispatched", keys)
        try:
            rows = con.execute(
                """
                SELECT k.run_id, s.status, s.value, s.reason
                FROM _dispatched k LEFT JOIN current_scores s
                  ON s.run_id = k.run_id AND s.sample_id = k.sample_id AND s.epoch = k.epoch
                 AND s.scorer = ? AND s.fingerprint = ?
                """,
                [scorer, digest],
            ).fetchall()
        finally:
            con.unregister("_dispatched")
    missing = 0
    for run_id, status, value, reason in rows:
        if status is None:
            missing += 1
            continue
        out.setdefault(run_id, RunScore(run_id, scorer, digest)).add(
            {"status": status, "value": value, "reason": reason}
        )
    return out, missing


def check_locations(cfg: SweepConfig) -> None:
    """Every bucket location of the sweep (log dir, workspace store, staging) usable from here.

    Raises:
        DispatchError: one line naming the key, the location and what to set.
    """
    from warehouse.object_store import ObjectStoreError

    cluster = _cluster(cfg)
    for what, location in (
        ("log_dir", cfg.log_dir),
        ("[workspaces] store", cfg.workspaces.store if cfg.workspaces.capture else None),
        ("[cluster] staging_dir", cluster.staging_dir),
    ):
        if location is None:
            continue
        try:
            staging.check_reachable(location, what)
        except ObjectStoreError as exc:
            raise DispatchError(str(exc)) from None


def _cluster(cfg: SweepConfig) -> ClusterConfig:
    if cfg.cluster is None:
        raise ConfigError(f"{cfg.source or cfg.name}: no [cluster] section: cluster mode is off")
    return cfg.cluster


def print_report(report: DispatchReport) -> None:
    """Per-stage status lines under the sweep's summary table."""
    from flows.runtime.console import console, shown

    for stage, counts in report.summary().items():
        if not counts["units"]:
            continue
        runs = report.stage(stage)
        pools = sorted({r.work_pool or "?" for r in runs})
        attempts = ", ".join(
            f"{v} {k.removeprefix('attempts_')}"
            for k, v in counts.items()
            if k.startswith("attempts_")
        )
        colour = "green" if not counts["failed"] else "red"
        console.print(
            f"  [bold]{stage}[/bold] on {', '.join(pools)}: [{colour}]{counts['completed']}/"
            f"{counts['units']} done[/{colour}]; flow runs: {attempts}"
        )
        for r in runs:
            if not r.ok:
                console.print(
                    f"    [red]{shown(r.label)}[/red]: {r.state} after {r.attempts} "
                    f"attempt(s): {shown(r.message or 'no message')}",
                    soft_wrap=True,
                )
    if report.missing_scores:
        console.print(f"  [red]{report.missing_scores} dispatched sample(s) have no score[/red]")


def run_cluster_stages(
    cfg: SweepConfig, *, progress: bool = True
) -> tuple[list[GenerationResult], dict[str, list[str]], list[RunScore], DispatchReport]:
    """Generate on the GPU pool(s), ingest here, score on the CPU pool, load the staged scores.

    Returns:
        (generation results, ingest plan run_id -> verifiers, score summaries, dispatch report)

    Raises:
        DispatchError: a deployment is missing, a stage timed out, or a bucket the sweep
            names cannot be used from this host.
        ConfigError: a model arg cannot be sent to a worker.
    """
    from flows.score import ingest_task

    check_locations(cfg)
    key = sweep_key()
    report = DispatchReport()
    generations = dispatch_generation(cfg, key, report)
    logs = [g.log for g in generations if g.log]
    plan, _ = ingest_task(str(cfg.warehouse), logs, None, cfg.ingest.limits())
    scores = dispatch_scoring(cfg, plan, key, report)
    if progress:
        print_report(report)
    return generations, plan, scores, report
