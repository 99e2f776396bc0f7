"""Test material for the flow tests: a tiny arithmetic task, scripted models, a test verifier.

Not a verifier anyone should use: `exact_check` compares the last word of the completion with
the target, and raises on purpose for the sample ids listed in its module's BOOM set.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ModelOutput, ModelUsage
from inspect_ai.solver import generate

KIT = Path(__file__).resolve()
TASK_SPEC = f"{KIT}@arith"
QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def problems(n: int) -> list[tuple[str, str]]:
    return [(f"What is {i} + {2 * i}?", str(3 * i)) for i in range(1, n + 1)]


@task
def arith(n: int = 8) -> Task:
    samples = [Sample(input=q, target=a, id=i) for i, (q, a) in enumerate(problems(n), start=1)]
    return Task(dataset=MemoryDataset(samples, name="arith"), solver=generate())


def answer_for(prompt: str, *, wrong: bool) -> str:
    m = QUESTION.search(prompt)
    if not m:
        return "I do not know"
    total = int(m.group(1)) + int(m.group(2))
    return f"The answer is {total + 1 if wrong else total}"


def mock_outputs(wrong_ids: set[int]) -> Any:
    """A mockllm `custom_outputs` callable answering right except on the given operand values."""

    def outputs(input: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        prompt = " ".join(str(getattr(m, "text", m)) for m in input)
        m = QUESTION.search(prompt)
        wrong = bool(m and int(m.group(1)) in wrong_ids)
        return ModelOutput.from_content(
            model="mockllm/model",
            content=answer_for(prompt, wrong=wrong),
        ).model_copy(update={"usage": ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)})

    return outputs


VERIFIER_SOURCE = textwrap.dedent(
    '''
    """exact_check: the last word of the completion must equal the target (test verifier)."""
    import os

    from scorers.grade import SampleView, scored
    from scorers.registry import Verifier, register

    BOOM = {boom!r}
    OFFSET = 0
    MARKS = {marks!r}  # a directory: each process that imports this module leaves a file there
    if MARKS:
        open(os.path.join(MARKS, str(os.getpid())), "w").close()


    def grade(view: SampleView):
        if str(view.sample_id) in BOOM:
            raise RuntimeError("boom on purpose")
        words = view.completion.split()
        answer = words[-1] if words else None
        if answer is None:
            return scored(0.0, answer=None, explanation="no parseable answer", reason="no_answer")
        want = str(int(view.targets[0]) + OFFSET)
        ok = answer == want
        return scored(
            1.0 if ok else 0.0,
            answer=answer,
            explanation="equal" if ok else f"mismatch: got {{answer}}, want {{want}}",
            reason="verified_equal" if ok else "mismatch",
        )


    register(Verifier("{name}", grade, module="{module}", params={{}}, label="test: last word"))
    '''
)


def write_verifier(
    directory: Path,
    module: str,
    name: str,
    boom: set[str] | None = None,
    marks: Path | None = None,
) -> Path:
    """Write a test verifier module into `directory` (which the caller puts on sys.path);
    with `marks`, every process importing it leaves a file named by its pid there."""
    path = directory / f"{module}.py"
    path.write_text(
        VERIFIER_SOURCE.format(
            boom=set(boom or ()), name=name, module=module, marks=str(marks) if marks else ""
        )
    )
    return path
