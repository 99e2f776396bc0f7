"""Prefect's own scale-out machinery for gradebook: work pools, deployments, crash detection, workers.

`setup_cluster` (what `gradebook cluster setup` runs, against PREFECT_API_URL) is idempotent:

- two process work pools, `gpu` (generation) and `cpu` (scoring);
- the deployments `cluster-generate/<pool>` and `cluster-score/<pool>`. By default they name
  the flows by module (`flows.cluster.work.cluster_generate`) with no pull step: a worker runs
  them from the gradebook installed in its own environment, wherever that is, so hosts share no
  path (Prefect's first way to give a deployment its code: in the runtime). Given a `source`
  (a directory every host has at the same path, or a git URL), they are deployed from it
  instead (Prefect's pull steps: the worker fetches the code before each run);
- an automation that marks a cluster flow run Crashed when its heartbeats stop. A worker host
  that dies takes its flow runs with it and nobody reports their end; this is Prefect's documented
  remedy, and the dispatcher retries a Crashed chunk.

`worker_command` is how a host joins a pool: `prefect worker start` with the poll interval
lowered from Prefect's 10 s (each generate -> score hop waits up to one poll per stage).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "CLUSTER_TAG",
    "CRASH_AUTOMATION",
    "DEFAULT_POOLS",
    "GENERATE_FLOW",
    "HEARTBEAT_S",
    "SCORE_FLOW",
    "ClusterSetup",
    "deployment_name",
    "setup_cluster",
    "worker_command",
    "worker_env",
]

GENERATE_FLOW, SCORE_FLOW = "cluster-generate", "cluster-score"
DEFAULT_POOLS = {"gpu": GENERATE_FLOW, "cpu": SCORE_FLOW}
CLUSTER_TAG = "gradebook-cluster"
CRASH_AUTOMATION = "gradebook: crash cluster runs whose heartbeats stopped"
# Prefect's floor for flow-run heartbeats is 30 s; a run is declared dead after 2.5 missed ones'
# worth of silence, so a slow host is not mistaken for a dead one.
HEARTBEAT_S = 30
CRASH_AFTER_S = 75
POLL_S = 2.0

_ENTRYPOINTS = {
    GENERATE_FLOW: "flows/cluster/work.py:cluster_generate",
    SCORE_FLOW: "flows/cluster/work.py:cluster_score",
}
_FLOW_OBJECTS = {GENERATE_FLOW: "cluster_generate", SCORE_FLOW: "cluster_score"}


def deployment_name(flow_name: str, pool: str) -> str:
    """The `flow/deployment` name `run_deployment` takes: one deployment per (flow, pool)."""
    return f"{flow_name}/{pool}"


@dataclass(frozen=True)
class ClusterSetup:
    """What `setup_cluster` made sure exists."""

    api_url: str
    pools: list[str]
    deployments: list[str]
    automation: str


def _process_template() -> dict[str, Any]:
    from prefect.workers.process import ProcessWorker

    return ProcessWorker.get_default_base_job_template()


def _ensure_pool(client: Any, name: str) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    try:
        pool = client.read_work_pool(name)
    except ObjectNotFound:
        pool = None
    if pool is not None:
        # an existing pool is kept whatever its type: a Docker or Kubernetes pool made from
        # infra/cluster/templates runs the same deployments (its image has gradebook installed)
        return
    try:
        client.create_work_pool(
            WorkPoolCreate(name=name, type="process", base_job_template=_process_template())
        )
    except ObjectAlreadyExists:  # another host's setup got there first
        pass


def _crash_automation() -> Any:
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=CRASH_AUTOMATION,
        description="A gradebook cluster run whose worker host died stops sending heartbeats; "
        "mark it Crashed so the sweep retries its chunk.",
        trigger=EventTrigger(
            # armed by the Running state too, which the server records itself: a host that dies
            # before its run's first heartbeat reached the server (its events client connects
            # in the background, seconds later on a loaded host) would leave the run Running
            after={"prefect.flow-run.heartbeat", "prefect.flow-run.Running"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            # only gradebook's cluster runs: they are the ones sending heartbeats this often
            match_related=ResourceSpecification(
                {"prefect.resource.id": f"prefect.tag.{CLUSTER_TAG}"}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=CRASH_AFTER_S),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {CRASH_AFTER_S}s: the worker host is gone",
            )
        ],
    )


def _ensure_crash_automation(client: Any) -> str:
    automation = _crash_automation()
    for existing in client.read_automations_by_name(CRASH_AUTOMATION):
        # one an older gradebook made is brought up to date, keeping its id
        if existing.trigger.model_dump() != automation.trigger.model_dump() or [
            a.model_dump() for a in existing.actions
        ] != [a.model_dump() for a in automation.actions]:
            automation.id = existing.id
            automation.update()
        return str(existing.id)
    return str(automation.create().id)


def _deploy(flow_name: str, pool: str, source: Path | str | None) -> str:
    from prefect import Flow
    from prefect.deployments.runner import EntrypointType

    if source is None:
        # the installed package: the worker imports `flows.cluster.work`; no path, no pull step
        from flows.cluster import work

        flow = getattr(work, _FLOW_OBJECTS[flow_name])
        how: dict[str, Any] = {"entrypoint_type": EntrypointType.MODULE_PATH}
    else:
        flow = Flow.from_source(source=str(source), entrypoint=_ENTRYPOINTS[flow_name])
        how = {}
    deployment = flow.to_deployment(
        name=pool,
        **how,
        work_pool_name=pool,
        tags=[CLUSTER_TAG, "gradebook"],
        # every cluster run heartbeats at Prefect's fastest rate, which the crash automation needs
        job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}},
        description=f"gradebook {flow_name} on the {pool!r} work pool",
    )
    deployment.apply()
    return deployment_name(flow_name, pool)


def setup_cluster(
    *,
    generate_pools: list[str] | None = None,
    score_pools: list[str] | None = None,
    source: Path | str | None = None,
) -> ClusterSetup:
    """Create the work pools, deployments and crash automation on the Prefect server (idempotent).

    Args:
        generate_pools: pools that run generation (default ["gpu"]); a model's `work_pool`
            in the sweep config picks one.
        score_pools: pools that run score chunks (default ["cpu"]).
        source: where workers fetch the flows' code before each run: a directory at the same
            path on every worker host, or a git URL (Prefect's `from_source`). Default: none,
            the gradebook installed in each worker's environment.

    Raises:
        RuntimeError: PREFECT_API_URL is not set.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    if not api_url:
        raise RuntimeError(
            "PREFECT_API_URL is not set: start the server (infra/cluster/start_server.sh) and "
            "export PREFECT_API_URL=http://<server>:4200/api"
        )
    gen = generate_pools or ["gpu"]
    score = score_pools or ["cpu"]
    if isinstance(source, Path):
        source = source.resolve()
    with get_client(sync_client=True) as client:
        for pool in dict.fromkeys(gen + score):
            _ensure_pool(client, pool)
        automation = _ensure_crash_automation(client)
    deployments = [_deploy(GENERATE_FLOW, p, source) for p in gen]
    deployments += [_deploy(SCORE_FLOW, p, source) for p in score]
    return ClusterSetup(str(api_url), list(dict.fromkeys(gen + score)), deployments, automation)


def worker_env(api_url: str | None = None, *, poll_s: float = POLL_S) -> dict[str, str]:
    """Environment for a worker process: the server, a short poll, quiet telemetry."""
    env = {
        "PREFECT_WORKER_QUERY_SECONDS": f"{poll_s:g}",
        "PREFECT_WORKER_PREFETCH_SECONDS": f"{max(poll_s, 1.0):g}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def worker_command(pool: str, *, name: str | None = None, limit: int | None = None) -> list[str]:
    """`prefect worker start` for a process pool (run it with `worker_env()` added).

    Args:
        pool: the work pool to serve ("gpu" or "cpu").
        name: the worker's name in the UI (default: Prefect's, from the host name).
        limit: flow runs this worker runs at once (a CPU host: 1, each chunk uses every core).
    """
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]
    if name:
        cmd += ["--name", name]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd
