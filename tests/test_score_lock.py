"""A reader holding the warehouse does not throw away a score run's graded work.

A real `gradebook score` process grades a real log with a test verifier whose samples `q7`
wait on a gate file, so the test knows when results are in the scorer's hands: the first
batch is written, then a real read-only DuckDB connection is held open from another process
(`reader_holding`), the gate opens and the gated chunks finish while the file is locked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest
from warehouse_logs import make_log, reader_holding

pytestmark = pytest.mark.slow

N_SAMPLES = 600  # 300 ids x 2 epochs: three chunks, two of them hold q7

VERIFIER = textwrap.dedent(
    '''
    """gated_check: every sample scores 1.0 after 10 ms (so a chunk takes over the 1 s between
    writes and is written as it arrives); q7 waits until the gate file exists (test only)."""
    import os, time
    from scorers.grade import SampleView, scored
    from scorers.registry import Verifier, register

    GATE = {gate!r}


    def grade(view: SampleView):
        time.sleep(0.01)
        while view.sample_id == "q7" and not os.path.exists(GATE):
            time.sleep(0.02)
        return scored(1.0, answer="x", explanation="ok", reason="verified_equal")


    register(Verifier("gated_check", grade, module="gated_check", params={{}}, label="test"))
    '''
)

CLI = """
import sys
sys.path.insert(0, sys.argv[1])
import gated_check  # registers the verifier
from flows.cli import main
sys.argv = ["gradebook", *sys.argv[2:]]
main()
"""


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> str:
    return make_log(tmp_path_factory.mktemp("logs"), n=N_SAMPLES // 2, boom_every=0).location


def start_score(tmp_path: Path, log: str, *args: str, env: dict[str, str] | None = None):
    gate = tmp_path / "gate"
    (tmp_path / "gated_check.py").write_text(VERIFIER.format(gate=str(gate)))
    db = tmp_path / "g.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, str(tmp_path), "score", log, "--db", str(db),
         "--verifier", "gated_check", "--workers", "2", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip
    return proc, db, gate


def scores_written(db: Path) -> int:
    """Rows in the scores table, or -1 while the file is locked or not there yet."""
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error:
        return -1
    try:
        return con.execute("SELECT count(*) FROM wh.scores").fetchone()[0]
    except duckdb.Error:
        return -1
    finally:
        con.close()


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g}s: {what}")
        time.sleep(0.2)


def test_a_writer_waits_for_a_reader_with_its_graded_results_in_hand(prefect_api, tmp_path, log):
    """Up to 110 s on a loaded machine: the reader holds the file past the 5 s default wait
    (8 s), and the first test of the module generates its 600-sample log."""
    # the timeout from the environment (score used to ignore it and wait 5 s)
    proc, db, gate = start_score(tmp_path, log, env={"GRADEBOOK_LOCK_TIMEOUT": "60"})
    try:
        wait_for(lambda: scores_written(db) > 0, 300, "the first batch written")
        first = scores_written(db)
        assert 0 < first < N_SAMPLES
        with reader_holding(db):
            gate.touch()  # the gated chunks finish now, while the file is locked
            # held past the 5 s default, but within the 60 s asked for
            time.sleep(8)
            assert proc.poll() is None, proc.communicate()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert scores_written(db) == N_SAMPLES  # every result, each once
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute(
        "SELECT count(*) FROM (SELECT DISTINCT run_id, sample_id, epoch FROM wh.scores)"
    ).fetchone() == (N_SAMPLES,)


def test_a_writer_that_gives_up_says_what_was_kept_and_lost(prefect_api, tmp_path, log):
    proc, db, gate = start_score(tmp_path, log, "--lock-timeout", "2")
    try:
        wait_for(lambda: scores_written(db) > 0, 300, "the first batch written")
        with reader_holding(db) as reader:
            gate.touch()
            out, err = proc.communicate(timeout=120)  # gives up on its own, reader still there
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, out + err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.strip()]
    assert f"is locked by process {reader.pid}" in line
    kept = int(line.split("gave up with ")[1].split(" graded result(s) written")[0])
    lost = int(line.split(" written and ")[1].split(" graded but not written")[0])
    assert kept == scores_written(db) > 0  # what it says was kept is what the file holds
    assert lost > 0 and kept + lost == N_SAMPLES

    # run again: only the lost ones are graded, nothing is doubled
    proc, db, _ = start_score(tmp_path, log)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert scores_written(db) == N_SAMPLES
