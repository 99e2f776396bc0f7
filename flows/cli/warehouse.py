"""`gradebook ingest`, `gradebook sql`, `gradebook export`: the warehouse from the shell.

Exit codes: 0 ok; 2 bad input or environment (missing file, not a log, locked or missing
database, bad SQL), each reported as one line on stderr that says what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import typer

from flows.cli.ingest_limits import MaxLogOption, MaxMemberOption, MaxRatioOption, set_limits
from flows.cli.sql_print import OutputFormat, print_rows
from flows.runtime.console import console, terminal_safe
from warehouse import DEFAULT_DB, Warehouse, WarehouseError

DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        envvar="GRADEBOOK_DB",
        help="DuckDB warehouse file (env GRADEBOOK_DB).",
        show_default=True,
    ),
]
LockOption = Annotated[
    float,
    typer.Option(
        "--lock-timeout",
        envvar="GRADEBOOK_LOCK_TIMEOUT",
        help="Seconds to wait while another process holds the database lock.",
    ),
]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _write_problem(exc: BaseException) -> str:
    from warehouse.connection import os_cause

    cause = os_cause(exc) or " ".join(str(exc).split())[:200]
    return f"cannot write the Parquet files ({cause}); pass --parquet another directory"


def ingest(
    logs: Annotated[
        list[str],
        typer.Argument(help="Inspect logs (.eval or .json), or directories of logs, to ingest."),
    ],
    db: DbOption = Path(DEFAULT_DB),
    lock_timeout: LockOption = 5.0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = False,
    max_member_mb: MaxMemberOption = None,
    max_log_mb: MaxLogOption = None,
    max_inflate_ratio: MaxRatioOption = None,
) -> None:
    """Ingest Inspect logs into the warehouse (idempotent; a grown log adds only new samples)."""
    from flows.cli.pipeline import print_skipped
    from warehouse.logs import LogReadError, find_logs

    set_limits(max_member_mb, max_log_mb, max_inflate_ratio)

    try:
        paths, skipped = find_logs(logs)
    except LogReadError as exc:
        raise _fail(str(exc)) from None
    print_skipped(skipped)
    wh = Warehouse(db, lock_timeout_s=lock_timeout)
    try:
        results = wh.ingest_logs(paths, progress=progress)
    except WarehouseError as exc:
        raise _fail(str(exc)) from None
    failed = 0
    for r in results:
        if r.error:
            failed += 1
            for line in r.problems():  # they quote sample ids and names from the log
                typer.echo(f"error: {terminal_safe(line)}", err=True)
        else:
            cancelled = (
                f"; {r.samples_cancelled} cancelled in flight, not generated"
                if r.samples_cancelled
                else ""
            )
            typer.echo(
                f"{r.path}: run {r.run_id} {r.task} {r.model} [{r.status}] "
                f"+{r.samples_added} samples ({r.samples_total} stored{cancelled})"
            )
    if failed:
        raise typer.Exit(2)


def sql(
    query: Annotated[str, typer.Argument(help="SQL to run on a read-only connection.")],
    db: DbOption = Path(DEFAULT_DB),
    fmt: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help="auto: a table if it fits the terminal, else one 'column = value' line per "
            "column (line); csv (escaped on a terminal) and json keep the exact text.",
        ),
    ] = OutputFormat.auto,
    lock_timeout: LockOption = 5.0,
) -> None:
    """Query the warehouse (read-only): `gradebook sql "SELECT * FROM run_metrics"`."""
    wh = Warehouse(db, lock_timeout_s=lock_timeout)
    try:
        with wh.read() as con:
            cursor = con.execute(query)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            rows = cursor.fetchall() if columns else []
    except WarehouseError as exc:
        raise _fail(str(exc)) from None
    except duckdb.Error as exc:
        # DuckDB's message up to the query it quotes (LINE 1: ... ^^^), its hints included
        # ("Did you mean ...?", "Candidate bindings: ..."), on one line
        head = str(exc).strip().split("\n\n", 1)[0]
        first = " ".join(head.split()) or type(exc).__name__
        # DuckDB quotes the value it failed on (a model's answer in a cast): escaped, as a cell
        raise _fail(
            f"query failed: {terminal_safe(first)} (the views are listed in "
            "docs/reference/warehouse.md)"
        ) from None
    print_rows(columns, rows, fmt, console)


def export(
    parquet: Annotated[
        Path, typer.Option("--parquet", help="Directory to write one .parquet file per view.")
    ],
    db: DbOption = Path(DEFAULT_DB),
    lock_timeout: LockOption = 5.0,
) -> None:
    """Export every view (runs, samples, scores, run_metrics, grade_flips, gates, ...) as Parquet."""
    if parquet.exists() and not parquet.is_dir():
        raise _fail(f"{parquet} exists and is not a directory: pass a directory to --parquet")
    wh = Warehouse(db, lock_timeout_s=lock_timeout)
    try:
        written = wh.export_parquet(parquet)
    except WarehouseError as exc:
        raise _fail(str(exc)) from None
    except (OSError, duckdb.Error) as exc:
        raise _fail(f"{parquet}: {_write_problem(exc)}") from None
    for view, path in written.items():
        typer.echo(f"{view}: {path}")


def register(app: typer.Typer) -> None:
    """Add the warehouse commands to the `gradebook` app."""
    app.command("ingest")(ingest)
    app.command("sql")(sql)
    app.command("export")(export)
