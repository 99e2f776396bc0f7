"""Log ingest on real Inspect logs: mockllm eval() runs and the older logs in ../shared/data/logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warehouse_logs import make_log, reader_holding, variant

from warehouse import Warehouse, WarehouseLocked
from warehouse.logs import LogReadError, file_digest


@pytest.fixture(scope="module")
def base_log(tmp_path_factory):
    """6 samples x 2 epochs; samples q0 and q3 error at generation time."""
    return make_log(tmp_path_factory.mktemp("logs"))


def rows(wh: Warehouse, sql: str, params=None) -> list[tuple]:
    with wh.read() as con:
        return con.execute(sql, params or []).fetchall()


def test_ingest_keeps_runs_samples_messages_and_errors(base_log, tmp_path):
    wh = Warehouse(tmp_path / "g.duckdb")
    [res] = wh.ingest_logs([base_log.location])
    assert res.error is None
    assert (res.run_id, res.samples_added, res.samples_total) == (base_log.eval.eval_id, 12, 12)

    [run] = rows(
        wh,
        "SELECT task, model, status, epochs, n_samples, n_errors, ingest_state, log_sha256 "
        "FROM runs",
    )
    assert run[:7] == ("arith", "mockllm/model", "success", 2, 12, 4, "complete")
    assert len(run[7]) == 64

    errored = rows(wh, "SELECT sample_id, epoch, error FROM samples WHERE error IS NOT NULL")
    assert sorted((s, e) for s, e, _ in errored) == [("q0", 1), ("q0", 2), ("q3", 1), ("q3", 2)]
    assert all("mock provider failure" in err for _, _, err in errored)

    [ok] = rows(
        wh,
        "SELECT input, target, completion, input_tokens, output_tokens, metadata->>'topic', "
        "n_messages, total_time IS NOT NULL FROM samples WHERE sample_id = 'q1' AND epoch = 2",
    )
    assert ok == ("question 1", ["10"], "The answer is 10", 10, 5, "arith", 2, True)
    msgs = rows(
        wh,
        "SELECT idx, role, text FROM messages WHERE sample_id = 'q1' AND epoch = 2 ORDER BY idx",
    )
    assert msgs == [(0, "user", "question 1"), (1, "assistant", "The answer is 10")]


def test_reingest_is_a_noop(base_log, tmp_path):
    wh = Warehouse(tmp_path / "g.duckdb")
    wh.ingest_logs([base_log.location])
    before = rows(wh, "SELECT count(*) FROM samples UNION ALL SELECT count(*) FROM messages")
    [again] = wh.ingest_logs([base_log.location])
    assert (again.samples_added, again.samples_total, again.error) == (0, 12, None)
    after = rows(wh, "SELECT count(*) FROM samples UNION ALL SELECT count(*) FROM messages")
    assert after == before
    assert rows(wh, "SELECT count(*) FROM runs") == [(1,)]


def test_reingest_answers_while_another_process_reads(base_log, tmp_path):
    # a no-op re-ingest needs no write lock: a reader elsewhere (a notebook, `gradebook sql`)
    # does not make it wait; a log with new samples does wait, and loses nothing
    path = variant(base_log, tmp_path / "r.eval", eval_id="read1", keep=5)
    wh = Warehouse(tmp_path / "g.duckdb", lock_timeout_s=0.5)
    wh.ingest_logs([path])
    with reader_holding(wh.path):
        [again] = wh.ingest_logs([path])
        assert (again.samples_added, again.samples_total, again.error) == (0, 5, None)
        variant(base_log, path, eval_id="read1")
        with pytest.raises(WarehouseLocked):
            wh.ingest_logs([path])
    [grown] = wh.ingest_logs([path])
    assert (grown.samples_added, grown.samples_total) == (7, 12)


def test_grown_log_adds_only_new_samples(base_log, tmp_path):
    # a resumed run: same eval_id, the log rewritten with more samples (and a new status)
    short = variant(base_log, tmp_path / "grow.eval", eval_id="grow1", keep=5, status="cancelled")
    wh = Warehouse(tmp_path / "g.duckdb")
    [first] = wh.ingest_logs([short])
    assert (first.status, first.samples_added) == ("cancelled", 5)
    first_ingest = rows(wh, "SELECT sample_id, epoch, ingested_at FROM samples")

    variant(base_log, tmp_path / "grow.eval", eval_id="grow1", status="success")
    [second] = wh.ingest_logs([tmp_path / "grow.eval"])
    assert (second.status, second.samples_added, second.samples_total) == ("success", 7, 12)
    assert rows(wh, "SELECT status, n_samples, ingest_state FROM runs") == [
        ("success", 12, "complete")
    ]
    # the five samples stored first were not rewritten
    kept = rows(wh, "SELECT sample_id, epoch, ingested_at FROM samples")
    assert set(first_ingest) <= set(kept)
    assert rows(wh, "SELECT count(*), count(DISTINCT (sample_id, epoch)) FROM samples") == [
        (12, 12)
    ]


def test_cancelled_log_is_ingested_with_its_status(base_log, tmp_path):
    path = variant(base_log, tmp_path / "c.eval", eval_id="cancel1", keep=3, status="cancelled")
    wh = Warehouse(tmp_path / "g.duckdb")
    [res] = wh.ingest_logs([path])
    assert (res.status, res.samples_added, res.error) == ("cancelled", 3, None)
    assert rows(wh, "SELECT status, n_samples FROM runs") == [("cancelled", 3)]


def test_corrupt_and_missing_logs_are_reported_and_the_others_continue(base_log, tmp_path):
    corrupt = tmp_path / "corrupt.eval"
    corrupt.write_bytes(Path(base_log.location).read_bytes()[:700])
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("hello")
    wh = Warehouse(tmp_path / "g.duckdb")
    results = wh.ingest_logs([corrupt, tmp_path / "gone.eval", not_a_log, base_log.location])
    errors = [r.error for r in results]
    assert "unreadable Inspect log" in errors[0] and "\n" not in errors[0]
    assert "no such file" in errors[1]
    assert "not an Inspect log" in errors[2]
    assert errors[3] is None and results[3].samples_added == 12
    assert rows(wh, "SELECT count(*) FROM runs") == [(1,)]


def test_a_log_gone_before_it_is_hashed_is_a_one_line_error(tmp_path):
    # ingest hashes after reading the header: a log removed in between is reported, not raised
    gone = tmp_path / "gone.eval"
    with pytest.raises(LogReadError, match=r"gone\.eval: unreadable file \(FileNotFoundError"):
        file_digest(str(gone))


def test_json_log_ingests_the_same_rows_as_eval(base_log, tmp_path):
    as_json = tmp_path / "same.json"
    variant(base_log, as_json, eval_id=base_log.eval.eval_id)
    a, b = Warehouse(tmp_path / "a.duckdb"), Warehouse(tmp_path / "b.duckdb")
    a.ingest_logs([base_log.location])
    b.ingest_logs([as_json])
    query = (
        "SELECT run_id, sample_id, epoch, input, target, completion, error IS NULL, metadata, "
        "input_tokens FROM samples ORDER BY ALL"
    )
    assert rows(a, query) == rows(b, query)
    mquery = "SELECT sample_id, epoch, idx, role, text FROM messages ORDER BY ALL"
    assert rows(a, mquery) == rows(b, mquery)


def test_sample_can_be_rescored_after_its_log_is_gone(base_log, tmp_path):
    moved = tmp_path / "moved.eval"
    moved.write_bytes(Path(base_log.location).read_bytes())
    wh = Warehouse(tmp_path / "g.duckdb")
    wh.ingest_logs([moved])
    moved.unlink()
    todo = wh.samples_to_score("math", "digest-1").to_pylist()
    assert len(todo) == 12
    q1 = next(t for t in todo if t["sample_id"] == "q1" and t["epoch"] == 1)
    assert q1["completion"] == "The answer is 10" and q1["target"] == ["10"]
    assert json.loads(q1["metadata"]) == {"level": 1, "topic": "arith"}
    [(output, store)] = rows(
        wh, "SELECT output, store FROM samples WHERE sample_id = 'q1' AND epoch = 1"
    )
    assert json.loads(output)["completion"] == "The answer is 10"
    assert json.loads(store) == {}


def test_every_shared_reference_log_ingests(shared_data, tmp_path):
    paths = sorted(p for p in (shared_data / "logs").iterdir() if p.suffix in {".eval", ".json"})
    wh = Warehouse(tmp_path / "g.duckdb")
    results = wh.ingest_logs(paths)
    assert [r.error for r in results] == [None] * len(paths), [r.error for r in results]
    by_name = {Path(r.path).name: r for r in results}
    assert by_name["2025-05-12T20-28-13-04-00_no-samples.json"].samples_total == 0
    assert by_name["2025-05-12T20-28-13-04-00_no-samples.json"].status == "cancelled"
    assert (
        by_name["2025-02-11T15-17-00-05-00_popularity_dPiJifoWeEQBrfWsAopzWr.eval"].samples_added
        == 10
    )
    # a .json log without dataset.sample_ids (Inspect's streaming reader refuses it) still loads
    assert by_name["log_tool_call_error.json"].samples_total == 1
    tool_msgs = rows(wh, "SELECT count(*) FROM messages WHERE role = 'tool'")
    assert tool_msgs[0][0] >= 11
    # log_formats.eval and .json are the same run: the second adds nothing
    assert by_name["log_formats.json"].run_id == by_name["log_formats.eval"].run_id
    assert rows(wh, "SELECT count(*) FROM samples WHERE run_id = 'FDENXLYYaukMN6EbfnNHvk'") == [
        (1,)
    ]
    assert all(r.samples_added == 0 for r in wh.ingest_logs(paths))


_KILLABLE = """
import sys
from warehouse import Warehouse
wh = Warehouse(sys.argv[1])
for path in sys.argv[2:]:
    r = wh.ingest_logs([path], batch_size=7)
    print(r[0].run_id, flush=True)
