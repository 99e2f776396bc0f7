"""The gate as a Prefect task (the last step of a sweep) and as a flow (for deployments).

Both evaluate and record with `gates.evaluate.evaluate_gates` and also publish the verdicts as a
markdown artifact, so the Prefect UI shows each sweep's gate history under one key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.runtime.run_names import count, parameter
from flows.runtime.run_owner import record_owner
from gates.evaluate import evaluate_gates, gate_markdown, overall_exit_code
from gates.rules import GateResult, GateRules

__all__ = ["gate_flow", "run_gates"]


def _artifact_key(name: str) -> str:
    # Prefect artifact keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:100] or "gate"


def _gating(sweep: str | None, run_ids: Sequence[str] | None) -> str:
    if sweep:
        return f"sweep {sweep}"
    if run_ids and len(run_ids) == 1:
        return f"run {run_ids[0]}"
    return count(len(run_ids), "run") if run_ids else "the newest runs"


@task(
    name="gate",
    task_run_name=lambda parameters: (
        f"gate {_gating(parameters.get('sweep'), parameters.get('run_ids'))}"
    ),
    cache_policy=NO_CACHE,
)
def run_gates(
    db: str | Path,
    run_ids: Sequence[str] | None = None,
    *,
    rules: GateRules | None = None,
    sweep: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
) -> list[GateResult]:
    """The gate step of a sweep: evaluate, record, and publish a markdown artifact.

    Args as `evaluate_gates`. The artifact key is `gate-<sweep>` (or `gate-<run id>`), so the
    Prefect UI shows the history of one sweep's verdicts under one key.
    """
    from prefect.artifacts import create_markdown_artifact

    results = evaluate_gates(db, run_ids, rules=rules, sweep=sweep, fingerprints=fingerprints)
    name = sweep or (results[0].run_id if len(results) == 1 else "runs")
    code = overall_exit_code(results)
    create_markdown_artifact(
        key=_artifact_key(f"gate-{name}"),
        markdown=gate_markdown(results),
        description=f"release gate: exit {code}",
    )
    return results


@flow(
    name="gate",
    flow_run_name=lambda: f"gate {_gating(parameter('sweep'), parameter('run_ids'))}",
    log_prints=False,
    on_running=[record_owner],
)
def gate_flow(
    db: str,
    run_ids: list[str] | None = None,
    rules: GateRules | None = None,
    sweep: str | None = None,
    fingerprints: dict[str, str] | None = None,
) -> int:
    """Gate runs as a flow of its own (a deployment, or `gradebook gate` against a server).

    Returns:
        The overall exit code (0 pass, 1 fail, 2 cannot evaluate).
    """
    results = run_gates(db, run_ids, rules=rules, sweep=sweep, fingerprints=fingerprints)
    return overall_exit_code(results)
