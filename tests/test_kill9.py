"""kill -9 at several points of `gradebook ingest` and `gradebook score`: no score is lost or
doubled, the DuckDB file always opens again (its WAL replayed where the kill left one), and
after running the same command again every count is right, with no process, container or
temporary directory left behind.

Each case runs the real CLI in a real process (tests/killpoint.py) and SIGKILLs it at a chosen
point: inside a write transaction before its COMMIT, right after a COMMIT (before the
connection is closed, so the commit is in the WAL only), or on entering a function. The
sandbox case is killed from outside, while containers run infinite loops. Each case adds a row
to the kill table (printed at the end of the module; also written to $GRADEBOOK_KILL_TABLE).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker_kit
import duckdb
import psutil
import pytest
from process_kit import wait_for
from warehouse_logs import make_log

pytestmark = pytest.mark.slow

KILLPOINT = Path(__file__).with_name("killpoint.py")
N = 2000  # 1000 ids x 2 epochs; every 7th id errored at generation: 4 ingest batches of 500
TABLE: list[dict] = []


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> str:
    return make_log(tmp_path_factory.mktemp("logs"), n=N // 2, boom_every=7).location


def gradebook(
    where: str, args: list[str], tmp: Path, *, wait: bool = True
) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    cmd = [sys.executable, str(KILLPOINT), where, str(tmp / "killed.json"), *args]
    env = {**os.environ, "TMPDIR": str(tmpdir), "COLUMNS": "200"}
    if not wait:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def counts(db: Path) -> dict:
    """What the file holds, read the way any user would (a fresh read-only open)."""
    if not db.exists():  # killed before it was created
        return {"samples": 0, "messages": 0, "sample_dupes": 0, "scores": 0, "score_dupes": 0,
                "run": [], "grades": set()}  # fmt: skip
    con = duckdb.connect(str(db), read_only=True)
    try:
        one = lambda sql: con.execute(sql).fetchone()[0]  # noqa: E731
        return {
            "samples": one("SELECT count(*) FROM wh.samples"),
            "messages": one("SELECT count(*) FROM wh.messages"),
            "sample_dupes": one(
                "SELECT count(*) - count(DISTINCT (run_id, sample_id, epoch)) FROM wh.samples"
            ),
            "scores": one("SELECT count(*) FROM wh.scores"),
            "score_dupes": one(
                "SELECT count(*) - count(DISTINCT (run_id, sample_id, epoch, scorer, "
                "fingerprint, attempt)) FROM wh.scores"
            ),
            "run": con.execute("SELECT ingest_state, n_samples FROM wh.runs").fetchall(),
            "grades": set(
                con.execute(
                    "SELECT sample_id, epoch, status, value, reason FROM wh.scores"
                ).fetchall()
            ),
        }
    finally:
        con.close()


def survivors(pids: list[int], timeout_s: float = 30) -> int:
    """How many of `pids` are still running after waiting up to `timeout_s` for them to end."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return len(alive)
        time.sleep(0.2)


def leftovers(tmp: Path, db: Path) -> int:
    """Temporary files and directories the commands left: in their TMPDIR, and DuckDB's
    next to the file (a WAL not checkpointed, a spill directory)."""
    left = list((tmp / "tmpdir").iterdir())
    left += [p for p in db.parent.iterdir() if p.name.startswith(db.name) and p != db]
    return len(left)


@pytest.fixture(scope="module")
def reference(log, tmp_path_factory, prefect_api) -> dict:
    """The same log ingested and scored without a kill."""
    tmp = tmp_path_factory.mktemp("reference")
    db = tmp / "ref.duckdb"
    for args in (["ingest", log], ["score", log, "--verifier", "math"]):
        proc = gradebook("none", [*args, "--db", str(db)], tmp)
        assert proc.returncode == 0, proc.stderr
    return counts(db)


