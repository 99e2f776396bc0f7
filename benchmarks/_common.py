"""Shared benchmark plumbing: timing, the result row, the rich table and the --json file.

Every benchmark reports RATIOS against an anchor measured in the same run, because the machine
is shared and absolute numbers move with whoever else is running.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# what a row says when this run is too small to judge its bar (a --quick run's fixed costs)
SEE_FULL_RUN = "see the full run"


@dataclass
class Row:
    """One measured quantity. `ratio` = value / anchor_value; `bar` says the target in words.

    A row that only informs has neither a bar nor a verdict (`bar` and `meets_bar` None); a
    row whose bar this run is too small to judge keeps its bar, names the full run in it, and
    gives no verdict (`meets_bar` None). Either way it is not a miss.
    """

    name: str
    value: float
    unit: str
    anchor: str
    anchor_value: float
    ratio: float
    bar: str | None
    meets_bar: bool | None
    # what a reader must know to take the figure at its word, e.g. that the machine was not
    # quiet while it was measured (benchmarks/_machine.py `load_note`); written only when set
    note: str | None = None

    def __post_init__(self) -> None:
        # a verdict without a bar, or a bar left unjudged without saying where it is judged,
        # would read as a pass (or a miss) the run did not measure
        if self.bar is None and self.meets_bar is not None:
            raise ValueError(f"{self.name}: an informational row (bar None) has no verdict")
        if self.bar is not None and self.meets_bar is None and SEE_FULL_RUN not in self.bar:
            raise ValueError(f"{self.name}: bar {self.bar!r} is left unjudged without saying "
                             f"{SEE_FULL_RUN!r}")  # fmt: skip
        if self.meets_bar is not None:
            self.meets_bar = bool(self.meets_bar)


def info(name: str, value: float, unit: str, anchor: str, anchor_value: float,
         ratio: float) -> Row:  # fmt: skip
    """A row that informs: no bar, no verdict."""
    return Row(name, value, unit, anchor, anchor_value, ratio, None, None)


def judged(name: str, value: float, unit: str, anchor: str, anchor_value: float, ratio: float,
           bar: str, meets: bool, *, judge: bool = True) -> Row:  # fmt: skip
    """A row with a bar; with `judge` False (a run too small for it) the bar stands, says
    "see the full run", and the row gives no verdict."""
    if judge:
        return Row(name, value, unit, anchor, anchor_value, ratio, bar, meets)
    return Row(name, value, unit, anchor, anchor_value, ratio, f"{bar}: {SEE_FULL_RUN}", None)


def verdict(row: Row) -> str:
    """The table's "meets bar" cell."""
    if row.bar is None:
        return "info"
    if row.meets_bar is None:
        return SEE_FULL_RUN
    return "yes" if row.meets_bar else "NO"


def stage_args(description: str, quick_help: str, quick_n: int, full_n: int = 20_000):
    """The options of a benchmark that runs the scoring stage: --quick, --samples, --json,
    --workers; returns (args, sample count)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    return args, args.samples or (quick_n if args.quick else full_n)


def use_bench_prefect(cache: Path) -> None:
    """Flows run against a local server whose home is under `cache`, so its database is
    migrated once (like a user's), and never against a server the environment points at.
    gradebook's own cache (the installed distributions a fingerprint names) is under `cache`
    too: the shared ~/.cache/gradebook is rewritten by every other checkout's runs, so each
    run would pay the scan a user's second command does not."""
    os.environ["PREFECT_HOME"] = str(cache / "prefect-home")
    os.environ["GRADEBOOK_CACHE_DIR"] = str(cache / "gradebook-cache")
    os.environ.pop("PREFECT_API_URL", None)


def best_of(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Smallest wall time of `repeat` calls (the least disturbed by other load), and a result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def row_json(row: Row) -> dict[str, Any]:
    """A row as the --json file holds it (`note` only when there is one)."""
    out = asdict(row)
    if out["note"] is None:
        del out["note"]
    return out


def emit(
    title: str, rows: list[Row], json_path: Path | None, extra: dict[str, Any] | None = None
) -> None:
    """Print the rows as a table and write them to `json_path` (with `extra`'s keys beside
    "rows": what a benchmark records besides its rows, e.g. each round's machine state)."""
    table = Table(title=title)
    for col in ("name", "value", "unit", "anchor", "anchor value", "ratio", "bar", "meets bar"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.name + (escape(f" [{r.note}]") if r.note else ""),
            f"{r.value:,.3f}",
            r.unit,
            r.anchor,
            f"{r.anchor_value:,.3f}",
            f"{r.ratio:.3f}",
            r.bar or "–",
            verdict(r),
        )
    Console(width=200).print(table)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"rows": [row_json(r) for r in rows], **(extra or {})}
        json_path.write_text(json.dumps(doc, indent=2))
