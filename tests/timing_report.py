"""Where the test suite's time goes: per file, the slowest tests, and the phases of `make test`.

Reads the JUnit XML files pytest wrote (`--junitxml`) and, when given, the phases file the
Makefile's `test` target writes (one `name<TAB>seconds` line per phase: lint, services, each
pytest invocation). A test's time is its setup, call and teardown together, so a module-scoped
fixture is counted in the first test that asked for it.

    python tests/timing_report.py .test-times/*.xml --phases .test-times/phases.tsv
    python tests/timing_report.py run.xml --files 0 --slowest 20      # the 20 slowest only

Prints Markdown tables (they go into docs/development.md as they are).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    file: str  # tests/test_x.py
    name: str  # the test's name with its parameters
    seconds: float
    outcome: str  # passed, failed, error, skipped


def _file_of(classname: str, known: dict[str, str]) -> str:
    """tests.test_x.TestY -> tests/test_x.py: the longest dotted prefix that is a file."""
    if classname in known:
        return known[classname]
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (ROOT / candidate).is_file():
            known[classname] = candidate
            return candidate
    known[classname] = classname
    return classname


def read_cases(paths: list[Path]) -> list[Case]:
    known: dict[str, str] = {}
    cases = []
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed"}.get(child.tag, child.tag)
            cases.append(
                Case(
                    _file_of(case.get("classname", ""), known),
                    case.get("name", ""),
                    float(case.get("time", "0") or 0),
                    outcome,
                )
            )
    return cases


def read_phases(path: Path) -> list[tuple[str, float]]:
    phases = []
    for line in path.read_text().splitlines():
        name, _, seconds = line.partition("\t")
        if seconds:
            phases.append((name, float(seconds)))
    return phases


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def per_file(cases: list[Case]) -> list[str]:
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for c in cases:
        totals[c.file] += c.seconds
        counts[c.file] += 1
    whole = sum(totals.values()) or 1.0
    lines = ["| file | tests | seconds | share |", "|---|---:|---:|---:|"]
    for file, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        share = 100 * seconds / whole
        lines.append(f"| `{file}` | {counts[file]} | {seconds:.1f} | {share:.1f}% |")
    lines.append(f"| **all** | {len(cases)} | {whole:.1f} | 100% |")
    return lines


def slowest(cases: list[Case], n: int) -> list[str]:
    lines = ["| seconds | test |", "|---:|---|"]
    for c in sorted(cases, key=lambda c: -c.seconds)[:n]:
        lines.append(f"| {c.seconds:.1f} | `{c.file}::{c.name}` |")
    return lines


def phases_table(phases: list[tuple[str, float]]) -> list[str]:
    lines = ["| phase | wall time |", "|---|---:|"]
    lines += [f"| {name} | {_clock(seconds)} |" for name, seconds in phases]
    lines.append(f"| **make test** | **{_clock(sum(s for _, s in phases))}** |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", nargs="+", type=Path, help="JUnit XML files written by pytest")
    parser.add_argument("--phases", type=Path, help="the phases file `make test` writes")
    parser.add_argument("--files", type=int, default=-1, help="per-file rows (-1: all, 0: none)")
    parser.add_argument("--slowest", type=int, default=20, help="how many slowest tests")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.xml if not p.is_file()]
    if missing:
        print(
            f"timing_report: no JUnit XML at {', '.join(missing)}: run `make test` first",
            file=sys.stderr,
        )
        return 2
    cases = read_cases(args.xml)
    out: list[str] = []
    if args.phases and args.phases.is_file():
        out += phases_table(read_phases(args.phases)) + [""]
    if args.files:
        rows = per_file(cases)
        if args.files > 0:
            rows = rows[: 2 + args.files] + rows[-1:]
        out += rows + [""]
    if args.slowest:
        out += slowest(cases, args.slowest) + [""]
    outcomes: dict[str, int] = defaultdict(int)
    for c in cases:
        outcomes[c.outcome] += 1
    out.append(", ".join(f"{n} {what}" for what, n in sorted(outcomes.items())))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
