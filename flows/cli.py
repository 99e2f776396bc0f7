"""The `gradebook` command line. Each command lives in the module that owns its concern."""

from __future__ import annotations

import typer
from rich.markup import escape

from flows.cli_cluster import cluster_app
from flows.cli_gate import register as register_gate_commands
from flows.cli_pipeline import register as register_pipeline_commands
from flows.cli_reward import reward_app
from flows.cli_sandbox import sandbox_app
from flows.cli_warehouse import register as register_warehouse_commands
from flows.console import err_console

app = typer.Typer(
    name="gradebook",
    help="Generate-then-score LLM evals: Inspect generation, verifiable scoring, DuckDB history.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

register_warehouse_commands(app)
register_gate_commands(app)
register_pipeline_commands(app)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(cluster_app, name="cluster")
app.add_typer(reward_app, name="reward")


def main() -> None:
    from warehouse import WarehouseError

    try:
        app()
    except WarehouseError as exc:
        # every command maps these to one line itself; this is the net for a path that does not
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
