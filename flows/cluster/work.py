"""The flows a cluster's workers run: generation on a `gpu` pool, one score chunk on a `cpu` pool.

They are deployed from the source tree by `gradebook cluster setup` and started by
`flows.cluster.dispatch` with `run_deployment`. Principle 8: nothing here opens the DuckDB file. A
generate run writes its .eval logs plus a small JSON manifest of what it produced into the shared
log dir; a score run reads its chunk of samples from a Parquet file the dispatcher staged, grades
them, and stages the score rows as one Parquet file for the single ingest step that runs next to
the warehouse (`Warehouse.load_staged`, idempotent: a retried chunk cannot double a score).
"""

from __future__ import annotations

import importlib
import json
import os
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Failed

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


def _write_json_atomically(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def read_manifest(path: str | Path) -> list[GenerationResult]:
    """The GenerationResults a `cluster-generate` run recorded at `path`.

    Raises:
        FileNotFoundError: the run did not finish writing it (it crashed or never ran).
    """
    rows = json.loads(Path(path).read_text())
    return [GenerationResult(**r) for r in rows]


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
        log_dir: the shared log directory the .eval logs go to.
        manifest: where to write the list of GenerationResults (JSON) for the dispatcher.
        sweep: the sweep's name, recorded in each log's metadata.
        workspaces: the config's `[workspaces]` as JSON (its store on shared storage too).

    Returns:
        How many (model, task) results were recorded. A run where any of them has no log
        (this host lacks the model's key, its server did not answer, a task failed) ends
        Failed, its message beginning with WORK_FAILED and naming the host.
    """
    model_cfg = ModelConfig.model_validate(model)
    task_cfgs = [TaskConfig.model_validate(t) for t in tasks]
    host = socket.gethostname()
    # this host's environment, not the dispatcher's: Inspect reads the model's key and URL here
    problem = env_problem(model_cfg)
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
        results = run_generation(model_cfg, task_cfgs, Path(log_dir), sweep=sweep, workspaces=ws)
    _write_json_atomically(Path(manifest), [asdict(r) for r in results])
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
        chunk: a Parquet file of samples (SAMPLES_TO_SCORE_SCHEMA) written by the dispatcher.
        scorer: the verifier's registered name.
        digest: the fingerprint the dispatcher planned with; a worker whose verifier code
            differs refuses the chunk rather than write scores under the wrong fingerprint.
        staging_dir: the shared directory `Warehouse.load_staged` reads.
        verifier_modules: modules to import so `scorer` is registered on this worker.
        workers: grading processes on this host (default: its CPU count).
        sample_timeout_s: per-sample backstop (default: the scoring stage's).

    Raises:
        FingerprintMismatch: this host runs different verifier code than the dispatcher.
    """
    import pyarrow.parquet as pq

    from flows.score import grade_batch
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier
    from scorers.workers.pool import GradingPool
    from scorers.workers.stage import SAMPLE_TIMEOUT_S, ScoreOptions
    from warehouse import stage_scores
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
    samples = Samples(pq.read_table(str(chunk)))
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
    staged = stage_scores(table, Path(staging_dir))
    statuses = table.column("status").to_pylist()
    return {
        "staged": str(staged),
        "rows": table.num_rows,
        "scored": statuses.count("scored"),
        "unscored": statuses.count("unscored"),
        "error": statuses.count("error"),
    }


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