def record(
    point: str, command: str, after_kill: dict, wal: bool, rerun: dict, *, children: int,
    left: int, containers: str, temp_left: int,
) -> None:  # fmt: skip
    TABLE.append(
        {
            "command": command,
            "kill point": point,
            "after kill: samples / scores": f"{after_kill['samples']} / {after_kill['scores']}",
            "WAL replayed": "yes" if wal else "-",
            "after re-run: samples": rerun["samples"],
            "scores": rerun["scores"],
            "duplicates": rerun["sample_dupes"] + rerun["score_dupes"],
            "processes at kill -> left": f"{children} -> {left}",
            "containers at kill -> left": containers,
            "temp dirs left": temp_left,
        }
    )


def kill_and_rerun(where: str, args: list[str], tmp: Path, db: Path) -> tuple[dict, bool, int, int]:
    killed = gradebook(where, [*args, "--db", str(db)], tmp)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    report = json.loads((tmp / "killed.json").read_text())
    wal = Path(f"{db}.wal").exists()
    after_kill = counts(db)  # opens again (a WAL is replayed)
    left = survivors(report["children"])
    again = gradebook("none", [*args, "--db", str(db)], tmp)
    assert again.returncode == 0, again.stderr[-2000:]
    return after_kill, wal, len(report["children"]), left


INGEST_POINTS = [
    ("reading the log, nothing written", "call:warehouse.logs:file_digest:1"),
    ("run row written; batch 1 inserted, not committed", "write:2:before"),
    ("batch 1 committed, in the WAL only", "write:2:after"),
    ("batch 3 inserted, not committed", "write:4:before"),
    ("last batch committed (run complete), in the WAL only", "write:5:after"),
]


@pytest.mark.parametrize(("point", "where"), INGEST_POINTS, ids=[w for _, w in INGEST_POINTS])
def test_kill_9_during_ingest(point, where, log, tmp_path, reference, prefect_api):
    """The first case takes up to 60 s: it also builds the module's 2,000-sample log and the
    reference (that log ingested and scored without a kill)."""
    db = tmp_path / "g.duckdb"
    after_kill, wal, children, left = kill_and_rerun(where, ["ingest", log], tmp_path, db)
    assert after_kill["sample_dupes"] == 0
    assert after_kill["samples"] % 500 == 0 and after_kill["samples"] <= N  # whole batches only
    if where.endswith(":after"):
        assert wal, "the kill was meant to leave the commit in the WAL"
    # the same command again finishes the run, scoring it then gives the reference grades
    score = gradebook("none", ["score", log, "--db", str(db), "--verifier", "math"], tmp_path)
    assert score.returncode == 0, score.stderr[-2000:]
    rerun = counts(db)
    assert rerun["run"] == [("complete", N)]
    assert (rerun["samples"], rerun["messages"]) == (N, reference["messages"])
    assert rerun["grades"] == reference["grades"] and rerun["scores"] == N
    assert rerun["sample_dupes"] == rerun["score_dupes"] == 0
    assert left == 0
    temp_left = leftovers(tmp_path, db)
    assert temp_left == 0
    record(point, "ingest", after_kill, wal, rerun, children=children, left=left,
           containers="-", temp_left=temp_left)  # fmt: skip


SCORE_POINTS = [
    ("verifier fingerprint inserted, not committed", "write:1:before"),
    ("first score batch committed, in the WAL only", "write:2:after"),
    ("a later score batch inserted, not committed", "write:4:before"),
    ("3rd chunk back from the workers, not written (workers mid-chunk)",
     "call:flows.score_writes:BatchWriter.__call__:3"),
]  # fmt: skip


