"""Which Prefect API the CLI's flow runs talk to.

`PREFECT_API_URL` set: that server (it must answer). Not set: the local server that gradebook
commands share (flows.runtime.background_server), started by the first command that needs one and
reused by the later ones; the command that starts it says so in one line, with how to stop it.
Prefect's own temporary server would cost its start-up in every command, prints start/stop
lines and shutdown tracebacks into the terminal, and cannot run schedules.

On the way in, runs that a killed gradebook process left Running are marked Crashed
(flows.runtime.run_owner).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flows.runtime.server import server_healthy

__all__ = ["PrefectUnavailable", "in_process_settings", "prefect_session"]


class PrefectUnavailable(RuntimeError):
    """PREFECT_API_URL names a server that does not answer."""


def in_process_settings() -> dict[str, Any]:
    """Prefect setting updates for flows run in this process (the CLI's, the tests').

    No flow-run heartbeats: Prefect's heartbeat thread sleeps in 1 s steps and every flow run
    joins it on exit, which costs up to a second per flow and subflow run. Heartbeats let
    an automation mark the runs of a dead worker Crashed; cluster deployments turn them on in
    their job env (flows/cluster/setup.py), and a run in this process that is killed is marked
    Crashed by the next command instead (flows.runtime.run_owner). An explicit
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY is respected.
    """
    if {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY"} & set(
        os.environ
    ):
        return {}
    return {"flows.heartbeat_frequency": None}


@contextmanager
def prefect_session(*, meanwhile: Callable[[], object] | None = None) -> Iterator[str]:
    """Yield the API URL flows in this block use, starting the shared local server if needed.

    `meanwhile` runs while a local server boots (a sweep loads its tasks then), else first.

    Raises:
        PrefectUnavailable: PREFECT_API_URL is set but nothing answers there.
        flows.runtime.server.PrefectServerError: the local server could not be started.
    """
    from prefect.settings import temporary_settings

    from flows.runtime.envvars import environ_set

    url = os.environ.get("PREFECT_API_URL")
    if url:
        if meanwhile is not None:
            meanwhile()
        if not server_healthy(url, timeout=5.0):
            raise PrefectUnavailable(
                f"PREFECT_API_URL={url} does not answer: start that server "
                "(`prefect server start`) or unset PREFECT_API_URL to use gradebook's local one"
            )
        with temporary_settings(updates=in_process_settings()):
            _settle_orphans()
            yield url
        return

    from flows.runtime.background_server import ensure_server
    from flows.runtime.console import waiting

    # seconds the first time (the server starts), next to nothing once it runs
    with waiting("waiting for the local Prefect server to start (once; later commands share it)"):
        info = ensure_server(meanwhile=meanwhile)
    if info.started_here:
        from flows.runtime.console import err_console

        err_console.print(
            f"gradebook: started a local Prefect server for this and later commands "
            f"(UI {info.ui_url}, pid {info.pid}); `gradebook server stop` stops it",
            soft_wrap=True,
            highlight=False,
        )
    with (
        environ_set({"PREFECT_API_URL": info.api_url}),
        temporary_settings(updates={"api.url": info.api_url, **in_process_settings()}),
    ):
        _settle_orphans()
        try:
            yield info.api_url
        finally:
            _drain_logs()


def _settle_orphans() -> None:
    from flows.runtime.run_owner import settle_orphaned_runs

    try:
        settle_orphaned_runs()
    except Exception:  # noqa: S110 - bookkeeping of older runs must not stop this command
        pass


def _drain_logs() -> None:
    # Run logs are shipped to the API in the background: send them while this process still
    # waits, so the last lines of a run are in the UI when the command returns.
    try:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)
    except Exception:  # noqa: S110 - best effort: losing a log line must not fail the command
        pass
