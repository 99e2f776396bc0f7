"""`gradebook server start|stop|status`: the local Prefect servers gradebook commands share.

Commands that run flows start one themselves when none is up (flows.runtime.background_server);
these commands start it ahead of time, stop it, and list every server of this user with who uses
it (flows.runtime.server_leases).
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any

import typer

from flows.runtime.console import console, err_console, shown

__all__ = ["server_app"]

server_app = typer.Typer(
    help="The local Prefect servers that gradebook commands share (their UI shows every run).",
    no_args_is_help=True,
)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {shown(message)}", soft_wrap=True)
    return typer.Exit(2)


def _api_url_note() -> None:
    url = os.environ.get("PREFECT_API_URL")
    if url:
        console.print(
            f"note: PREFECT_API_URL={url} is set, so gradebook commands use that server, "
            "not this local one",
            soft_wrap=True,
        )


def _line(text: str) -> None:
    console.print(shown(text), soft_wrap=True)


def _since(started_at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at))


def _ago(started_at: float) -> str:
    s = max(0, int(time.time() - started_at))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def _show(facts: dict[str, Any], indent: str = "  ") -> None:
    for name in ("ui", "api", "pid", "uptime", "prefect", "database", "home"):
        if name in facts:
            _line(f"{indent}{name:<10}{facts[name]}")
    for i, user in enumerate(facts.get("users", [])):
        head = "in use by" if i == 0 else ""
        _line(
            f"{indent}{head:<10}{user['checkout']} (`{user['command']}`, pid {user['pid']}, "
            f"since {_since(user['started_at'])})"
        )
    for i, user in enumerate(facts.get("recent", [])):
        head = "last used" if i == 0 else ""
        _line(
            f"{indent}{head:<10}{user['checkout']} (`{user['command']}`, {_ago(user['started_at'])})"
        )


@server_app.command("start")
def start() -> None:
    """Start the local Prefect server now (a no-op if it is up); it keeps running."""
    from flows.runtime.background_server import ensure_server, server_facts
    from flows.runtime.server import PrefectServerError

    try:
        info = ensure_server()
    except PrefectServerError as exc:
        raise _fail(str(exc)) from None
    word = "started" if info.started_here else "already running"
    console.print(f"local Prefect server {word}; `gradebook server stop` stops it")
    _show(server_facts(info.home) or {})
    _api_url_note()


@server_app.command("stop")
def stop(
    force: Annotated[
        bool,
        typer.Option("--force", help="Stop it even while commands use it (they fail, saying so)."),
    ] = False,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Stop every gradebook server of this user that no command uses (with --force: "
            "every one), not only this checkout's.",
        ),
    ] = False,
) -> None:
    """Stop the local Prefect server, unless a command uses it (exit 2); its history stays."""
    from pathlib import Path

    from flows.runtime.background_server import (
        ServerInUse,
        all_servers,
        prefect_home,
        stop_server,
    )
    from flows.runtime.server import PrefectServerError

    homes = [Path(f["home"]) for f in all_servers()] if every else [prefect_home()]
    refused = 0
    stopped_any = False
    for home in homes:
        try:
            info = stop_server(home, force=force)
        except ServerInUse as exc:
            refused += 1
            err_console.print(f"[red]error:[/red] {shown(str(exc))}", soft_wrap=True)
            continue
        except PrefectServerError as exc:
            raise _fail(str(exc)) from None
        if info is not None:
            stopped_any = True
            _line(f"stopped the local Prefect server (pid {info.pid}, {info.ui_url}, home {home})")
    if not stopped_any and not refused:
        where = "for this user" if every else f"(home {prefect_home()})"
        console.print(f"no local Prefect server is running {shown(where)}", soft_wrap=True)
    if refused:
        raise typer.Exit(2)


@server_app.command("status")
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Every local Prefect server of yours: UI, PID, uptime, Prefect, database, who uses it."""
    from flows.runtime.background_server import all_servers, prefect_home

    servers = all_servers()
    home = str(prefect_home())
    mine = next((f for f in servers if f["home"] == home), None)
    others = [f for f in servers if f is not mine]
    state = _state(mine)
    if as_json:
        top = {**(mine or {"home": home}), "state": state}
        typer.echo(json.dumps({**top, "servers": servers}, indent=1))
        return
    if mine is None:
        _line(
            f"local Prefect server: not running (home {home}); the next command that runs a "
            "flow starts it, or `gradebook server start`"
        )
    elif state == "running":
        console.print("local Prefect server: running")
    else:
        _line(f"local Prefect server: leftover ({_why(mine)}); {_next_step(mine)}")
    if mine is not None:
        _show(mine)
    _api_url_note()
    if others:
        console.print()
        console.print(f"other gradebook servers of this user ({len(others)}):")
        for facts in others:
            _line(f"  {_other_state(facts)}")
            _show(facts, indent="    ")


def _state(facts: dict[str, Any] | None) -> str:
    """This checkout's server as `status` has always named it: running, leftover or stopped."""
    if facts is None:
        return "stopped"
    return "running" if facts["state"] == "running" and facts["compatible"] else "leftover"


def _why(facts: dict[str, Any]) -> str:
    if facts["state"] == "gone":
        return f"pid {facts['pid']}: its process is gone"
    if not facts["compatible"]:
        return f"pid {facts['pid']}: it runs Prefect {facts['prefect']}"
    return f"pid {facts['pid']}: it does not answer"


def _next_step(facts: dict[str, Any]) -> str:
    if facts["users"] and facts["state"] != "gone":
        return "commands use it, so it is left running (`gradebook server stop --force` stops it)"
    return "the next command that runs a flow replaces it"


def _other_state(facts: dict[str, Any]) -> str:
    words = [facts["state"]]
    if facts["legacy"]:
        words.append("started by an older gradebook, which records no users")
    elif not facts["compatible"]:
        words.append(f"Prefect {facts['prefect']}: this checkout's commands do not use it")
    return "; ".join(words)
