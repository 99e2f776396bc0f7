"""Sandbox scorers re-score from the log: the agent's workspace captured at generation (the
generate stage's real eval() runs), restored into a fresh container at scoring (the real
scoring stage), with the scorer's calls kept as evidence. Real Docker Engine, real Prefect,
real DuckDB; mockllm is the only mock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import workspace_kit as kit
from cli_kit import GRADEBOOK, gradebook, shell_env
from inspect_ai.log import read_eval_log

from flows.generate import run_generation
from sweeps.config import ModelConfig, TaskConfig, WorkspacesConfig
from warehouse import Warehouse

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MODEL = ModelConfig(model="mockllm/model", args_from="workspace_kit:mock_args")


@pytest.fixture(scope="module")
def sandbox_scorers(tmp_path_factory) -> Path:
    """The kit's scorer file, one path for the module: a scorer name stands for one spec in a
    process, so every test grades with the same file."""
    return kit.scorer_file(tmp_path_factory.mktemp("scorers"))


def generate(tmp: Path, task: str, args: dict | None = None, **workspaces) -> str:
    """One log of a kit task through the generate stage (capture on, store in tmp/store)."""
    settings = WorkspacesConfig(store=tmp / "store", **workspaces)
    task_cfg = TaskConfig(task=f"{kit.KIT}@{task}", args=args or {})
    (result,) = run_generation(MODEL, [task_cfg], tmp / "logs", workspaces=settings)
    assert result.status == "success" and result.errored == 0, result
    return str(result.log)


def q(db: Path, sql: str, *params) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute(sql, list(params)).fetchall()


def score(log: str, db: Path, verifier: str, **kwargs):
    from flows.score import score_flow

    return score_flow([log], str(db), verifiers=[verifier], workers=2, progress=False, **kwargs)


def test_a_sandbox_scorer_grades_the_workspace_the_agent_left(
    docker_sandbox, prefect_api, tmp_path, sandbox_scorers
):
    log = generate(tmp_path, "notes")
    records = [s.store["gradebook_workspace"] for s in read_eval_log(log).samples]
    assert all(r["sandboxes"][0]["status"] == "captured" for r in records)
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{sandbox_scorers}@notes_check", scored_log_dir=str(tmp_path / "scored"))

    rows = q(db, "SELECT sample_id, status, value, answer, explanation FROM latest_scores "
                 "ORDER BY sample_id")  # fmt: skip
    assert rows == [
        ("1", "scored", 1.0, "1", "checked 1"),
        ("2", "scored", 1.0, "4", "checked 2"),
        ("3", "scored", 0.0, "0", "checked 3"),  # its agent wrote a wrong answer
        ("4", "scored", 1.0, "16", "checked 4"),
    ]
    # the warehouse records each workspace, and every call the scorer made
    assert q(db, "SELECT count(*), count(DISTINCT digest), min(status), min(paths[1]) "
                 "FROM workspaces") == [(4, 4, "captured", "/work")]  # fmt: skip
    calls = q(db, "SELECT sample_id, call, op, path, command, exit_code, stdout "
                  "FROM sandbox_calls WHERE sample_id = '2' ORDER BY call")  # fmt: skip
    assert calls == [
        ("2", 1, "read_file", "notes/answer.txt", None, None, None),
        ("2", 2, "exec", None, ["python3", "-B", "check.py"], 0, "checked 2\n"),
    ]
    # ... and the scored copy shows them with the score
    (copy,) = (tmp_path / "scored").iterdir()
    sample = next(s for s in read_eval_log(str(copy)).samples if s.id == 2)
    evidence = sample.scores["notes_check"].metadata["sandbox"]
    assert [c["op"] for c in evidence["calls"]] == ["read_file", "exec"]
    assert evidence["restored"]["default"]["files"] == 2


def test_named_sandboxes_are_each_restored_as_they_were_left(
    docker_sandbox, prefect_api, tmp_path, sandbox_scorers
):
    log = generate(tmp_path, "two_sandboxes")
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{sandbox_scorers}@both_desks")
    assert q(db, "SELECT sample_id, value, answer FROM latest_scores ORDER BY 1") == [
        ("1", 1.0, "default desk | helper desk 1"),
        ("2", 1.0, "default desk | helper desk 2"),
    ]
    assert q(db, "SELECT sandbox, count(*) FROM workspaces GROUP BY 1 ORDER BY 1") == [
        ("default", 2),
        ("helper", 2),
    ]


def test_a_failed_capture_does_not_fail_generation_and_leaves_sandbox_scorers_unscored(
    docker_sandbox, prefect_api, tmp_path, sandbox_scorers
):
    log = generate(tmp_path, "notes", {"big_mb": 2}, max_mb=1)  # the agent leaves 2 MiB
    (box,) = read_eval_log(log).samples[0].store["gradebook_workspace"]["sandboxes"]
    assert box["status"] == "failed" and "larger than its cap" in box["error"]
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{sandbox_scorers}@notes_check")
    rows = q(db, "SELECT DISTINCT status, reason, explanation FROM latest_scores")
    assert rows == [
        (
            "unscored",
            "workspace_not_captured",
            "sandbox 'default' was not captured at generation: the workspace is larger than "
            "its cap of 1048576 bytes",
        )
    ]
    # a scorer that needs no sandbox grades the same samples
    score(log, db, "includes")
    assert q(db, "SELECT count(*) FROM latest_scores WHERE scorer = 'includes' "
                 "AND status = 'scored'") == [(4,)]  # fmt: skip


def test_capture_works_through_the_sandbox_api_of_any_provider(
    docker_sandbox, prefect_api, tmp_path, sandbox_scorers
):
    # Inspect's own `local` provider: tar to a file, read_file back (what Inspect's docker
    # provider goes through too); restored into gradebook's container at the same path
    log = generate(tmp_path, "notes_local")
    (box,) = read_eval_log(log).samples[0].store["gradebook_workspace"]["sandboxes"]
    assert (box["status"], box["provider"]) == ("captured", "local"), box
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{sandbox_scorers}@notes_check")
    assert q(db, "SELECT sample_id, value FROM latest_scores ORDER BY 1") == [("1", 1.0),
                                                                             ("2", 1.0)]  # fmt: skip


def _dead_socket(tmp: Path) -> str:
    """A unix socket path nobody serves (bound, then closed: connecting is refused)."""
    path = tmp / "nobody.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return f"unix://{path}"


def test_a_dead_engine_is_sandbox_unavailable_and_the_retry_command_heals_it(
    docker_sandbox, prefect_api, tmp_path, sandbox_scorers
):
    log = generate(tmp_path, "notes")
    db = tmp_path / "gb.duckdb"
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    down = gradebook("score", log, "--db", str(db), "--verifier", f"{sandbox_scorers}@notes_check",
                     env={**env, "DOCKER_HOST": _dead_socket(tmp_path)}, cwd=tmp_path)  # fmt: skip
    assert down.code == 0, down.stderr
    assert q(db, "SELECT DISTINCT status, reason FROM latest_scores") == [
        ("unscored", "sandbox_unavailable")
    ]
    healed = gradebook("rescore", "--db", str(db), "--retry-unscored", "--verifier-module",
                       f"{sandbox_scorers}@notes_check", env=env, cwd=tmp_path)  # fmt: skip
    assert healed.code == 0, healed.stderr
    assert q(db, "SELECT sample_id, attempt, status, value FROM current_scores ORDER BY 1") == [
        ("1", 2, "scored", 1.0),
        ("2", 2, "scored", 1.0),
        ("3", 2, "scored", 0.0),
        ("4", 2, "scored", 1.0),
    ]


def _descendants(pid: int) -> set[int]:
    found, todo = {pid}, [pid]
    while todo:
        parent = todo.pop()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == parent and int(entry) not in found:
                found.add(int(entry))
                todo.append(int(entry))
    return found


def test_no_restore_container_outlives_a_killed_score(
    docker_sandbox, prefect_api, tmp_path, sandbox_scorers
):
    import docker

    from scorers.sandbox.pool import OWNER_LABEL
    from workspaces.restore import RESTORE_LABEL

    log = generate(tmp_path, "notes")
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    proc = subprocess.Popen(
        [str(GRADEBOOK), "score", log, "--db", str(tmp_path / "gb.duckdb"), "--verifier",
         f"{sandbox_scorers}@sleeper"],  # fmt: skip
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = docker.from_env()

    def ours() -> list:
        # only containers this test's processes own: another run may share the Engine
        pids = {str(p) for p in _descendants(proc.pid)} if proc.poll() is None else set()
        pids |= seen_pids
        # one listing that carries the labels (tests/docker_kit.py): containers.list() inspects
        # each container, and one another process removed meanwhile fails it with a 404
        out = []
        for c in client.api.containers(all=True, filters={"label": f"{RESTORE_LABEL}=restore"}):
            owner_pid = (c.get("Labels") or {}).get(OWNER_LABEL, "::").split(":")[1]
            if owner_pid in pids:
                out.append(c["Id"])
        return out

    seen_pids: set[str] = set()
    try:
        deadline = time.monotonic() + 300
        while True:
            seen_pids |= {str(p) for p in _descendants(proc.pid)}
            if len(ours()) >= 2:  # sleeping scorers, one container per sample
                break
            assert proc.poll() is None, "score ended before its scorers slept"
            assert time.monotonic() < deadline, "no restore container appeared"
            time.sleep(0.5)
        seen_pids |= {str(p) for p in _descendants(proc.pid)}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while ours():
            assert time.monotonic() < deadline, f"left behind: {[c[:12] for c in ours()]}"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_log_from_elsewhere_is_scored_by_an_inspect_evals_sandbox_scorer(
    docker_sandbox, prefect_api, tmp_path
):
    """A ClassEval-style log written by a plain eval() (no gradebook, nothing captured): the
    installed scorer runs the model's class against the tests in a fresh container of
    gradebook's image."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import generate as generate_solver
    from inspect_evals.class_eval.class_eval import class_eval_scorer

    answers = {"right": kit.RIGHT_CLASS, "wrong": kit.WRONG_CLASS, "none": "no code"}

    def outputs(input, tools, tool_choice, config):
        key = next(k for k in answers if k in input[-1].text)
        return ModelOutput.from_content("mockllm/model", answers[key]).model_copy(
            update={"usage": ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)}
        )

    task = Task(
        dataset=[
            Sample(
                id=k,
                input=f"Write the Stack class ({k})",
                target="",
                metadata={"test": kit.CLASS_TESTS},
            )
            for k in answers
        ],  # fmt: skip
        solver=generate_solver(),
        scorer=class_eval_scorer(),
    )
    (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs),
                          log_dir=str(tmp_path / "logs"), display="none", score=False)  # fmt: skip
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    db = tmp_path / "gb.duckdb"
    # the qualified name: the log names the bare `class_eval_scorer`, which gradebook resolves
    # once installed packages' scorers are found by their bare names too (issue 30)
    ran = gradebook("score", log.location, "--db", str(db), "--verifier",
                    "inspect_evals/class_eval_scorer", env=env, cwd=tmp_path)  # fmt: skip
    assert ran.code == 0, ran.stderr
    assert q(db, "SELECT sample_id, status, value FROM latest_scores ORDER BY 1") == [
        ("none", "scored", 0.0),
        ("right", "scored", 1.0),
        ("wrong", "scored", 0.0),
    ]
    fresh = q(db, "SELECT DISTINCT json_extract(metadata, '$.sandbox.restored.default.fresh') "
                  "FROM scores")  # fmt: skip
    assert fresh == [("true",)]
    assert q(db, "SELECT count(*) FROM workspaces") == [(0,)]
    assert json.loads(q(db, "SELECT params FROM verifiers")[0][0])["sandbox"]["image"]


