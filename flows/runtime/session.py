"""Which Prefect API the CLI's flow runs talk to.

`PREFECT_API_URL` set: that server (it must answer). Not set: the local server that gradebook
commands share (flows.runtime.background_server), started by the first command that needs one and
reused by the later ones; the command that starts it says so in one line, with how to stop it.
The command holds a lease on it for the whole session (flows.runtime.server_leases), so no other
command stops it meanwhile. Prefect's own temporary server would cost its start-up in every
command, prints start/stop lines and shutdown tracebacks into the terminal, and cannot run
schedules.

A server that stops answering under a command (killed, or stopped with `gradebook server stop
--force`) turns the connection error Prefect raises into `ServerLost`: one line saying what
happened and what to run, instead of a page of traceback.

On the way in, runs that a killed gradebook process left Running are marked Crashed
(flows.runtime.run_owner).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flows.runtime.server import PrefectServerError, server_healthy

__all__ = [
    "PrefectUnavailable",
    "ServerLost",
    "in_process_settings",
    "prefect_session",
    "server_lost",
]


class PrefectUnavailable(RuntimeError):
    """PREFECT_API_URL names a server that does not answer."""


class ServerLost(PrefectServerError):
    """The Prefect server a command was using stopped answering while it ran."""


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
        ServerLost: the block failed because its server stopped answering.
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
        with temporary_settings(updates=in_process_settings()), _against(url):
            yield url
        return

    from flows.runtime.background_server import ensure_server, prefect_home
    from flows.runtime.console import waiting
    from flows.runtime.server_leases import holding

    home = prefect_home()
    with holding(home):
        # seconds the first time (the server starts), next to nothing once it runs
        with waiting(
            "waiting for the local Prefect server to start (once; later commands share it)"
        ):
            info = ensure_server(meanwhile=meanwhile, home=home)
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
            _against(info.api_url, pid=info.pid, ticks=info.ticks),
        ):
            yield info.api_url


@contextmanager
def _against(api_url: str, *, pid: int | None = None, ticks: int | None = None) -> Iterator[None]:
    """A block's flows run against the server at `api_url`: its runs left Running by a killed
    command are settled first; a failure to reach the server becomes `ServerLost` (one line);
    and what Prefect holds for the server is sent when the block ends (`flush_to_server`), unless
    the server is gone (then there is nowhere to send it)."""
    _settle_orphans()
    lost = None
    try:
        yield
    except ServerLost as exc:
        lost = exc  # the block found out itself (`gradebook serve` watches the pid)
        raise
    except Exception as exc:
        lost = server_lost(api_url, exc, pid=pid, ticks=ticks)
        if lost is None:
            raise
        raise lost from exc
    finally:
        if lost is None:
            flush_to_server()


def server_lost(
    api_url: str,
    exc: BaseException | None = None,
    *,
    pid: int | None = None,
    ticks: int | None = None,
) -> ServerLost | None:
    """`ServerLost` if the server at `api_url` no longer answers (and `exc`, if given, is a
    failure to reach it), else None.

    Args:
        pid, ticks: the local server's process, to say whether it is gone or hangs; None for a
            server PREFECT_API_URL names.
    """
    if exc is not None and not _unreachable(exc):
        return None
    if server_healthy(api_url, timeout=3.0):
        return None
    import logging
    import sys

    from flows.runtime.procs import alive

    # Prefect's log and event workers print every failed send to stderr, at exit too: the
    # one line below says it all
    logging.raiseExceptions = False
    _drop_unsent()
    words = sys.argv[1:2]
    during = f" during `gradebook {words[0]}`" if words and not words[0].startswith("-") else ""
    url = api_url.removesuffix("/api")
    if pid is None:
        return ServerLost(
            f"the Prefect server at {url} (PREFECT_API_URL) stopped answering{during}; start it "
            "again, then run the command again"
        )
    how = f"pid {pid} is gone" if not alive(pid, ticks) else f"pid {pid} runs but does not answer"
    return ServerLost(
        f"the local Prefect server at {url} stopped answering ({how}){during}; run the command "
        "again (it starts a new server if none is up), or see `gradebook server status`"
    )


def _drop_unsent() -> None:
    """Drop the events and log lines Prefect holds for a server that is gone.

    Its exit-time drain would send each one, and each event retries for ~7 s (ten
    reconnections): a command that lost its server would hang for minutes before it exits.
    Prefect's private queues: if they move, this does nothing and the exit is only slower.
    """
    try:
        from prefect._internal.concurrency.services import _QueueServiceBase

        for service in list(_QueueServiceBase._instances.values()):
            pending = service._queue
            with pending.mutex:  # keep a stop sentinel (None): the drain waits for it
                kept = [item for item in pending.queue if item is None]
                pending.queue.clear()
                pending.queue.extend(kept)
    except Exception:  # noqa: S110 - best effort, see above
        pass


def _unreachable(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it came from, is a failure to reach an HTTP server."""
    import httpx

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, httpx.TransportError | ConnectionError):
            return True
        if isinstance(e, RuntimeError) and "Failed to reach API" in str(e):
            return True
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return False


def _settle_orphans() -> None:
    from flows.runtime.run_owner import settle_orphaned_runs

    try:
        settle_orphaned_runs()
    except Exception:  # noqa: S110 - bookkeeping of older runs must not stop this command
        pass


def flush_to_server(timeout: float = 10.0) -> None:
    """Send the run logs and events this process holds, then stop Prefect's senders.

    Sent while the command still waits, so a run's last log lines and its task runs (which the
    server records from events) are in the UI when the block ends. Stopped, because Prefect
    keeps one event sender per process, bound to the API of the block that first sent: a later
    block against another server (the Python API, a test session) would send its events to the
    first one. And whatever cannot be sent within `timeout` is dropped: Prefect's exit-time drain
    waits on every unsent item with no deadline, and one server gone made a process hang at exit
    for as long as it retried each.
    """
    import asyncio

    try:
        asyncio.get_running_loop()
        return  # called from a coroutine: Prefect's drain would hand back an awaitable
    except RuntimeError:
        pass
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        late = False
        for service in (APILogWorker, EventsWorker):
            _done, pending = service.drain_all(timeout=timeout)
            late = late or bool(pending)
        if late:
            _drop_unsent()
    except Exception:  # noqa: S110 - best effort: losing a log line must not fail the command
        pass
