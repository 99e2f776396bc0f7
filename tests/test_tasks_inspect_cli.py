"""The bundled tasks under Inspect's own CLI: `inspect eval tasks/<file>.py@<task>` and
`inspect score` on the log (no `--scorer`: the task's own scorer, loaded from the task file).

Inspect's loader runs a task file under a module name missing from `sys.modules`; a dataclass
with `from __future__ import annotations` in it crashed both commands. Generation goes to a
local OpenAI-compatible server (sweeps/mock_server.py) through Inspect's `openai-api` provider:
plain `mockllm/model` downloads a tokenizer, which an offline machine cannot.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai.log import read_eval_log

from sweeps.mock_server import scripted_server
from tasks.math import bundled_samples, scripted_completions

ROOT = Path(__file__).resolve().parents[1]
INSPECT = Path(sys.executable).parent / "inspect"

GSM8K_ROWS = [
    {"question": "Ann has 3 apples and buys 4 more. How many apples?", "answer": "3+4=7\n#### 7"},
    {"question": "Bob reads 5 pages a day for 6 days. How many pages?", "answer": "#### 30"},
]


def _script(model: str, messages: list[dict]) -> str:
    """Right answers for every bundled task's prompts."""
    prompt = "\n".join(str(m.get("content", "")) for m in messages)
    by_id = {c.id: c for c in scripted_completions()}
    for sample in bundled_samples():
        if str(sample.input) in prompt:
            return by_id[str(sample.id)].correct
    for row in GSM8K_ROWS:
        if row["question"] in prompt:
            return "Adding up.\nANSWER: " + row["answer"].rsplit("####", 1)[1].strip()
    from tasks.code import humaneval_samples

    for sample in humaneval_samples(2):
        if sample.metadata["prompt"] in prompt:
            return f"```python\n{sample.target}\n```"
    return "no idea"


@pytest.fixture(scope="module")
def server():
    with scripted_server(_script, models=["m"]) as srv:
        yield srv


def _inspect(args: list[str], server, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCAL_BASE_URL": server.base_url, "LOCAL_API_KEY": "test"}
    return subprocess.run(
        [str(INSPECT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _task_functions() -> set[str]:
    """Every `file.py@name` decorated with @task under tasks/."""
    found = set()
    for path in sorted((ROOT / "tasks").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                (d.id if isinstance(d, ast.Name) else getattr(d, "attr", None)) == "task"
                for d in node.decorator_list
            ):
                found.add(f"tasks/{path.name}@{node.name}")
    return found


def _task_args(spec: str, tmp_path: Path) -> list[str]:
    if spec.endswith("@gsm8k_verified"):
        data = tmp_path / "gsm8k.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
        return ["-T", f"path={data}"]
    if spec.endswith("@humaneval"):
        return ["-T", "limit=2"]
    if spec.endswith("@fix_the_bug"):
        return ["-T", "tickets_n=1"]
    return ["--limit", "3"]


CASES = [
    "tasks/math.py@math_verified",
    "tasks/math.py@gsm8k_verified",
    "tasks/code.py@humaneval",
    "tasks/agentic.py@fix_the_bug",
]


def test_the_cases_cover_every_bundled_task():
    assert set(CASES) == _task_functions()


@pytest.mark.slow
@pytest.mark.parametrize("spec", CASES)
def test_inspect_eval_loads_every_bundled_task(spec, server, tmp_path, request):
    if spec.endswith("@fix_the_bug"):
        request.getfixturevalue("docker_sandbox")  # its samples run in a gradebook sandbox
    # generate only: what is under test is Inspect's loader running the task file (the code
    # task's scorer needs Docker; the math one is scored below)
    proc = _inspect(
        ["eval", spec, "--model", "openai-api/local/m", "--no-score", "--display", "none",
         "--log-dir", str(tmp_path / "logs"), *_task_args(spec, tmp_path)],
        server, ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [log_file] = (tmp_path / "logs").glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "success"
    assert log.samples and all(s.error is None for s in log.samples)
    if not spec.endswith("@fix_the_bug"):  # the agent is scripted elsewhere (tasks.agentic)
        assert all(s.output.completion != "no idea" for s in log.samples)


@pytest.mark.slow
def test_inspect_eval_and_inspect_score_grade_the_math_task(server, tmp_path):
    # the documented command (docs/reference/python-api/scorers.md), from another directory, with the task's own scorer
    proc = _inspect(
        ["eval", str(ROOT / "tasks/math.py") + "@math_verified", "--model", "openai-api/local/m",
         "--limit", "4", "--display", "none", "--log-dir", str(tmp_path / "logs")],
        server, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [log_file] = (tmp_path / "logs").glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "success" and log.results is not None
    [score] = log.results.scores
    assert (score.name, score.metrics["accuracy"].value) == ("math_verifier", 1.0)

    # `inspect score` without --scorer re-creates the scorer from the log: it loads the task
    # file with the same loader
    scored = tmp_path / "rescored.eval"
    proc = _inspect(
        ["score", str(log_file), "--action", "overwrite", "--output-file", str(scored)],
        server, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    again = read_eval_log(str(scored))
    assert again.results is not None
    [score] = again.results.scores
    assert (score.name, score.metrics["accuracy"].value) == ("math_verifier", 1.0)
    assert again.results.completed_samples == 4
    assert all(s.scores and s.scores["math_verifier"].value == 1.0 for s in again.samples or [])
