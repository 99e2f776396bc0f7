"""The `gradebook` command line. Each command lives in the module that owns its concern."""

from __future__ import annotations

import typer

from flows.cli_cluster import cluster_app
from flows.cli_gate import register as register_gate_commands
from flows.cli_pipeline import register as register_pipeline_commands
from flows.cli_sandbox import sandbox_app
from flows.cli_server import server_app
from flows.cli_warehouse import register as register_warehouse_commands

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
app.add_typer(server_app, name="server")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
