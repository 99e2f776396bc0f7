"""Every command gradebook prints runs as printed, from a shell where `gradebook` is not on the
PATH (as after `make demo`): the gate's fix-it lines and the demo's next steps.

Each printed command is handed to `bash -c` exactly as printed, in a fresh environment whose
PATH lacks the virtualenv, and must run (no "No such option", no "command not found") and do
what the message says it does.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

import flows_kit
import pyarrow as pa
import pytest
from cli_kit import GRADEBOOK, Ran, gradebook, run, shell_env
from gate_world import run_eval

from warehouse import SCORE_SCHEMA, Warehouse

pytestmark = pytest.mark.slow

# a command inside backticks in a gate problem line
_QUOTED = re.compile(r"`([^`]+)`")


def _shell(command: str, env: dict[str, str], cwd: Path) -> Ran:
    return run(["bash", "-c", command], env, cwd)


def _fix_it(ran: Ran, phrase: str) -> str:
    """The command the gate printed after `phrase` ("score it with", "re-score it with")."""
    line = next(ln for ln in ran.stdout.splitlines() if phrase in ln)
    return _QUOTED.search(line.split(phrase, 1)[1]).group(1)


def _math_log(log_dir: Path, task: str) -> tuple[Path, list[str]]:
    answers = [f"ANSWER: {i}" for i in range(4)]
    return run_eval(log_dir, answers, task_name=task, metadata={"verifiers": ["math"]}), answers


def test_the_gates_fix_it_commands_run_as_printed_and_fix_the_gate(
    tmp_path: Path, prefect_api: str
) -> None:
    # a directory and file name with spaces: the printed command must quote them
    db = tmp_path / "my warehouse" / "release db.duckdb"
    db.parent.mkdir()
    wh = Warehouse(db)
    env = shell_env(tmp_path / "prefect-home", api_url=prefect_api)
    assert subprocess.run(["bash", "-c", "command -v gradebook"], env=env).returncode != 0

    # 1. a run ingested but never scored
    log, _ = _math_log(tmp_path / "logs", "unscored_task")
    [res] = wh.ingest_logs([log])
    gate = gradebook("gate", "--run", res.run_id, "--db", str(db), env=env, cwd=tmp_path)
    assert gate.code == 2, gate.stdout + gate.stderr
    fix = _fix_it(gate, "score it with")
    assert fix.startswith(str(GRADEBOOK))  # not on the PATH: named by its path
    done = _shell(fix, env, tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    again = gradebook("gate", "--run", res.run_id, "--db", str(db), env=env, cwd=tmp_path)
    assert again.code == 0, again.stdout + again.stderr

    # 2. a run scored only under an older fingerprint of the math verifier
    log, _ = _math_log(tmp_path / "logs2", "stale_task")
    [res] = wh.ingest_logs([log])
    todo = wh.samples_to_score("math", "f" * 64, run_ids=[res.run_id]).to_pylist()
    now = datetime.now(UTC)
    wh.write_scores(
        pa.Table.from_pylist(
            [
                {
                    **{k: s[k] for k in ("run_id", "sample_id", "epoch")},
                    "scorer": "math",
                    "fingerprint": "f" * 64,
                    "status": "scored",
                    "value": 0.0,
                    "explanation": "graded by an older verifier",
                    "scored_at": now,
                    "attempt": 1,
                }
                for s in todo
            ],
            schema=SCORE_SCHEMA,
        )
    )
    gate = gradebook("gate", "--run", res.run_id, "--db", str(db), env=env, cwd=tmp_path)
    assert gate.code == 2, gate.stdout + gate.stderr
    fix = _fix_it(gate, "re-score it with")
    done = _shell(fix, env, tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    again = gradebook("gate", "--run", res.run_id, "--db", str(db), env=env, cwd=tmp_path)
    assert again.code == 0, again.stdout + again.stderr


def test_the_demos_next_commands_run_as_printed(tmp_path: Path, prefect_api: str) -> None:
    env = shell_env(
        tmp_path / "prefect-home",
        api_url=prefect_api,
        # no Docker: the demo then also prints how to grade the code samples later
        DOCKER_HOST="unix:///nonexistent/docker.sock",
        COLUMNS="200",
    )
    demo = gradebook("demo", "--dir", str(tmp_path / "demo dir"), env=env, cwd=tmp_path)
    assert demo.code == 0, demo.stdout + demo.stderr
    printed = [ln.strip() for ln in demo.stdout.splitlines() if ln.startswith("  ")]
    commands = [ln for ln in printed if ln.startswith(str(GRADEBOOK))]
    assert any("source " in ln and "activate" in ln for ln in printed)  # how to shorten them
    kinds = {c.split()[1] for c in commands}
    assert {"sql", "verifiers", "rescore", "report", "gate"} <= kinds, commands
    for command in commands:
        done = _shell(command, env, tmp_path)
        # 1 is a gate that failed (the code samples are unscored without Docker): it ran
        assert done.code in (0, 1), (command, done.stdout, done.stderr)
        assert "No such option" not in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "report.html").is_file()  # `gradebook report` wrote it where it said


def test_the_demos_metrics_query_shows_each_run_once_after_a_rescore(
    tmp_path: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.cli.demo import next_commands
    from flows.rescore import rescore_flow
    from flows.score import score_flow

    # scored, then the verifier edited and re-scored: run_metrics holds a row per fingerprint
    name = f"lastword_{uuid.uuid4().hex[:8]}"
    path = flows_kit.write_verifier(tmp_path, name, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    log = run_eval(tmp_path / "logs", ["0", "1", "2", "x"], task_name="capitals")
    db = tmp_path / "demo dir" / "demo.duckdb"
    db.parent.mkdir()
    score_flow([str(log)], str(db), verifiers=[name], progress=False)  # 3 of 4 right
    path.write_text(path.read_text().replace("OFFSET = 0", "OFFSET = 1"))
    importlib.reload(importlib.import_module(name))
    rescore_flow(str(db), [name], progress=False)  # none right now

    [query] = [c for c in next_commands(db) if "run_metrics" in c and not c.startswith("#")]
    env = shell_env(tmp_path / "prefect-home", COLUMNS="200")
    done = _shell(query, env, tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    # the run once, with the numbers of the verifier's current code
    [row] = [ln for ln in done.stdout.splitlines() if name in ln]
    assert "capitals" in row and "0.0" in row and "0.75" not in row, done.stdout
