"""`gradebook sql` results on a terminal: hostile text made harmless, wide rows made readable.

Model output is hostile (DESIGN.md, principle 3), and the warehouse is full of it: an answer can
hold a clear-screen or colour escape sequence, a terminal title change, NUL bytes, or text that
looks like rich markup. In the human formats (`table`, `line`) every control character but
newline and tab is shown escaped (`\\x1b`), and cells are plain text, never markup. `csv` keeps
the exact text when it goes to a file or a pipe (another program reads it) and is escaped the
same way on a terminal. `json` is always ASCII: JSON escapes every control and non-ASCII
character itself (`\\u001b`, `\\u202e`), so its exact text is safe on a terminal too.

A table wider than the terminal would fold or cut every column (`SELECT * FROM grade_flips` has
14); the `auto` format then prints one `column = value` line per column instead, a record per
block, like DuckDB's and sqlite's `.mode line`.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from flows.runtime.console import terminal_safe

__all__ = ["OutputFormat", "print_rows"]


class OutputFormat(StrEnum):
    auto = "auto"
    table = "table"
    line = "line"
    csv = "csv"
    json = "json"


def _cell(value: Any) -> str:
    return "NULL" if value is None else terminal_safe(str(value))


def print_rows(
    columns: Sequence[str], rows: Sequence[tuple[Any, ...]], fmt: OutputFormat, console: Console
) -> None:
    """Print a query result in `fmt` (`auto`: a table when it fits the console, else lines)."""
    if fmt is OutputFormat.csv:
        if sys.stdout.isatty():  # escaped as the other formats; a file or a pipe gets exact text
            columns = [terminal_safe(c) for c in columns]
            rows = [tuple(None if v is None else terminal_safe(str(v)) for v in r) for r in rows]
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        return
    if fmt is OutputFormat.json:
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        # ensure_ascii (the default) is what makes this safe on a terminal: keep it
        sys.stdout.write(json.dumps(records, default=str, indent=1, ensure_ascii=True) + "\n")
        return
    names = [terminal_safe(c) for c in columns]
    cells = [[_cell(v) for v in row] for row in rows]
    if fmt is OutputFormat.auto:
        fmt = OutputFormat.table if _fits(names, cells, console.width) else OutputFormat.line
    if fmt is OutputFormat.line:
        _print_lines(names, cells, console)
    else:
        table = Table(*names, show_lines=False)
        for col in table.columns:
            col.overflow = "fold"  # never cut a value: fold it onto the next line
        for row in cells:
            table.add_row(*(Text(v) for v in row))
        console.print(table, soft_wrap=True)
    console.print(f"{len(rows)} row{'s' if len(rows) != 1 else ''}", markup=False)


def _width(text: str) -> int:
    return max((cell_len(line) for line in text.split("\n")), default=0)


def _fits(names: list[str], cells: list[list[str]], width: int) -> bool:
    """Whether a table of these cells, none folded, fits `width` columns (borders included)."""
    widest = [_width(n) for n in names]
    for row in cells:
        widest = [max(w, _width(v)) for w, v in zip(widest, row, strict=True)]
    return sum(widest) + 3 * len(widest) + 1 <= width


def _print_lines(names: list[str], cells: list[list[str]], console: Console) -> None:
    pad = max((cell_len(n) for n in names), default=0)
    for i, row in enumerate(cells):
        if i:
            console.print()
        for name, value in zip(names, row, strict=True):
            label = " " * (pad - cell_len(name)) + name
            # continuation lines of a multi-line value line up under its first line
            text = value.replace("\n", "\n" + " " * (pad + 3))
            console.print(Text(f"{label} = {text}"), soft_wrap=True)
