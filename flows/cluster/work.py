"""The flows a cluster's workers run: generation on a `gpu` pool, one score chunk on a `cpu` pool.

They are deployed from the source tree by `gradebook cluster setup` and started by
`flows.cluster.dispatch` with `run_deployment`. Principle 8: nothing here opens the DuckDB file. A
generate run writes its .eval logs into the log dir and a small JSON manifest of what it produced
into the staging location; a score run reads its chunk of samples from a Parquet file the
dispatcher staged, grades them, and stages the score rows as one Parquet file for the single
ingest step that runs next to the warehouse (`Warehouse.load_staged`, idempotent: a retried
chunk cannot double a score). Each of these locations may be a bucket (flows.cluster.staging):
the workers then share no path with the dispatcher or each other, only the bucket.
"""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Failed

from flows.cluster import staging
from flows.generate import GenerationResult, run_generation
from sweeps.config import ModelConfig, TaskConfig, WorkspacesConfig
from sweeps.model_servers import env_problem

__all__ = [
    "WORK_FAILED",
    "ChunkResult",
    "FingerprintMismatch",
    "cluster_generate",
    "cluster_score",
    "read_manifest",
    "score_chunk",
]

ChunkResult = dict[str, Any]

# How a generate flow run whose work failed (it wrote its manifest) begins its state message:
# the dispatcher reads the manifest and does not dispatch it again (the same host would lack
# the same variable).
WORK_FAILED = "work failed on host"


class FingerprintMismatch(RuntimeError):
    """The verifier on this worker is not the code the sweep planned with."""


def read_manifest(location: str | Path) -> list[GenerationResult]:
    """The GenerationResults a `cluster-generate` run recorded at `location` (a path or URL).

    Raises:
        FileNotFoundError: the run did not finish writing it (it crashed or never ran).
        ObjectStoreError: the bucket cannot be read (one line).
    """
    rows = staging.read_json(location)
    return [GenerationResult(**r) for r in rows]


def _store_problem(log_dir: str, manifest: str, workspaces: dict[str, Any] | None) -> str | None:
    """Why this host cannot use a bucket the run writes to (one line), or None."""
    from warehouse.object_store import ObjectStoreError

    store = (workspaces or {}).get("store") if (workspaces or {}).get("capture", True) else None
    for what, location in (("log_dir", log_dir), ("workspace store", store), ("staging", manifest)):
        try:
            if location is not None:
                staging.check_reachable(location, what)
        except ObjectStoreError as exc:
            return str(exc)
    return None


@flow(name="cluster-generate", log_prints=False)
def cluster_generate(
    model: dict[str, Any],
    tasks: list[dict[str, Any]],
    log_dir: str,
    manifest: str,
    sweep: str | None = None,
    workspaces: dict[str, Any] | None = None,
) -> int:
    """Generate (never score) every task with one model on this worker.

    Args:
        model: a ModelConfig as JSON (`args_from` is resolved here, on the worker).
        tasks: TaskConfigs as JSON; task files must be at the same path on every host.
        log_dir: the log directory the .eval logs go to (a bucket prefix, or shared storage).
        manifest: where to write the list of GenerationResults (JSON) for the dispatcher (in
            the staging location).
        sweep: the sweep's name, recorded in each log's metadata.
        workspaces: the config's `[workspaces]` as JSON (its store in the bucket, or on shared
            storage).

    Returns:
        How many (model, task) results were recorded. A run where any of them has no log
        (this host lacks the model's key, its server did not answer, a task failed) ends
        Failed, its message beginning with WORK_FAILED and naming the host.
    """
    model_cfg = ModelConfig.model_validate(model)
    task_cfgs = [TaskConfig.model_validate(t) for t in tasks]
    host = socket.gethostname()
    # this host's environment, not the dispatcher's: Inspect reads the model's key and URL here
    problem = env_problem(model_cfg) or _store_problem(log_dir, manifest, workspaces)
    if problem is not None:
        why = (
            f"host {host} (work pool {model_cfg.work_pool}): {problem} where its worker runs "
            f"(`gradebook cluster worker {model_cfg.work_pool}`)"
        )
        results = [
            GenerationResult(model_cfg.label, t.label, None, None, "error", 0, 0, why)
            for t in task_cfgs
        ]
    else:
        ws = WorkspacesConfig.model_validate(workspaces) if workspaces else None
        results = run_generation(
            model_cfg, task_cfgs, _log_dir(log_dir), sweep=sweep, workspaces=ws
        )
    try:
        staging.write_json(manifest, [asdict(r) for r in results])
    except OSError as exc:  # the staging bucket refused it (ObjectStoreError: one line)
        return Failed(  # type: ignore[return-value]
            message=f"{WORK_FAILED} {host}: cannot write its manifest: {exc}", data=0
        )
    failed = [r for r in results if r.log is None]
    if failed:
        # the run's work failed, so the run does too: in the UI, and in the sweep's stage line
        return Failed(  # type: ignore[return-value]
            message=f"{WORK_FAILED} {host}: {len(failed)} of {len(results)} generation(s) "
            f"failed: {failed[0].error or failed[0].status}",
            data=len(results),
        )
    return len(results)