"""


@pytest.mark.slow
def test_kill_9_during_ingest_then_rerun_loses_nothing_and_doubles_nothing(base_log, tmp_path):
    logs = [variant(base_log, tmp_path / f"run{i}.eval", eval_id=f"kill{i:02d}") for i in range(12)]
    db = tmp_path / "g.duckdb"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLABLE, str(db), *map(str, logs)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    # wait until a few logs are fully in, then kill somewhere inside the next ones
    for _ in range(4):
        assert proc.stdout.readline(), "ingest subprocess ended early"
    time.sleep(0.15)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    wh = Warehouse(db)
    state = rows(wh, "SELECT run_id, ingest_state, n_samples FROM runs ORDER BY run_id")
    assert 4 <= len(state) <= 12
    complete = [r for r in state if r[1] == "complete"]
    assert len(complete) >= 4
    # consistent: counts agree with rows, every stored sample has all its messages
    for run_id, ingest_state, n in state:
        stored = rows(wh, "SELECT count(*) FROM samples WHERE run_id = ?", [run_id])[0][0]
        assert stored == n if ingest_state == "complete" else stored <= 12
        if ingest_state == "complete":
            assert n == 12
    assert rows(
        wh,
        "SELECT count(*) FROM samples s WHERE n_messages <> (SELECT count(*) FROM messages m "
        "WHERE m.run_id = s.run_id AND m.sample_id = s.sample_id AND m.epoch = s.epoch)",
    ) == [(0,)]

    results = wh.ingest_logs(logs)
    assert [r.error for r in results] == [None] * 12
    assert rows(wh, "SELECT count(*), count(DISTINCT run_id) FROM runs") == [(12, 12)]
    assert rows(wh, "SELECT DISTINCT ingest_state, n_samples FROM runs") == [("complete", 12)]
    assert rows(wh, "SELECT count(*), count(DISTINCT (run_id, sample_id, epoch)) FROM samples") == [
        (144, 144)
    ]
    assert rows(
        wh, "SELECT count(*), count(DISTINCT (run_id, sample_id, epoch, idx)) FROM messages"
    ) == [(12 * 12 * 2 - 12 * 4, 12 * 12 * 2 - 12 * 4)]
