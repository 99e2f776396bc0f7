"""`gradebook ingest`, `gradebook sql`, `gradebook export`: the warehouse from the shell.

Exit codes: 0 ok; 2 bad input or environment (missing file, not a log, locked or missing
database, bad SQL), each reported as one line on stderr that says what to do.
"""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import duckdb
import typer
from rich.table import Table

from flows.console import console
from warehouse import (
    DEFAULT_DB,
    SchemaTooNew,
    Warehouse,
    WarehouseLocked,
    WarehouseMissing,
)

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


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def ingest(
    logs: Annotated[list[str], typer.Argument(help="Inspect logs (.eval or .json) to ingest.")],
    db: DbOption = Path(DEFAULT_DB),
    lock_timeout: LockOption = 5.0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = False,
) -> None:
    """Ingest Inspect logs into the warehouse (idempotent; a grown log adds only new samples)."""
    wh = Warehouse(db, lock_timeout_s=lock_timeout)
    try:
        results = wh.ingest_logs(logs, progress=progress)
    except (WarehouseLocked, SchemaTooNew) as exc:
        raise _fail(str(exc)) from None
    failed = 0
    for r in results:
        if r.error:
            failed += 1
            for line in r.problems():
                typer.echo(f"error: {line}", err=True)
        else:
            typer.echo(
                f"{r.path}: run {r.run_id} {r.task} {r.model} [{r.status}] "
                f"+{r.samples_added} samples ({r.samples_total} stored)"
            )
    if failed:
        raise typer.Exit(2)


def sql(
    query: Annotated[str, typer.Argument(help="SQL to run on a read-only connection.")],
    db: DbOption = Path(DEFAULT_DB),
    fmt: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = (
        OutputFormat.table
    ),
    lock_timeout: LockOption = 5.0,
) -> None:
    """Query the warehouse (read-only): `gradebook sql "SELECT * FROM run_metrics"`."""
    wh = Warehouse(db, lock_timeout_s=lock_timeout)
    try:
        with wh.read() as con:
            cursor = con.execute(query)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            rows = cursor.fetchall() if columns else []
    except (WarehouseLocked, WarehouseMissing, SchemaTooNew) as exc:
        raise _fail(str(exc)) from None
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _fail(
            f"query failed: {first} (the views are listed in the README (The warehouse))"
        ) from None
    _print_rows(columns, rows, fmt)


def _print_rows(columns: list[str], rows: list[tuple[Any, ...]], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    elif fmt is OutputFormat.json:
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        typer.echo(json.dumps(records, default=str, indent=1))
    else:
        table = Table(*columns, show_lines=False)
        for row in rows:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        console.print(table, soft_wrap=True)
        typer.echo(f"{len(rows)} row{'s' if len(rows) != 1 else ''}")


def export(
    parquet: Annotated[
        Path, typer.Option("--parquet", help="Directory to write one .parquet per table view.")
    ],
    db: DbOption = Path(DEFAULT_DB),
    lock_timeout: LockOption = 5.0,
) -> None:
    """Export runs, samples, messages, verifiers and scores as Parquet files."""
    if parquet.exists() and not parquet.is_dir():
        raise _fail(f"{parquet} exists and is not a directory: pass a directory to --parquet")
    wh = Warehouse(db, lock_timeout_s=lock_timeout)
    try:
        written = wh.export_parquet(parquet)
    except (WarehouseLocked, WarehouseMissing, SchemaTooNew) as exc:
        raise _fail(str(exc)) from None
    for view, path in written.items():
        typer.echo(f"{view}: {path}")


def register(app: typer.Typer) -> None:
    """Add the warehouse commands to the `gradebook` app."""
    app.command("ingest")(ingest)
    app.command("sql")(sql)
    app.command("export")(export)
