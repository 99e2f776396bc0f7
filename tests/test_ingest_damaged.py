"""Damaged logs: one bad sample costs that sample only, and a failed read changes nothing.

Real Inspect logs (mockllm eval() runs) are damaged the way disks and copies damage files: the
stored bytes of one zip member overwritten, one member rewritten with invalid UTF-8 (an encoded
lone surrogate, which Inspect's own reader accepts), the file cut in half. Both readers are
covered: the direct archive reader and Inspect's (direct_read=False).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from warehouse_logs import damage_member, make_log, rewrite_member, truncated

from warehouse import Warehouse

READERS = [pytest.param(True, id="direct"), pytest.param(False, id="inspect-reader")]
GRADEBOOK = [sys.executable, "-m", "flows.cli"]


@pytest.fixture(scope="module")
def base_log(tmp_path_factory) -> Path:
    """6 samples x 2 epochs; q0 and q3 errored at generation time."""
    return Path(make_log(tmp_path_factory.mktemp("logs")).location)


def rows(wh: Warehouse, sql: str, params=None) -> list[tuple]:
    with wh.read() as con:
        return con.execute(sql, params or []).fetchall()


def run_row(wh: Warehouse) -> list[tuple]:
    return rows(
        wh,
        "SELECT log_path, log_sha256, log_size, status, ingest_state, n_samples, n_errors, "
        "ingested_at FROM runs",
    )


def counts(wh: Warehouse) -> tuple:
    return rows(wh, "SELECT (SELECT count(*) FROM samples), (SELECT count(*) FROM messages)")[0]


@pytest.mark.parametrize("direct", READERS)
def test_one_damaged_member_costs_only_its_sample(base_log, tmp_path, direct):
    bad = damage_member(base_log, tmp_path / "bad.eval", "samples/q1_epoch_2.json")
    wh = Warehouse(tmp_path / "g.duckdb")
    [res] = wh.ingest_logs([str(bad)], direct_read=direct)

    assert (res.samples_added, res.samples_total) == (11, 11)
    assert res.error is not None and "1 unreadable sample" in res.error
    [line] = res.bad_samples
    assert line.startswith(f"{bad}: sample q1 epoch 2: unreadable (")
    assert "\n" not in line
    assert rows(wh, "SELECT ingest_state, n_samples FROM runs") == [("partial", 11)]
    stored = {(s, e) for s, e in rows(wh, "SELECT sample_id, epoch FROM samples")}
    assert ("q1", 2) not in stored and len(stored) == 11

    # an undamaged copy completes the run with the missing sample only
    [good] = wh.ingest_logs([str(base_log)], direct_read=direct)
    assert (good.error, good.samples_added, good.samples_total) == (None, 1, 12)
    assert rows(wh, "SELECT ingest_state, n_samples, log_path FROM runs") == [
        ("complete", 12, str(base_log))
    ]


def _encoded_lone_surrogate(data: bytes) -> bytes:
    assert b"The answer is 10" in data
    # UTF-8 encoding of U+D800: invalid UTF-8, but Inspect's whole-sample reader decodes it
    return data.replace(b"The answer is 10", b"The answer is \xed\xa0\x80 10")


@pytest.mark.parametrize("direct", READERS)
def test_a_lone_surrogate_in_a_completion_is_stored(base_log, tmp_path, direct):
    odd = rewrite_member(
        base_log, tmp_path / "odd.eval", "samples/q1_epoch_1.json", _encoded_lone_surrogate
    )
    from inspect_ai.log import read_eval_log

    inspect_sees = {
        (s.id, s.epoch): s.output.completion for s in read_eval_log(str(odd)).samples or []
    }
    assert inspect_sees[("q1", 1)] == "The answer is \ud800 10"  # Inspect's reader accepts it

    wh = Warehouse(tmp_path / "g.duckdb")
    [res] = wh.ingest_logs([str(odd)], direct_read=direct)
    assert (res.error, res.samples_added, res.samples_total) == (None, 12, 12)
    assert rows(wh, "SELECT ingest_state, n_samples FROM runs") == [("complete", 12)]
    # the one character UTF-8 cannot hold becomes U+FFFD; the rest is as written
    assert rows(
        wh,
        "SELECT completion, output->>'completion' FROM samples "
        "WHERE sample_id = 'q1' AND epoch = 1",
    ) == [("The answer is \ufffd 10", "The answer is \ufffd 10")]
    assert rows(
        wh, "SELECT text FROM messages WHERE sample_id = 'q1' AND epoch = 1 AND role = 'assistant'"
    ) == [("The answer is \ufffd 10",)]


@pytest.mark.parametrize("direct", READERS)
def test_reingesting_a_damaged_copy_changes_nothing(base_log, tmp_path, direct):
    wh = Warehouse(tmp_path / "g.duckdb")
    [first] = wh.ingest_logs([str(base_log)], direct_read=direct)
    assert first.error is None
    before, stored = run_row(wh), counts(wh)

    # the same run (eval_id), its bytes damaged in a sample that is already stored
    bad = damage_member(base_log, tmp_path / "copy.eval", "samples/q2_epoch_1.json")
    [res] = wh.ingest_logs([str(bad)], direct_read=direct)
    assert res.error is not None and "nothing else changed" in res.error
    assert str(base_log) in res.error
    [line] = res.bad_samples
    assert line.startswith(f"{bad}: sample q2 epoch 1 (stored from an earlier copy")
    assert run_row(wh) == before  # path, sha256, size, state, counts, even ingested_at
    assert counts(wh) == stored

    # and a truncated copy changes nothing either
    cut = truncated(base_log, tmp_path / "cut.eval")
    [res] = wh.ingest_logs([str(cut)], direct_read=direct)
    assert res.error is not None and "unreadable" in res.error
    assert run_row(wh) == before
    assert counts(wh) == stored


def test_ingest_names_each_unreadable_sample_and_exits_2(base_log, tmp_path):
    bad = damage_member(base_log, tmp_path / "bad.eval", "samples/q4_epoch_1.json")
    cut = truncated(base_log, tmp_path / "cut.eval")
    db = tmp_path / "g.duckdb"
    proc = subprocess.run(
        [*GRADEBOOK, "ingest", "--db", str(db), str(bad), str(cut)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {bad}: sample q4 epoch 1: unreadable (")
    assert lines[1].startswith(f"error: {bad}: 1 unreadable sample(s); 11 stored")
    assert lines[2].startswith(f"error: {cut}: unreadable Inspect log")
    assert len(lines) == 3
