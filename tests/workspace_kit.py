"""Test material for the workspace tests: sandboxed tasks whose solver leaves files in the
sandbox (the agent's work), a scripted mockllm, and scorer files that call `sandbox()`.

The solvers write in the sandbox themselves (task code, as an agent's tools would); the model
is the only mock (mockllm with `usage`, so it never needs tiktoken's download).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ModelOutput, ModelUsage
from inspect_ai.solver import Generate, TaskState, generate, solver
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

from scorers.sandbox.provider import GradebookSandboxConfig

KIT = Path(__file__).resolve()
WRONG = 3  # the sample whose "agent" writes a wrong answer


def mock_outputs(input: Any, tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
    return ModelOutput.from_content("mockllm/model", "done").model_copy(
        update={"usage": ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)}
    )


def mock_args() -> dict[str, Any]:
    """`args_from` of a ModelConfig: mockllm with usage (offline)."""
    return {"custom_outputs": mock_outputs}


@solver
def leave_notes(big_mb: int = 0):
    """The 'agent': writes its answer and a checker script into the sandbox (and, with
    `big_mb`, a file that large)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = int(state.sample_id)
        answer = 0 if n == WRONG else n * n
        box = sandbox()
        await box.write_file("notes/answer.txt", f"{answer}\n")
        await box.write_file("notes/check.py", f"print('checked {n}')\n")
        if big_mb:
            await box.exec(["sh", "-c", f"head -c {big_mb}M /dev/urandom > notes/big.bin"])
        return await generate(state)

    return solve


def _samples(n: int) -> MemoryDataset:
    return MemoryDataset(
        [Sample(id=i, input=f"square {i}", target=str(i * i)) for i in range(1, n + 1)],
        name="notes",
    )


@task
def notes(n: int = 4, big_mb: int = 0) -> Task:
    """The agent leaves /work/notes/answer.txt and check.py in a gradebook sandbox."""
    return Task(dataset=_samples(n), solver=[leave_notes(big_mb), generate()], sandbox="gradebook")


@task
def notes_local(n: int = 2) -> Task:
    """The same on Inspect's own `local` sandbox provider (capture through the sandbox API
    alone, as for any provider, e.g. Inspect's docker)."""
    return Task(dataset=_samples(n), solver=[leave_notes(), generate()], sandbox="local")


@solver
def two_desks():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await sandbox().write_file("who.txt", "default desk\n")
        await sandbox("helper").write_file("who.txt", f"helper desk {state.sample_id}\n")
        await sandbox("helper").exec(["sh", "-c", "echo only here > /work/only-helper"])
        return await generate(state)

    return solve


@task
def two_sandboxes(n: int = 2) -> Task:
    """Two named sandboxes per sample, each left with its own files."""
    config = GradebookSandboxConfig(environments=["default", "helper"])
    return Task(
        dataset=_samples(n),
        solver=[two_desks(), generate()],
        sandbox=SandboxEnvironmentSpec("gradebook", config),
    )


SCORERS = textwrap.dedent(
    '''
    """Scorers that grade from the sandbox the agent left (read_file, exec)."""
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState
    from inspect_ai.util import sandbox

    CHECK = "check.py"


    @scorer(metrics=[accuracy()])
    def notes_check():
        async def score(state: TaskState, target: Target) -> Score:
            answer = (await sandbox().read_file("notes/answer.txt")).strip()
            ran = await sandbox().exec(["python3", "-B", CHECK], cwd="notes")
            ok = answer == target.text and ran.success
            return Score(value=CORRECT if ok else INCORRECT, answer=answer,
                         explanation=ran.stdout.strip() or ran.stderr.strip()[-200:])

        return score


    @scorer(metrics=[accuracy()])
    def both_desks():
        async def score(state: TaskState, target: Target) -> Score:
            mine = (await sandbox().read_file("who.txt")).strip()
            theirs = (await sandbox("helper").read_file("who.txt")).strip()
            only = await sandbox("helper").exec(["cat", "/work/only-helper"])
            not_mine = await sandbox().exec(["test", "-e", "/work/only-helper"])
            ok = (mine == "default desk" and theirs == f"helper desk {state.sample_id}"
                  and only.stdout.strip() == "only here" and not not_mine.success)
            return Score(value=CORRECT if ok else INCORRECT, answer=f"{mine} | {theirs}")

        return score


    @scorer(metrics=[accuracy()])
    def sleeper():
        async def score(state: TaskState, target: Target) -> Score:
            await sandbox().exec(["sleep", "600"], timeout=700)
            return Score(value=CORRECT)

        return score
    '''
)


def scorer_file(directory: Path) -> Path:
    """The scorers above as a file of the user's (what `--verifier FILE@name` names)."""
    path = directory / "sandbox_scorers.py"
    path.write_text(SCORERS)
    return path


# in a file of its own: a module that names the grader role makes its scorers judge scorers
JUDGED = textwrap.dedent(
    '''
    """A sandbox scorer with a judge: the judge reads what the sandbox showed."""
    from inspect_ai.model import get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState
    from inspect_ai.util import sandbox


    @scorer(metrics=[accuracy()])
    def judged_answer():
        async def score(state: TaskState, target: Target) -> Score:
            shown = (await sandbox().exec(["cat", "notes/answer.txt"])).stdout.strip()
            reply = await get_model(role="grader").generate(
                f"Is {shown} the answer to '{state.input_text}'? Reply YES or NO."
            )
            ok = reply.completion.strip().upper().startswith("YES")
            return Score(value=CORRECT if ok else INCORRECT, answer=shown,
                         explanation=reply.completion)

        return score
    '''
)


def judged_scorer_file(directory: Path) -> Path:
    """`judged_answer` as a file of the user's."""
    path = directory / "judged_scorer.py"
    path.write_text(JUDGED)
    return path


# a ClassEval-like sample: the model writes a class, the dataset's tests are unittest cases
CLASS_TESTS = textwrap.dedent(
    """
    import unittest

    class StackTest(unittest.TestCase):
        def test_push_pop(self):
            s = Stack()
            s.push(1)
            s.push(2)
            self.assertEqual(s.pop(), 2)
            self.assertEqual(s.size(), 1)
    """
)
RIGHT_CLASS = (
    "```python\nclass Stack:\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n"
    "    def pop(self):\n        return self.items.pop()\n"
    "    def size(self):\n        return len(self.items)\n```"
)
WRONG_CLASS = RIGHT_CLASS.replace("self.items.pop()", "self.items[0]")


def judge_script(broken: list[bool]):
    """A judge for `judged_answer` (sweeps.mock_server): HTTP 500 while `broken[0]`, else YES when
    the number shown is the square asked for."""
    import re

    def script(model: str, messages: list[dict]) -> str | int:
        if broken[0]:
            return 500
        text = str(messages[-1].get("content", ""))
        found = re.search(r"Is (\d+) the answer to 'square (\d+)'", text)
        return "YES" if found and int(found.group(1)) == int(found.group(2)) ** 2 else "NO"

    return script
