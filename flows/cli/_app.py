"""The `gradebook` command line. Each command lives in the module that owns its concern."""

from __future__ import annotations

import typer

from flows.cli.cluster import cluster_app
from flows.cli.demo import register as register_demo_command
from flows.cli.gate import register as register_gate_commands
from flows.cli.pipeline import register as register_pipeline_commands
from flows.cli.reward import reward_app
from flows.cli.sandbox import sandbox_app
from flows.cli.scoring import rescore, score, verifiers
from flows.cli.server import server_app
from flows.cli.warehouse import register as register_warehouse_commands
from flows.runtime.console import err_console, shown

app = typer.Typer(
    name="gradebook",
    help="Generate-then-score LLM evals: Inspect generation, verifiable scoring, DuckDB history.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

register_warehouse_commands(app)
register_gate_commands(app)
register_pipeline_commands(app, scoring=(score, rescore, verifiers))
register_demo_command(app)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(cluster_app, name="cluster")
app.add_typer(reward_app, name="reward")
app.add_typer(server_app, name="server")


def main() -> None:
    from flows.runtime.server import PrefectServerError
    from warehouse import WarehouseError

    try:
        app()  # in standalone mode it always ends with SystemExit
    except (WarehouseError, PrefectServerError) as exc:
        # every command maps these to one line itself (a local Prefect server that could not
        # start or went away: flows.runtime.session); this is the net for a path that does not
        err_console.print(f"[red]error:[/red] {shown(str(exc))}", soft_wrap=True)
        _exit(2)
        raise SystemExit(2) from None
    except SystemExit as exc:
        _exit(exc.code)
        raise


def _exit(code: object) -> None:
    """End the process without tearing every module down, where nothing is lost by that.

    With Prefect and Inspect loaded, the interpreter's shutdown (clearing thousands of modules
    and objects) costs CPU that no command needs. The atexit handlers still run
    (Prefect ships its last run logs and events there) and the streams are flushed; with a
    non-daemon thread still alive, which a normal exit would wait for (or a profiler or debugger
    attached), it returns and the caller exits normally.
    """
    import atexit
    import os
    import sys
    import threading

    if not isinstance(code, int | type(None)) or sys.getprofile() or sys.gettrace():
        return  # a message for Python to print; a profiler or debugger that reports at exit
    atexit._run_exitfuncs()
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.current_thread()
    ):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


if __name__ == "__main__":
    main()