def score_chunk(
    chunk: str | Path,
    scorer: str,
    digest: str,
    staging_dir: str | Path,
    *,
    verifier_modules: list[str] | None = None,
    workers: int | None = None,
    sample_timeout_s: float | None = None,
) -> ChunkResult:
    """Grade one staged chunk of samples and stage the score rows (no database access).

    Args:
        chunk: a Parquet file or object of samples (SAMPLES_TO_SCORE_SCHEMA) written by the
            dispatcher.
        scorer: the verifier's registered name.
        digest: the fingerprint the dispatcher planned with; a worker whose verifier code
            differs refuses the chunk rather than write scores under the wrong fingerprint.
        staging_dir: where the dispatcher's `Warehouse.load_staged` finds the score file (a
            bucket prefix, or a shared directory).
        verifier_modules: modules to import so `scorer` is registered on this worker.
        workers: grading processes on this host (default: its CPU count).
        sample_timeout_s: per-sample backstop (default: the scoring stage's).

    Raises:
        FingerprintMismatch: this host runs different verifier code than the dispatcher.
    """
    from flows.score import grade_batch
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier
    from scorers.workers.pool import GradingPool
    from scorers.workers.stage import SAMPLE_TIMEOUT_S, ScoreOptions
    from warehouse.score_batches import Samples, scores_table

    for module in verifier_modules or []:
        importlib.import_module(module)
    verifier = get_verifier(scorer)
    here = fingerprint(verifier).digest
    if here != digest:
        raise FingerprintMismatch(
            f"verifier {scorer!r} has fingerprint {here[:12]} on this worker but the sweep "
            f"planned with {digest[:12]}: deploy the same verifier code to every CPU host"
        )
    samples = Samples(staging.read_parquet(chunk))
    opts = ScoreOptions(
        workers=workers,
        sample_timeout_s=SAMPLE_TIMEOUT_S if sample_timeout_s is None else sample_timeout_s,
        progress=False,
    )
    pool = GradingPool(max(1, workers or os.cpu_count() or 1))
    try:
        # graded by exactly that code, or not at all (grade_batch raises CodeChanged)
        results = grade_batch(pool, verifier, samples, opts, lambda n: None, expect=digest)
    finally:
        pool.close()
    table = scores_table(samples.table, results, scorer, digest)
    staged = staging.stage_scores(table, staging_dir)  # one object: whole or not at all
    statuses = table.column("status").to_pylist()
    return {
        "staged": staged,
        "rows": table.num_rows,
        "scored": statuses.count("scored"),
        "unscored": statuses.count("unscored"),
        "error": statuses.count("error"),
    }


def _log_dir(log_dir: str) -> Any:
    """The log dir as run_generation takes it: a bucket URL as text, else a path."""
    from warehouse.object_store import is_url, local_path

    return log_dir if is_url(log_dir) else local_path(log_dir)


@flow(name="cluster-score", log_prints=False)
def cluster_score(
    chunk: str,
    scorer: str,
    digest: str,
    staging_dir: str,
    verifier_modules: list[str] | None = None,
    workers: int | None = None,
    sample_timeout_s: float | None = None,
) -> ChunkResult:
    """Prefect flow run on a CPU worker: `score_chunk` for one chunk (see its Args)."""
    return score_chunk(
        chunk,
        scorer,
        digest,
        staging_dir,
        verifier_modules=verifier_modules,
        workers=workers,
        sample_timeout_s=sample_timeout_s,
    )
