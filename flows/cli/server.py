"""`gradebook server start|stop|status`: the local Prefect server gradebook commands share.

Commands that run flows start it themselves when none is up (flows.runtime.background_server); these
commands start it ahead of time, stop it, and say where its UI, process and database are.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from flows.runtime.console import console, err_console

if TYPE_CHECKING:
    from flows.runtime.background_server import ServerInfo

__all__ = ["server_app"]

server_app = typer.Typer(
    help="The local Prefect server that gradebook commands share (its UI shows every run).",
    no_args_is_help=True,
)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(2)


def _api_url_note() -> None:
    url = os.environ.get("PREFECT_API_URL")
    if url:
        console.print(
            f"note: PREFECT_API_URL={url} is set, so gradebook commands use that server, "
            "not this local one",
            soft_wrap=True,
        )


def _show(info: ServerInfo | None, as_json: bool, state: str) -> None:
    from flows.runtime.background_server import describe

    facts = describe(info) if info is not None else {}
    if as_json:
        typer.echo(json.dumps({"state": state, **facts}, indent=1))
        return
    for name in ("ui", "api", "pid", "uptime", "database", "home"):
        if name in facts:
            console.print(f"  {name:<9}{escape(str(facts[name]))}", soft_wrap=True)


@server_app.command("start")
def start() -> None:
    """Start the local Prefect server now (a no-op if it is up); it keeps running."""
    from flows.runtime.background_server import ensure_server
    from flows.runtime.server import PrefectServerError

    try:
        info = ensure_server()
    except PrefectServerError as exc:
        raise _fail(str(exc)) from None
    word = "started" if info.started_here else "already running"
    console.print(f"local Prefect server {word}; `gradebook server stop` stops it")
    _show(info, False, "running")
    _api_url_note()


@server_app.command("stop")
def stop() -> None:
    """Stop the local Prefect server (its run history stays in its database)."""
    from flows.runtime.background_server import prefect_home, stop_server
    from flows.runtime.server import PrefectServerError

    try:
        info = stop_server()
    except PrefectServerError as exc:
        raise _fail(str(exc)) from None
    if info is None:
        console.print(f"no local Prefect server is running (home {prefect_home()})")
    else:
        console.print(f"stopped the local Prefect server (pid {info.pid}, {info.ui_url})")


@server_app.command("status")
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Is the local Prefect server up: its UI URL, PID, uptime and database."""
    from flows.runtime.background_server import find_server, leftover, prefect_home

    info = find_server()
    if info is not None:
        if not as_json:
            console.print("local Prefect server: running")
        _show(info, as_json, "running")
        if not as_json:
            _api_url_note()
        return
    old = leftover()
    if old is not None:
        if not as_json:
            from flows.runtime.background_server import current_key

            if not old.alive():
                why = "its process is gone"
            elif old.key is not None and old.key != current_key():
                why = "another gradebook or Prefect version started it"
            else:
                why = "it does not answer"
            console.print(
                f"local Prefect server: leftover (pid {old.pid}: {why}); the next command "
                "that runs a flow replaces it",
                soft_wrap=True,
            )
        _show(old, as_json, "leftover")
        return
    if as_json:
        typer.echo(json.dumps({"state": "stopped", "home": str(prefect_home())}, indent=1))
        return
    console.print(
        f"local Prefect server: not running (home {prefect_home()}); the next command that "
        "runs a flow starts it, or `gradebook server start`",
        soft_wrap=True,
    )
    _api_url_note()
