"""An agentic coding task, offline: an agent fixes a failing test in a small repository.

Each sample is a ticket about the same bug (`add` subtracts) in the repository in
`tasks/data/agentic_repo/`, copied into the sample's sandbox (`sandbox="gradebook"`: one
locked-down container per sample) at `/work/repo`. The agent works only through Inspect's
`bash` tool there. The scorer (tasks/agentic_scorer.py) runs the tests in the sandbox.

`scripted_agent` is the model: a mockllm `custom_outputs` callable that plays an agent from a
script, so the example needs no model server. It looks at the code, fixes `add` with `sed`,
runs the tests and reports; on every third ticket it also "tidies" `mul` and breaks it (a
test the scorer's first test command does not run); on the fifth it gives up. A sweep config
uses it as `model = "mockllm/model"` with `args_from = "tasks.agentic:scripted_agent_args"`.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ModelOutput, ModelUsage
from inspect_ai.solver import generate, system_message, use_tools
from inspect_ai.tool import bash

from tasks.agentic_scorer import repo_tests

REPO = Path(__file__).resolve().parent / "data" / "agentic_repo"
SYSTEM = (
    "You are a software engineer. The repository is in /work/repo. Use the bash tool to "
    "inspect and edit files and to run the tests (python3 -B -m unittest). When you are done, "
    "reply with a one-line summary and no tool call."
)
_TICKET = re.compile(r"Ticket (\d+):")

# the agent's steps: (bash command, or None for the final reply), by kind of ticket
_FIX = "sed -i 's/return a - b/return a + b/' calc.py"
_CARELESS = "sed -i 's/return a - b/return a + b/; s/return a [*] b/return a * b + 0.5/' calc.py"
_STEPS = {
    "fix": ["cat calc.py", _FIX, "python3 -B -m unittest 2>&1 | tail -n 3"],
    "careless": ["cat calc.py", _CARELESS, "python3 -B -m unittest test_calc.AddTests 2>&1"],
    "give_up": ["cat calc.py"],
}
_REPLY = {
    "fix": "Fixed add(): it subtracted; the tests pass.",
    "careless": "Fixed add() and tidied mul().",
    "give_up": "I could not find the bug.",
}

calls = [0]  # model calls this process made (the demo shows a re-score makes none)
_calls_lock = threading.Lock()


def ticket_kind(ticket: int) -> str:
    """How the scripted agent handles a ticket: every fifth it gives up, every third it also
    breaks `mul`, the rest it fixes."""
    if ticket % 5 == 0:
        return "give_up"
    return "careless" if ticket % 3 == 0 else "fix"


# what a more thorough agent looks at first (`make_agent(explore=k)`), in turn
_LOOKS = (
    "ls -la",
    "cat test_calc.py",
    "grep -n 'def ' calc.py",
    "python3 -B -m unittest 2>&1 | tail -n 3",
)


def make_agent(explore: int = 0) -> Any:
    """A scripted agent (a mockllm `custom_outputs` callable) that first runs `explore`
    read-only commands, then works its ticket."""

    def agent(input: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        with _calls_lock:
            calls[0] += 1
        users = (m for m in input if getattr(m, "role", "") == "user")
        found = _TICKET.search(" ".join(str(getattr(m, "text", "")) for m in users))
        kind = ticket_kind(int(found.group(1)) if found else 1)
        done = sum(1 for m in input if getattr(m, "role", "") == "tool")
        steps = [_LOOKS[i % len(_LOOKS)] for i in range(explore)] + _STEPS[kind]
        if done < len(steps):
            command = f"cd /work/repo && {steps[done]}"
            output = ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command})
        else:
            output = ModelOutput.from_content("mockllm/model", _REPLY[kind])
        return output.model_copy(
            update={"usage": ModelUsage(input_tokens=50, output_tokens=20, total_tokens=70)}
        )

    return agent


scripted_agent = make_agent()  # the example's agent: straight to the ticket


def scripted_agent_args() -> dict[str, Any]:
    """Model args for a sweep config's `args_from`: mockllm driven by `scripted_agent`."""
    return {"custom_outputs": scripted_agent}


def tickets(n: int) -> list[Sample]:
    """`n` tickets about the bug, each with its own copy of the repository."""
    files = {f"repo/{p.name}": p.read_text() for p in sorted(REPO.glob("*.py"))}
    return [
        Sample(
            id=i,
            input=f"Ticket {i}: add() returns wrong results. Fix the repository so its tests pass.",
            target="the tests pass",
            files=dict(files),
        )
        for i in range(1, n + 1)
    ]


IMAGE_RECIPE = Path(__file__).resolve().parent / "data" / "agentic_image"


def image_compose(directory: Path, base: str) -> Path:
    """The own-image variant's recipe in `directory`: a compose file whose one service is
    built from tasks/data/agentic_image/ (gradebook's sandbox image `base` plus `repo-check`)."""
    import shutil

    image = directory / "image"
    shutil.copytree(IMAGE_RECIPE, image, dirs_exist_ok=True)
    compose = directory / "compose.yaml"
    compose.write_text(
        "services:\n  default:\n"
        f'    build: {{context: image, args: {{BASE: "{base}"}}}}\n'
        "    working_dir: /work\n"
    )
    return compose


@task
def fix_the_bug(tickets_n: int = 6, image_recipe: str | None = None) -> Task:
    """The agentic example: `tickets_n` tickets, an agent with a bash tool in a gradebook
    sandbox, scored by running the repository's tests in that sandbox.

    Args:
        tickets_n: how many tickets (samples).
        image_recipe: a compose file (`image_compose`): the sandboxes run in the image it
            builds (gradebook's plus the repository's checker) instead of gradebook's own.
    """
    return Task(
        dataset=MemoryDataset(tickets(tickets_n), name="fix_the_bug"),
        solver=[system_message(SYSTEM), use_tools([bash(timeout=60)]), generate()],
        scorer=repo_tests(),
        sandbox=("gradebook", image_recipe) if image_recipe else "gradebook",
        message_limit=100,
        metadata={"workspace_paths": ["/work/repo"]},
    )
