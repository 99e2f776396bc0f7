"""Which Prefect API the CLI's flow runs talk to.

`PREFECT_API_URL` set: that server (it must answer). Not set: a local `prefect server start` in
a subprocess for the duration of the command, its output kept out of the terminal, its database
in PREFECT_HOME (so migrations run once per machine, not per command). Prefect's own temporary
server would cost the same but prints start/stop lines and shutdown tracebacks into the
terminal and cannot run schedules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.server import local_server, server_healthy

__all__ = ["PrefectUnavailable", "in_process_settings", "prefect_session"]


class PrefectUnavailable(RuntimeError):
    """PREFECT_API_URL names a server that does not answer."""


def _home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def in_process_settings() -> dict[str, Any]:
    """Prefect setting updates for flows run in this process (the CLI's, the tests').

    No flow-run heartbeats: Prefect's heartbeat thread sleeps in 1 s steps and every flow run
    joins it on exit, which costs up to a second per flow and subflow run (an empty flow run:
    1.2 s with heartbeats, 0.1-0.2 s without, measured against a local server). Heartbeats let
    an automation mark the runs of a dead worker Crashed; cluster deployments turn them on in
    their job env (flows/cluster_setup.py), and a run in this process has no worker to lose.
    An explicit PREFECT_FLOWS_HEARTBEAT_FREQUENCY is respected.
    """
    if {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY"} & set(
        os.environ
    ):
        return {}
    return {"flows.heartbeat_frequency": None}


@contextmanager
def prefect_session(
    *, ui: bool = False, meanwhile: Callable[[], object] | None = None
) -> Iterator[str]:
    """Yield the API URL flows in this block use, starting a local server if none is set.

    `meanwhile` runs while a local server boots (a sweep loads its tasks then), else first.

    Raises:
        PrefectUnavailable: PREFECT_API_URL is set but nothing answers there.
    """
    from prefect.settings import temporary_settings

    url = os.environ.get("PREFECT_API_URL")
    if url:
        if meanwhile is not None:
            meanwhile()
        if not server_healthy(url, timeout=5.0):
            raise PrefectUnavailable(
                f"PREFECT_API_URL={url} does not answer: start that server "
                "(`prefect server start`) or unset PREFECT_API_URL to use a local one"
            )
        with temporary_settings(updates=in_process_settings()):
            yield url
        return

    with local_server(home=_home(), ui=ui, meanwhile=meanwhile) as api_url:
        os.environ["PREFECT_API_URL"] = api_url
        try:
            with temporary_settings(updates={"api.url": api_url, **in_process_settings()}):
                try:
                    yield api_url
                finally:
                    _drain_logs()
        finally:
            os.environ.pop("PREFECT_API_URL", None)


def _drain_logs() -> None:
    # Run logs are shipped to the API in the background; send them before the server stops,
    # or the handler prints "Error logging to API" at interpreter exit.
    try:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)
    except Exception:  # noqa: S110 - best effort: losing a log line must not fail the command
        pass
