"""The judge-outage case, shared by the judge tests: 6 samples, 2 answered wrong, and a scripted
OpenAI-compatible judge (sweeps.mock_server) that fails on the 3 samples holding both wrong
answers (HTTP 500, 429, and a call that hangs past its timeout) until it is told to recover."""

from __future__ import annotations

import re
import textwrap
import threading
from pathlib import Path

QUESTIONS = {1: "2+2", 2: "3+3", 3: "4+4", 4: "5+5", 5: "6+6", 6: "7+7"}
TARGETS = {1: "4", 2: "6", 3: "8", 4: "10", 5: "12", 6: "14"}
ANSWERS = {1: "5", 2: "7", 3: "8", 4: "10", 5: "12", 6: "14"}  # 1 and 2 are wrong
FAILING = {1: 500, 2: 429, 3: "hang"}  # the judge fails on 1, 2 (both wrong) and 3

TASK = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate

    QUESTIONS = {questions!r}
    TARGETS = {targets!r}


    @task
    def sums():
        return Task(
            dataset=MemoryDataset([
                Sample(id=i, input=f"Q{{i}}: what is {{q}}?", target=TARGETS[i])
                for i, q in QUESTIONS.items()
            ]),
            solver=generate(),
        )
    """
)


class Judge:
    """A scripted OpenAI-compatible judge: grades "[Submission]" against "[Criterion]", fails
    the chosen questions while `down`, and records each request's question as it arrives."""

    def __init__(self, verdict: str = "compare") -> None:
        self.down = True
        self.failing: dict[int, int | str] = dict(FAILING)
        self.verdict = verdict
        self.arrived: list[int] = []
        self.back = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, model: str, messages: list[dict]) -> str | int:
        text = str(messages[-1].get("content", ""))
        question = int(re.search(r"Q(\d+):", text).group(1))
        with self._lock:
            self.arrived.append(question)
        failure = self.failing.get(question) if self.down else None
        if failure == "hang":
            self.back.wait(30)  # past the judge's timeout; ends when the test says so
            return 504
        if failure is not None:
            return int(failure)
        if self.verdict == "none":
            return "The submission looks reasonable to me."
        submission = re.search(r"\[Submission\]: (.*)", text).group(1).strip()
        criterion = re.search(r"\[Criterion\]: (.*)", text).group(1).strip()
        if self.verdict == "always_c":
            return "GRADE: C"
        return "Reasoning done.\nGRADE: " + ("C" if submission == criterion else "I")

    def recover(self) -> None:
        self.down = False
        self.back.set()

    def count(self) -> int:
        with self._lock:
            return len(self.arrived)


def generator(model: str, messages: list[dict]) -> str:
    question = int(re.search(r"Q(\d+):", str(messages[-1].get("content", ""))).group(1))
    return ANSWERS[question]


def config(tmp_path: Path, gen_url: str, judge_url: str, judge_model: str = "j") -> dict:
    """A sweep config (as parsed TOML) of the case: the model under test at `gen_url`, the
    judge at `judge_url`, short judge limits so an outage takes seconds."""
    task_file = tmp_path / "sums.py"
    task_file.write_text(TASK.format(questions=QUESTIONS, targets=TARGETS))
    return {
        "name": "judged",
        "log_dir": "logs",
        "warehouse": "w.duckdb",
        "models": [{"name": "m", "model": "openai-api/gen/m", "base_url": gen_url,
                    "retry_on_error": 0}],
        "tasks": [{"task": f"{task_file}@sums", "verifiers": ["model_graded_qa"]}],
        "model_roles": {"grader": {
            "model": f"openai-api/judge/{judge_model}", "base_url": judge_url,
            # one layer of retries (Inspect's), short, so the outage test takes seconds
            "args": {"max_retries": 0},
            "config": {"max_retries": 1, "attempt_timeout": 2, "max_connections": 4},
        }},
        "gates": {"max_unscored_rate": 0.1, "max_regression": None},
    }  # fmt: skip
