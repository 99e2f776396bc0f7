"""The benchmarks' result rows say what they measured: a bar and its verdict, information with
neither, or a bar this run is too small to judge ("see the full run") with no verdict.

A row that only informs but reads `meets_bar: true`, or a --quick run too small for its bar that
passes or fails it anyway, would let `benchmarks/*.py --quick --json` report bars as met (or
missed) that no run measured.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))

from benchmarks._common import SEE_FULL_RUN, Row, emit, info, judged  # noqa: E402

KEYS = {"name", "value", "unit", "anchor", "anchor_value", "ratio", "bar", "meets_bar"}


def _check_rows(rows: list[dict]) -> None:
    """The JSON contract of a benchmark's rows."""
    assert rows
    for row in rows:
        assert set(row) - {"note"} == KEYS, row  # a note is written only when there is one
        if row["bar"] is None:
            assert row["meets_bar"] is None, row  # information is not a pass
        elif row["meets_bar"] is None:
            assert SEE_FULL_RUN in row["bar"], row  # unjudged says where it is judged
        else:
            assert isinstance(row["meets_bar"], bool), row


def test_rows_are_written_and_printed_as_bar_information_or_see_the_full_run(tmp_path, capsys):
    rows = [
        Row("judged", 2.0, "x", "anchor", 1.0, 2.0, ">= 1.5x", True),
        Row("missed", 1.0, "x", "anchor", 1.0, 1.0, ">= 1.5x", False),
        info("informs", 3.0, "s", "anchor", 1.0, 3.0),
        judged("too small", 0.5, "x", "anchor", 1.0, 0.5, ">= 3x", False, judge=False),
    ]
    out = tmp_path / "rows.json"
    emit("contract", rows, out)
    written = json.loads(out.read_text())["rows"]
    _check_rows(written)
    by_name = {r["name"]: r for r in written}
    assert by_name["informs"]["bar"] is None and by_name["informs"]["meets_bar"] is None
    assert by_name["too small"]["meets_bar"] is None
    assert by_name["too small"]["bar"] == f">= 3x: {SEE_FULL_RUN}"
    assert by_name["judged"]["meets_bar"] is True and by_name["missed"]["meets_bar"] is False
    table = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines()
             if line.count("│") > 2}  # fmt: skip
    assert table["informs"].rstrip(" │").endswith("info")
    assert table["too small"].rstrip(" │").endswith(SEE_FULL_RUN)
    assert table["judged"].rstrip(" │").endswith("yes")
    assert table["missed"].rstrip(" │").endswith("NO")


@pytest.mark.parametrize(
    ("bar", "meets"),
    [(None, True), (None, False), (">= 3x", None)],
    ids=["information-passing", "information-failing", "unjudged-without-saying-why"],
)
def test_a_row_that_would_misreport_its_bar_is_refused(bar, meets):
    with pytest.raises(ValueError, match="bar"):
        Row("row", 1.0, "x", "anchor", 1.0, 1.0, bar, meets)


def _row_calls(path: Path) -> list[tuple[int, ast.expr | None, ast.expr | None]]:
    """(line, bar argument, meets_bar argument) of every `Row(...)` written in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Row":
            kw = {k.arg: k.value for k in node.keywords}
            bar = node.args[6] if len(node.args) > 6 else kw.get("bar")
            meets = node.args[7] if len(node.args) > 7 else kw.get("meets_bar")
            found.append((node.lineno, bar, meets))
    return found


def _leading_text(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return first.value if isinstance(first, ast.Constant) else ""
    return ""


@pytest.mark.parametrize(
    "script", sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
)
def test_no_benchmark_row_passes_a_bar_it_does_not_have(script):
    """A bar in words that is no bar ("informational", "reported") or a verdict that cannot
    fail (a literal True) is information dressed as a met bar: those rows use `info(...)`."""
    for line, bar, meets in _row_calls(BENCHMARKS / script):
        text = _leading_text(bar).lower()
        assert not text.startswith(("informational", "reported")), (
            f"{script}:{line}: bar {text!r} is information: use info(...)"
        )
        assert not (isinstance(meets, ast.Constant) and meets.value is True), (
            f"{script}:{line}: meets_bar is always True"
        )


def test_a_quick_benchmark_run_writes_rows_that_keep_the_contract(shared_data, tmp_path):
    """A real --quick run (the cheapest benchmark) writes rows its readers can rely on."""
    out = tmp_path / "speed.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "verifier_speed.py"), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    _check_rows(rows)
    assert any(r["bar"] is None for r in rows) and any(r["meets_bar"] is not None for r in rows)
