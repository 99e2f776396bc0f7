"""Test material for the cluster tests: workers as process groups, a slow test verifier, model args.

`mock_args` is what a test sweep's `args_from` names: the GPU worker imports this module (the
tests directory is on its PYTHONPATH) and builds mockllm's scripted outputs there, because a
Python callable cannot travel to a worker as JSON.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import flows_kit

WRONG = {2, 5}


def mock_args() -> dict[str, Any]:
    """mockllm args: right answers except for operands in WRONG."""
    return {"custom_outputs": flows_kit.mock_outputs(WRONG)}


SLOW_VERIFIER = textwrap.dedent(
    '''
    """{name}: last word equals the target, after a pause (long enough to kill a chunk mid-way)."""
    import time

    from scorers.grade import SampleView, scored
    from scorers.registry import Verifier, register

    DELAY_S = {delay!r}


    def grade(view: SampleView):
        time.sleep(DELAY_S)
        words = view.completion.split()
        answer = words[-1] if words else None
        ok = answer == view.targets[0]
        return scored(
            1.0 if ok else 0.0,
            answer=answer,
            explanation="equal" if ok else "mismatch",
            reason="verified_equal" if ok else "mismatch",
        )


    register(Verifier("{name}", grade, module="{name}", params={{}}, label="test: slow last word"))
    '''
)


def write_slow_verifier(directory: Path, name: str, delay_s: float) -> Path:
    path = directory / f"{name}.py"
    path.write_text(SLOW_VERIFIER.format(name=name, delay=delay_s))
    return path


class Worker:
    """A `prefect worker start` subprocess in its own process group (killed as a whole)."""

    def __init__(self, pool: str, env: dict[str, str], log: Path, name: str) -> None:
        from flows.cluster.setup import worker_command

        self.pool = pool
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                worker_command(pool, name=name),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL the worker's whole process group: what a host losing power looks like."""
        kill_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        kill_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            kill_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
