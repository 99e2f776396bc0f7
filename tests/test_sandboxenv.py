"""The "gradebook" Inspect sandbox provider during generation: a real eval() whose solver runs
commands in a per-sample container (network-less, read-only root, non-root)."""

from __future__ import annotations

import docker_kit
import pytest
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import Score, Target, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@solver
def probe_sandbox():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box = sandbox()
        await box.write_file("dir/hello.py", "print(6 * 7)\n")
        ran = await box.exec(["python3", "dir/hello.py"])
        whoami = await box.exec(["id", "-u"])
        readonly = await box.exec(["sh", "-c", "echo x > /etc/x"])
        net = await box.exec(
            ["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 1)"]
        )
        state.metadata.update(
            out=ran.stdout.strip(),
            uid=whoami.stdout.strip(),
            readonly=not readonly.success,
            offline=not net.success,
            roundtrip=await box.read_file("dir/hello.py"),
        )
        try:
            await box.exec(["sleep", "30"], timeout=1)
            state.metadata["timeout"] = False
        except TimeoutError:
            state.metadata["timeout"] = True
        try:
            await box.read_file("missing.txt")
        except FileNotFoundError:
            state.metadata["missing"] = True
        return await generate(state)

    return solve


@scorer(metrics=[])
def record():
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=1, metadata=dict(state.metadata))

    return score


def test_provider_runs_commands_in_a_locked_down_container(docker_sandbox, tmp_path):
    import docker

    from scorers.sandbox.pool import owner_label

    task = Task(
        dataset=[Sample(input="hi", target="x")],
        solver=probe_sandbox(),
        scorer=record(),
        sandbox="gradebook",
    )
    output = ModelOutput.from_content("mockllm/model", "ok").model_copy(
        update={"usage": ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)}
    )
    model = get_model("mockllm/model", custom_outputs=[output])
    (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    meta = log.samples[0].scores["record"].metadata
    assert meta["out"] == "42"
    assert meta["uid"] == "10002"
    assert meta["readonly"] and meta["offline"] and meta["timeout"] and meta["missing"]
    assert meta["roundtrip"] == "print(6 * 7)\n"
    # The per-sample container is gone after the sample.
    left = docker_kit.owned(docker.from_env(), [owner_label()])
    pooled = set(left) - {w for w in docker_sandbox._live}
    assert pooled == set()
