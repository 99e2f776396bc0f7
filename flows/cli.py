"""The `gradebook` command line. Each command lives in the module that owns its concern."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gradebook",
    help="Generate-then-score LLM evals: Inspect generation, verifiable scoring, DuckDB history.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()
