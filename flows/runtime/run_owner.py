"""Which process runs a flow run, so a run whose process is gone is not "Running" forever.

Every gradebook flow labels its run, as it starts running, with the process running it
(`gradebook.process = host:pid:start-ticks`, an `on_running` hook). A run whose process was
killed (SIGKILL, OOM, a machine that went down) never reports an end; the next gradebook command
that talks to Prefect (`settle_orphaned_runs`) finds runs still Running or Cancelling whose
process on this host is gone and marks them Crashed (Cancelled for those being cancelled).
Runs of other hosts are left to Prefect's own heartbeat automation (flows/cluster/setup.py).

A flow run that `gradebook serve` started (a subprocess of its Prefect runner) also asks the
kernel to stop it when the runner exits, so a runner killed outright leaves no flow run working
on behind it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection
from typing import Any

from flows.runtime.procs import ProcessId, die_with_parent, this_process

__all__ = ["OWNER_LABEL", "RUNNER_PID_ENV", "record_owner", "settle_orphaned_runs"]

OWNER_LABEL = "gradebook.process"
# set by `gradebook serve`'s runner process (flows/serve.py) for the flow runs it starts
RUNNER_PID_ENV = "GRADEBOOK_RUNNER_PID"


def record_owner(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect `on_running` hook: label the run with this process (see the module doc)."""
    runner = os.environ.get(RUNNER_PID_ENV)
    if runner and runner.isdigit() and int(runner) == os.getppid():
        die_with_parent(signal.SIGTERM, parent=int(runner))
    try:
        from prefect.context import SyncClientContext

        with SyncClientContext.get_or_create() as ctx:
            ctx.client.update_flow_run_labels(flow_run.id, {OWNER_LABEL: str(this_process())})
    except Exception:  # noqa: S110 - a label is bookkeeping: it must never fail the run
        pass


def settle_orphaned_runs(
    *, owners: Collection[str] | None = None, message: str | None = None
) -> list[Any]:
    """Mark the flow runs whose process on this host is gone: Crashed if they were Running,
    Cancelled if they were Cancelling.

    Args:
        owners: only runs of these processes (`ProcessId` strings), and these end Cancelled
            whatever state they were in: their owner was stopped on purpose.
        message: the state message (default: says the process is gone).

    Returns:
        The runs whose state was set.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    settled = []
    states = FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.CANCELLING])
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=states)), limit=200
        )
        for run in runs:
            owner = ProcessId.parse(str((run.labels or {}).get(OWNER_LABEL, "")))
            if owner is None or not owner.local or owner.alive():
                continue
            if owners is not None and str(owner) not in owners:
                continue
            why = message or (
                f"its process ({owner.pid} on {owner.host}) is gone; marked by gradebook"
            )
            cancelled = owners is not None or run.state_type == StateType.CANCELLING
            state = Cancelled(message=why) if cancelled else Crashed(message=why)
            client.set_flow_run_state(run.id, state, force=True)
            settled.append(run)
    return settled
