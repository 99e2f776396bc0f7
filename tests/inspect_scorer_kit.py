"""Test material for the Inspect-scorer tests: tasks with Inspect's own scorers, a scorer file,
scripted mockllm answers, and the same task run once scored by Inspect and once not.

Each task runs twice with the same answers: `eval(score=True)` (Inspect's own eval-time scoring,
the reference) and `eval(score=False)` (what gradebook generates and then scores).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import choice, match
from inspect_ai.solver import generate, multiple_choice

# one multiple-choice question per answer style: right, wrong, lower case, bold, "(B)",
# two letters for a single-answer question, a letter out of range, no ANSWER line, empty
MC_ANSWERS = [
    "ANSWER: A",
    "ANSWER: C",
    "answer: c",
    "Let me think.\nANSWER: **D**",
    "ANSWER: (B)",
    "ANSWER: A, B",
    "ANSWER: E",
    "I believe it is B",
    "",
    "ANSWER: B.",
]
MC_TARGETS = ["A", "B", "C", "D", "B", "A", "A", "B", "C", "B"]

MATCH_ANSWERS = ["42", "The answer is 7", "3.0", "x", "10", "  5  ", "1,000", "12%", "no", "-3"]
MATCH_TARGETS = ["42", "7", "3", "8", "10", "5", "1000", "12", "yes", "-3"]

SCORER_FILE = textwrap.dedent(
    '''
    """A team's own scorer: the answer's last word against the target, in a file."""
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer, stderr
    from inspect_ai.solver import TaskState

    RAISE_ON = set()  # sample ids the scorer raises on (tests)
    UNSCORED_ON = set()  # sample ids it leaves unscored with its own reason
    OFFSET = 0


    @scorer(metrics=[accuracy(), stderr()])
    def last_word(strict: bool = True):
        async def score(state: TaskState, target: Target) -> Score:
            if state.sample_id in RAISE_ON:
                raise RuntimeError(f"boom on sample {state.sample_id}")
            if state.sample_id in UNSCORED_ON:
                return Score.unscored(reason="refusal", explanation="the model refused")
            words = state.output.completion.split()
            got = words[-1].strip(".") if words else ""
            want = str(int(target.text) + OFFSET) if target.text.lstrip("-").isdigit() else target.text
            ok = got == want if strict else got.lower() == want.lower()
            return Score(value=CORRECT if ok else INCORRECT, answer=got,
                         explanation=f"got {got!r}, want {want!r}")

        return score
    '''
)

TASK_FILE = textwrap.dedent(
    '''
    """A task whose custom scorer lives in the file next to it (its own scorers: match() and it)."""
    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    from team_scorer import last_word


    @task
    def team_task(n: int = 6) -> Task:
        samples = [Sample(input=f"What is {i} + {i}?", target=str(2 * i), id=i) for i in range(1, n + 1)]
        return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=[match(), last_word()])
    '''
)


def scripted_outputs(answers: list[str]) -> Any:
    """A mockllm `custom_outputs` callable: the question numbered i (the prompt's first number)
    is answered `answers[i - 1]`, however the samples are ordered or retried."""

    def outputs(input: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        prompt = " ".join(str(getattr(m, "text", m)) for m in input)
        number = re.search(r"\d+", prompt)
        i = int(number.group()) if number else 1
        return ModelOutput.from_content(
            model="mockllm/model", content=answers[(i - 1) % len(answers)]
        ).model_copy(update={"usage": ModelUsage(input_tokens=3, output_tokens=3, total_tokens=6)})

    return outputs


def scripted(answers: list[str]) -> Any:
    """A mockllm model answering as `scripted_outputs`."""
    return get_model("mockllm/model", custom_outputs=scripted_outputs(answers))


def choice_task() -> Task:
    samples = [
        Sample(input=f"Question {i}: which one?", choices=["w", "x", "y", "z"], target=t, id=i)
        for i, t in enumerate(MC_TARGETS, start=1)
    ]
    return Task(dataset=MemoryDataset(samples), solver=multiple_choice(), scorer=choice(),
                name="mc")  # fmt: skip


def match_task() -> Task:
    samples = [
        Sample(input=f"Question {i}?", target=t, id=i) for i, t in enumerate(MATCH_TARGETS, 1)
    ]
    return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=match(numeric=True),
                name="matching")  # fmt: skip


def twice(task: Task, answers: list[str], log_dir: Path) -> tuple[Any, Any]:
    """(the log scored by Inspect at eval time, the unscored log), same task and answers."""
    scored = inspect_eval(task, model=scripted(answers), log_dir=str(log_dir / "scored"),
                          score=True, display="none")[0]  # fmt: skip
    plain = inspect_eval(task, model=scripted(answers), log_dir=str(log_dir / "plain"),
                         score=False, display="none")[0]  # fmt: skip
    assert plain.status == "success" and not (plain.results and plain.results.scores)
    return scored, plain


def write_team_files(directory: Path) -> tuple[Path, Path]:
    """The scorer file and the task file that imports it; returns (scorer file, task file)."""
    directory.mkdir(parents=True, exist_ok=True)
    scorer = directory / "team_scorer.py"
    scorer.write_text(SCORER_FILE)
    task = directory / "team_task.py"
    task.write_text(TASK_FILE)
    return scorer, task


def inspect_scores(log: Any, name: str) -> dict[tuple[str, int], tuple[Any, str | None]]:
    """(sample id, epoch) -> (value, answer) of one scorer as Inspect scored the log."""
    return {
        (str(s.id), s.epoch): (s.scores[name].value, s.scores[name].answer)
        for s in log.samples
        if s.scores and name in s.scores
    }


def isolated_registry() -> Iterator[None]:
    """For an autouse fixture: a verifier name stands for one scorer spec per process (the
    registry is process-wide), and the tests register the same names with other params, so each
    test starts from the registry it found and leaves it so."""
    from scorers import registry
    from scorers.inspect_scorers import specs

    registry.all_verifiers()  # the built-ins are loaded once per process: keep them
    verifiers, by_key = dict(registry._VERIFIERS), dict(specs._BY_KEY)
    try:
        yield
    finally:
        registry._VERIFIERS.clear()
        registry._VERIFIERS.update(verifiers)
        specs._BY_KEY.clear()
        specs._BY_KEY.update(by_key)
