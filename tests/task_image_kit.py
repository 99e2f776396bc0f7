"""Test material for tasks that bring their own image: a recipe directory (compose file,
Dockerfile FROM gradebook's local sandbox image, a `checker` tool and a file of the image's own at
the working directory), tasks that run in it, and a scorer that calls the tool.

Each recipe holds a nonce, so its digest, and so its image tags, are this test run's alone: a
second checkout running the same tests on the same Engine builds and removes its own images.
"""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.solver import Generate, TaskState, generate, solver
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

from scorers.sandbox.image import image_tag
from scorers.sandbox.provider import GradebookSandboxConfig

KIT = Path(__file__).resolve()
WRONG = 2  # the sample whose "agent" writes a wrong answer

# the task's own tool, which gradebook's image does not have: is the answer the square of $2?
CHECKER = textwrap.dedent(
    """\
    #!/bin/sh
    a=$(cat "$1"); n=$2
    if [ "$a" = "$((n * n))" ]; then echo "checker: $a is right"; else echo "checker: $a is wrong"; exit 1; fi
    """
)


def recipe_dir(root: Path, *, services: str | None = None) -> Path:
    """A task directory with compose.yaml, a Dockerfile adding `checker` (and a nonce label),
    and the image's own /work/given.txt. `services`: the compose file's text (default: one
    service)."""
    root.mkdir(parents=True, exist_ok=True)
    image = root / "image"
    image.mkdir(exist_ok=True)
    (image / "checker").write_text(CHECKER)
    (image / "checker").chmod(0o755)
    (image / "given.txt").write_text("from the image\n")
    (image / "Dockerfile").write_text(
        textwrap.dedent(
            """\
            ARG BASE=BASE_TAG
            FROM ${BASE}
            USER root
            COPY checker /usr/local/bin/checker
            COPY given.txt /work/given.txt
            RUN chown -R 10002:10002 /work
            USER 10002:10002
            LABEL test.nonce=NONCE
            """
        )
        .replace("NONCE", uuid.uuid4().hex)
        .replace("BASE_TAG", image_tag())
    )
    (root / "compose.yaml").write_text(
        services
        or textwrap.dedent(
            f"""\
            services:
              default:
                build:
                  context: image
                  args: {{BASE: "{image_tag()}"}}
                working_dir: /work
                environment: {{TASK_FLAVOUR: squares}}
                network_mode: none
                init: true
                command: tail -f /dev/null
            """
        )
    )
    return root


TWO_SERVICES = """\
services:
  default:
    build: {{context: image, args: {{BASE: "{base}"}}}}
  helper:
    image: "{base}"
    working_dir: /work
    user: root  # the image's /work is root's
"""


@solver
def square_it():
    """The 'agent': reads the image's own file, writes its answer (wrong for sample WRONG)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = int(state.sample_id)
        given = (await sandbox().read_file("given.txt")).strip()
        await sandbox().write_file("notes/answer.txt", f"{0 if n == WRONG else n * n}\n")
        await sandbox().write_file("notes/seen.txt", given + "\n")
        if "helper" in state.metadata.get("sandboxes", ""):
            await sandbox("helper").write_file("helper.txt", f"helper {n}\n")
        return await generate(state)

    return solve


def _samples(n: int, sandboxes: str = "default") -> MemoryDataset:
    return MemoryDataset(
        [
            Sample(id=i, input=f"square {i}", target=str(i * i), metadata={"sandboxes": sandboxes})
            for i in range(1, n + 1)
        ],  # fmt: skip
        name="squares",
    )


@task
def squares(recipe: str, n: int = 3, provider: str = "gradebook") -> Task:
    """Runs in the image its compose file builds (`provider="docker"`: written for Inspect's)."""
    return Task(
        dataset=_samples(n),
        solver=[square_it(), generate()],
        sandbox=(provider, str(Path(recipe) / "compose.yaml")),
    )


@task
def squares_dockerfile(recipe: str, n: int = 3) -> Task:
    """Runs in the image its Dockerfile alone builds (no compose file: no variables)."""
    return Task(
        dataset=_samples(n),
        solver=[square_it(), generate()],
        sandbox=("gradebook", str(Path(recipe) / "image" / "Dockerfile")),
    )


@task
def squares_named(image: str, n: int = 3) -> Task:
    """Runs in an image the Engine holds, named by gradebook's sandbox config."""
    return Task(
        dataset=_samples(n),
        solver=[square_it(), generate()],
        sandbox=SandboxEnvironmentSpec("gradebook", GradebookSandboxConfig(image=image)),
    )


@solver
def answer_only():
    """The 'agent' of a sandbox with no image of the task's: writes its answer only."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = int(state.sample_id)
        await sandbox().write_file("notes/answer.txt", f"{0 if n == WRONG else n * n}\n")
        return await generate(state)

    return solve


@task
def squares_local(n: int = 2) -> Task:
    """On Inspect's own `local` provider (captured through the sandbox API, as Inspect's
    docker sandbox is)."""
    return Task(dataset=_samples(n), solver=[answer_only(), generate()], sandbox="local")


@task
def squares_two(recipe: str, n: int = 2) -> Task:
    """Two services: the default built with the tool, a helper from gradebook's image."""
    return Task(
        dataset=_samples(n, "default,helper"),
        solver=[square_it(), generate()],
        sandbox=("gradebook", str(Path(recipe) / "compose.yaml")),
    )


SCORERS = textwrap.dedent(
    '''
    """A scorer that calls the task image's own tool."""
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState
    from inspect_ai.util import sandbox


    @scorer(metrics=[accuracy()])
    def tool_check():
        async def score(state: TaskState, target: Target) -> Score:
            ran = await sandbox().exec(["checker", "notes/answer.txt", str(state.sample_id)])
            flavour = await sandbox().exec(["sh", "-c", "echo $TASK_FLAVOUR"])
            seen = (await sandbox().read_file("notes/seen.txt")).strip()
            return Score(value=CORRECT if ran.success else INCORRECT,
                         answer=f"{seen}|{flavour.stdout.strip()}",
                         explanation=(ran.stdout + ran.stderr).strip()[-200:])

        return score


    @scorer(metrics=[accuracy()])
    def answer_read():
        async def score(state: TaskState, target: Target) -> Score:
            answer = (await sandbox().read_file("notes/answer.txt")).strip()
            return Score(value=CORRECT if answer == target.text else INCORRECT, answer=answer)

        return score


    @scorer(metrics=[accuracy()])
    def two_services():
        async def score(state: TaskState, target: Target) -> Score:
            tool = await sandbox().exec(["checker", "notes/answer.txt", str(state.sample_id)])
            helper = (await sandbox("helper").read_file("helper.txt")).strip()
            no_tool = await sandbox("helper").exec(["sh", "-c", "command -v checker"])
            ok = tool.success and helper == f"helper {state.sample_id}" and not no_tool.success
            return Score(value=CORRECT if ok else INCORRECT, answer=helper)

        return score
    '''
)


def scorer_file(directory: Path) -> Path:
    path = directory / "tool_scorers.py"
    path.write_text(SCORERS)
    return path