def test_a_judged_sandbox_scorer_is_rejudged_from_the_warehouse_alone(
    docker_sandbox, prefect_api, tmp_path, monkeypatch
):
    """The judge fails after the sandbox calls were made: the samples are unscored
    (grader_failed) with those calls as evidence. Judged again with the Docker Engine gone, they
    are graded from the recorded calls: judge calls = samples, no container."""
    from flows.score import ScoreOptions, score_runs
    from sweeps.mock_server import scripted_server
    from verifiers.specs import names_for_entries

    log = generate(tmp_path, "notes")
    db = tmp_path / "gb.duckdb"
    (run_id,) = [r.run_id for r in Warehouse(db).ingest_logs([log])]
    monkeypatch.setenv("JUDGE_API_KEY", "test")
    broken = [True]
    with scripted_server(kit.judge_script(broken), models=["j"]) as judge:
        role = {"model": "openai-api/judge/j", "base_url": judge.base_url,
                "args": {"max_retries": 0}, "config": {"max_retries": 1, "attempt_timeout": 5}}  # fmt: skip
        spec = {"kind": "file", "scorer": "judged_answer", "params": {},
                "file": str(kit.judged_scorer_file(tmp_path)), "roles": {"grader": role}}  # fmt: skip
        (name,) = names_for_entries([spec], trusted=True)
        opts = ScoreOptions(workers=2, progress=False)
        score_runs(db, {run_id: [name]}, opts)
        assert q(db, "SELECT DISTINCT status, reason FROM latest_scores") == [
            ("unscored", "grader_failed")
        ]
        assert q(db, "SELECT count(*) FROM sandbox_calls WHERE exit_code = 0") == [(4,)]

        broken[0] = False  # the judge is back; the Docker Engine is not
        monkeypatch.setenv("DOCKER_HOST", _dead_socket(tmp_path))
        before = judge.count()
        score_runs(db, {run_id: [name]}, opts, retry="all")
        assert judge.count() - before == 4  # one judge call per sample, nothing else
    assert q(
        db, "SELECT sample_id, attempt, status, value, answer FROM current_scores ORDER BY 1"
    ) == [  # fmt: skip
        ("1", 2, "scored", 1.0, "1"),
        ("2", 2, "scored", 1.0, "4"),
        ("3", 2, "scored", 0.0, "0"),
        ("4", 2, "scored", 1.0, "16"),
    ]
    replayed = q(db, "SELECT DISTINCT json_extract(metadata, '$.sandbox.restored.default') "
                     "FROM current_scores")  # fmt: skip
    assert [json.loads(r[0]) for r in replayed] == [{"replayed": True}]
