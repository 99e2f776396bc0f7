"""The scoring-stage benchmark says how busy the machine was, and renders its docs tables from
its --json files (issue 41): a figure taken beside other work says so, and the quiet runs'
tables are generated, never typed in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/ only while its module is imported: left on sys.path, its warehouse.py would shadow
# the warehouse package in every grading worker this test session starts later (they take the
# session's sys.path)
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    from _machine import QUIET_LOAD, load_note, machine_state
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

BUSY = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


@pytest.mark.serial
def test_the_machine_state_lists_busy_processes_that_are_not_the_benchmarks_own():
    """Alone (serial): on a machine loaded by other workers, a 1 s sample may find the detached
    loop starved below the busy mark."""
    # a busy loop of this process's own (a child) and one that is not (detached: its parent
    # exits at once, so it is nobody's descendant here)
    own = subprocess.Popen([sys.executable, "-c", BUSY])
    detached = subprocess.run(
        # without this session's PREFECT_HOME, which marks a process as the benchmark's own
        ["sh", "-c", f'env -u PREFECT_HOME "{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!',
         BUSY],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    other = int(detached.stdout.strip())
    try:
        # sample once the detached loop is spinning (its interpreter has started)
        deadline = time.monotonic() + 60
        while _cpu_ticks(other) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        state = machine_state(sample_s=1.0)
        pids = {p["pid"] for p in state["busy"]}
        assert len(state["load"]) == 3
        assert own.pid not in pids
        # the detached loop is busy enough to be listed, unless five busier ones were (a
        # loaded machine): then the list is full
        assert other in pids or len(state["busy"]) == 5
    finally:
        own.kill()
        own.wait()
        os.kill(other, 9)


def test_a_row_measured_on_a_busy_machine_says_so():
    busy = {"load": [QUIET_LOAD + 1.2, 1.0, 1.0], "busy": [{"pid": 1, "cpu_pct": 97.0,
                                                          "command": "pytest tests"}]}  # fmt: skip
    quiet = {"load": [QUIET_LOAD / 2, 0.1, 0.1], "busy": []}
    assert load_note([quiet, quiet]) is None
    note = load_note([quiet, busy])
    assert note is not None and "not a quiet machine" in note and "pytest tests" in note
    # between a benchmark's own rounds the load is its own anchors' work: other processes judge
    after_anchors = {"load": [QUIET_LOAD + 1.5, 1.0, 1.0], "busy": []}
    assert load_note([after_anchors]) is not None
    assert load_note([after_anchors, after_anchors], by_load=False) is None
    note = load_note([after_anchors, busy], by_load=False)
    assert note is not None and "97 % of a core" in note and "pytest tests" in note


def _round(load: float, split_s: float, flow_s: float) -> dict:
    timeline = {"prefect_start": 0.2, "before_first_chunk": 1.0, "grading": flow_s - 1.5,
                "after_last_result": 0.25, "prefect_end": 0.05}  # fmt: skip
    return {
        "machine": {"load": [load, load, load], "busy": []},
        "bare_s": 2 * split_s, "split_s": split_s, "flow_s": flow_s,
        "flow_vs_split": split_s / flow_s,
        "flow_phases": {"seconds": flow_s, "timeline": timeline,
                        "steps": {"read the samples to grade": 0.5, "last write": 0.3},
                        "counts": {}, "cpu": {"this process": 2.5}},
    }  # fmt: skip


def test_the_docs_tables_are_rendered_from_the_json_files(tmp_path: Path):
    runs = []
    for k, rounds in enumerate([[(0.1, 8.0, 9.5), (0.2, 8.2, 9.9), (0.3, 8.1, 9.6)],
                                [(0.2, 8.0, 11.0), (2.5, 8.0, 12.0), (0.1, 8.0, 11.5)]]):  # fmt: skip
        path = tmp_path / f"run{k}.json"
        path.write_text(json.dumps({
            "rows": [],
            "run": {"samples": 200_000, "workers": 2, "repeats": 3, "quick": False,
                    "commit": f"abc{k}", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "extraction_s": 0.4, "peak_rss_mb": 1100.0, "inspect_ratio": 40.0},
            "machine_at_start": {"load": [0.1, 0.1, 0.1], "busy": []},
            "load_at_end": [0.2, 0.2, 0.2],
            "rounds": [_round(*r) for r in rounds],
        }))  # fmt: skip
        runs.append(path)
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scoring_stage.py"), "--markdown",
         *map(str, runs)], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    summary = [line for line in lines if line.startswith(("| 1 (abc0)", "| 2 (abc1)"))]
    # one row per run (the medians: 8.1 / 9.6, 8.0 / 11.5), then one per round
    assert "**0.84×** | yes |" in summary[0]
    assert "**0.70×** | no, not quiet |" in summary[1]  # a round began at load 2.5
    assert sum("(abc1) | 2 | 2.50 *" in line for line in lines) == 1
    assert len(summary) == 2 + 6
    assert any(line.startswith("| read the samples out of the warehouse | 0.50 | 0.50 |")
               for line in lines)  # fmt: skip

    missing = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scoring_stage.py"), "--markdown",
         str(tmp_path / "nope.json")], capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode == 2 and "nope.json" in missing.stderr