@pytest.mark.parametrize(("point", "where"), SCORE_POINTS, ids=[w for _, w in SCORE_POINTS])
def test_kill_9_during_score(point, where, log, tmp_path, reference, prefect_api):
    db = tmp_path / "g.duckdb"
    ingest = gradebook("none", ["ingest", log, "--db", str(db)], tmp_path)
    assert ingest.returncode == 0, ingest.stderr
    after_kill, wal, children, left = kill_and_rerun(
        where, ["score", log, "--verifier", "math"], tmp_path, db
    )
    assert after_kill["score_dupes"] == 0 and after_kill["scores"] < N
    assert after_kill["grades"] <= reference["grades"]  # what was written is right
    if where.endswith(":after"):
        assert wal, "the kill was meant to leave the commit in the WAL"
    rerun = counts(db)
    assert rerun["grades"] == reference["grades"]  # nothing lost, nothing different
    assert rerun["scores"] == N and rerun["score_dupes"] == 0
    assert (rerun["samples"], rerun["sample_dupes"]) == (N, 0)
    assert left == 0, "a grading worker or helper outlived the killed command"
    temp_left = leftovers(tmp_path, db)
    assert temp_left == 0
    record(point, "score", after_kill, wal, rerun, children=children, left=left,
           containers="-", temp_left=temp_left)  # fmt: skip


LOOP = "```python\ndef {entry}(*args, **kwargs):\n    while True:\n        pass\n```"


@pytest.mark.docker
def test_kill_9_of_score_while_sandboxed_tests_loop(docker_sandbox, prefect_api, tmp_path):
    import docker
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    from tasks.code import humaneval, humaneval_problems

    entries = {p["prompt"]: p["entry_point"] for p in humaneval_problems()[:2]}

    def loop_forever(input, tools, tool_choice, config):  # noqa: A002 - Inspect's signature
        prompt = " ".join(str(getattr(m, "text", m)) for m in input)
        entry = next(e for p, e in entries.items() if p in prompt)
        out = ModelOutput.from_content("mockllm/model", LOOP.format(entry=entry))
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return out

    [generated] = inspect_eval(
        humaneval(limit=2), model=get_model("mockllm/model", custom_outputs=loop_forever),
        log_dir=str(tmp_path / "logs"), display="none", score=False,
    )  # fmt: skip
    db = tmp_path / "g.duckdb"
    args = ["score", generated.location, "--db", str(db), "--verifier", "unit_tests"]
    client = docker.from_env()

    def tree() -> set[int]:
        return {proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))}

    proc = gradebook("none", args, tmp_path, wait=False)
    try:
        deadline = time.monotonic() + 300
        while not docker_kit.owned(client, docker_kit.owners_of(tree())):
            assert proc.poll() is None and time.monotonic() < deadline, "no sandbox started"
            time.sleep(0.2)
        wait_for(
            lambda: any(
                docker_kit.running_submissions(client, c) >= 1
                for c in docker_kit.owned(client, docker_kit.owners_of(tree()))
            ),
            120,
            "the first test's infinite loop running in its container",
        )
        owners = tree()
        # the labels of this command's processes, taken while they live (a label names the
        # process's start time, so another session's containers never count here)
        labels = docker_kit.owners_of(owners)
        at_kill = len(docker_kit.owned(client, labels))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    left = survivors(sorted(owners - {proc.pid}))
    docker_kit.wait_gone_after_kill(client, labels, 30)
    containers_left = len(docker_kit.owned(client, labels))
    assert left == 0
    after_kill = counts(db)
    again = gradebook("none", args, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    rerun = counts(db)
    # an infinite loop is the submission's failure: scored 0 with reason timeout, once each
    assert {(s, st, v, r) for s, _, st, v, r in rerun["grades"]} == {
        (s, "scored", 0.0, "timeout") for s in ("HumanEval/0", "HumanEval/1")
    }
    assert rerun["scores"] == 2 and rerun["score_dupes"] == 0
    temp_left = leftovers(tmp_path, db)
    assert temp_left == 0
    record("infinite loops running in sandbox containers (kill -9 from outside)", "score",
           after_kill, False, rerun, children=len(owners) - 1, left=left,
           containers=f"{at_kill} -> {containers_left}", temp_left=temp_left)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def kill_table():
    yield
    if not TABLE:
        return
    columns = list(TABLE[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in TABLE]
    text = "\n".join(lines)
    print("\n" + text)
    if path := os.environ.get("GRADEBOOK_KILL_TABLE"):
        Path(path).write_text(text + "\n")
