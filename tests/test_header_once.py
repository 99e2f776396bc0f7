"""A `score` command reads each log's header from its file once, in one module, and passes it
along: the early start, the verifier plan, ingest and the scored copy ask for it again and get
the copy read first (warehouse.zip_members, warehouse.logs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

PROBE = Path(__file__).with_name("header_probe.py")


def _score(tmp_path: Path, logs: list[Path], *extra: str) -> list[dict[str, str]]:
    report = tmp_path / "reads.json"
    cmd = [sys.executable, str(PROBE), str(report), "score", *map(str, logs),
           "--db", str(tmp_path / "w.duckdb"), *extra]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(report.read_text())


def test_a_score_command_reads_each_header_once(shared_data: Path, tmp_path: Path) -> None:
    # an archive log and a JSON log, both scored by their own Inspect scorer (`match`), which
    # also brings in the early start's header read (the warm process decision)
    logs = []
    for name in ("log_formats.eval", "log_formats.json"):
        logs.append(tmp_path / name)
        shutil.copy(shared_data / "logs" / name, logs[-1])
    reads = _score(tmp_path, logs, "--scored-logs", str(tmp_path / "scored"))
    per_log = Counter(r["path"] for r in reads)
    assert set(per_log) == {str(p) for p in logs}, reads
    assert all(n == 1 for n in per_log.values()), f"a header was read more than once: {reads}"
    readers = {r["by"] for r in reads}
    assert readers == {"warehouse.logs"}, f"header read outside warehouse.logs: {reads}"
