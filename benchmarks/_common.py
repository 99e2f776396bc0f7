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
from rich.table import Table


@dataclass
class Row:
    """One measured quantity. `ratio` = value / anchor_value; `bar` says the target in words
    (None, with `meets_bar` None: an informational row)."""

    name: str
    value: float
    unit: str
    anchor: str
    anchor_value: float
    ratio: float
    bar: str | None
    meets_bar: bool | None


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


def emit(title: str, rows: list[Row], json_path: Path | None) -> None:
    table = Table(title=title)
    for col in ("name", "value", "unit", "anchor", "anchor value", "ratio", "bar", "meets bar"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.name,
            f"{r.value:,.3f}",
            r.unit,
            r.anchor,
            f"{r.anchor_value:,.3f}",
            f"{r.ratio:.3f}",
            r.bar or "–",
            "–" if r.meets_bar is None else "yes" if r.meets_bar else "NO",
        )
    Console(width=200).print(table)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"rows": [asdict(r) for r in rows]}, indent=2))
