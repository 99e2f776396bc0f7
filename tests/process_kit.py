"""Test material for tests that run `gradebook` as a real process and follow what it starts:
logs, environments, /proc (tests/cli_kit.py runs it as a user's shell would).

`make_log` writes a real Inspect log with mockllm (no Prefect). `cli_env` is an environment for a
`gradebook` subprocess; its MARK variable is inherited by every process the command starts, so
`marked` finds them all in /proc, wherever they are in the process tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import flows_kit

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
MARK = "GRADEBOOK_TEST_MARK"
# the line a stopped scoring stage prints (a regex; format it with the signal's name and
# "Ctrl-C again" or "again"): "gradebook: SIGINT: stopping: writing 3,250 graded results,
# 11,000 in all (Ctrl-C again to exit at once)"
STOP_LINE = (
    r"gradebook: {sig}: stopping: writing (?P<writing>[\d,]+) graded results, "
    r"(?P<all>[\d,]+) in all \({again} to exit at once\)"
)


def make_log(
    directory: Path, n: int, *, verifiers: list[str] | None = None, task: str = ""
) -> Path:
    """A real `.eval` log of `n` arith samples answered right, recording `verifiers` (which
    need not be importable here: generation never grades)."""
    from flows.generate import run_generation
    from sweeps.config import ModelConfig, TaskConfig

    directory.mkdir(parents=True, exist_ok=True)
    model = ModelConfig(
        model="mockllm/model", args={"custom_outputs": flows_kit.mock_outputs(set())}
    )
    spec = TaskConfig(
        task=task or flows_kit.TASK_SPEC, args={"n": n}, verifiers=verifiers or ["math"]
    )
    (result,) = run_generation(model, [spec], directory)
    assert result.log is not None, result.error
    return Path(result.log)


def cli_env(*paths: Path, api_url: str | None = None, **extra: str) -> dict[str, str]:
    """An environment for a `gradebook` subprocess: the repo, tests and `paths` importable,
    PREFECT_API_URL only if given, and a fresh MARK."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), *map(str, paths)])
    env[MARK] = uuid.uuid4().hex
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env


def _command(args: tuple[str, ...], preload: tuple[str, ...]) -> list[str]:
    # `preload`: verifier modules to import first, so the command knows the verifiers they
    # register (the CLI itself knows only the built-in ones)
    if not preload:
        return [sys.executable, "-m", "flows.cli", *args]
    code = f"import {', '.join(preload)}; from flows.cli import main; main()"
    return [sys.executable, "-c", code, *args]


def gradebook(
    *args: str,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 300,
    preload: tuple[str, ...] = (),
):
    """Run `gradebook ARGS` to the end; returns the CompletedProcess (text)."""
    return subprocess.run(
        _command(args, preload),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_gradebook(
    *args: str, env: dict[str, str], cwd: Path | None = None, preload: tuple[str, ...] = ()
):
    """Start `gradebook ARGS` in a process group of its own (as a shell job is), so a test can
    signal the group the way a terminal's Ctrl-C does."""
    return subprocess.Popen(
        _command(args, preload),
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries MARK=mark (every process a command started).

    Read from /proc directly, so the tests judge the old code by the same measure."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not stat[stat.rindex(")") + 2 :].startswith("Z"):  # zombies have exited
            found.append(int(entry.name))
    return found


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    """Poll `condition` until it is truthy (returned) or `timeout` passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def busy_loops(n: int) -> list[subprocess.Popen]:
    """`n` processes spinning on a core each (a machine under CPU load)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


SLOW_VERIFIER = textwrap.dedent(
    '''
    """{name}: the last word equals the target; DELAY_S per sample (a long stage to stop).
    With GRADEBOOK_TEST_TRACE set, each grading process appends a byte to that file per
    sample graded: how far a stage got, seen from outside it."""
    import os
    import time

    from scorers.grade import SampleView, scored
    from scorers.registry import Verifier, register

    DELAY_S = {delay!r}
    _TRACE = os.environ.get("GRADEBOOK_TEST_TRACE")
    _FD = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT) if _TRACE else None


    def grade(view: SampleView):
        if DELAY_S:
            time.sleep(DELAY_S)
        if _FD is not None:
            os.write(_FD, b".")
        words = view.completion.split()
        answer = words[-1] if words else None
        ok = answer == view.targets[0]
        return scored(1.0 if ok else 0.0, answer=answer, explanation="equal" if ok else "mismatch",
                      reason="verified_equal" if ok else "mismatch")


    register(Verifier("{name}", grade, module="{name}", params={{}}, label="test: last word"))
    '''
)


def write_verifier(directory: Path, name: str, delay_s: float = 0.0) -> Path:
    """A verifier module `name` in `directory`; re-writing it with another delay changes its
    fingerprint."""
    path = directory / f"{name}.py"
    path.write_text(SLOW_VERIFIER.format(name=name, delay=delay_s))
    return path


class Lines:
    """Collects a pipe's lines in a thread, so a test can wait for one while the process runs."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "\n".join(self.lines)


def score_counts(db: Path, scorer: str) -> tuple[int, int]:
    """(score rows, distinct samples scored) for `scorer`; (-1, -1) while a writer holds it."""
    from warehouse import Warehouse, WarehouseLocked, WarehouseMissing

    try:
        with Warehouse(db, lock_timeout_s=0.2).read() as con:
            return con.execute(
                "SELECT count(*), count(DISTINCT (run_id, sample_id, epoch)) FROM scores "
                "WHERE scorer = ?",
                [scorer],
            ).fetchone()
    except WarehouseMissing:
        return (0, 0)
    except WarehouseLocked:
        return (-1, -1)


def flow_run_states(api_url: str, flow: str, where: Path) -> list[str]:
    """States of the `flow` runs a test started, oldest first: those whose parameters name its
    directory (the session's server also holds other tests' runs, scheduled ones among them)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )
    return [r.state_type.value for r in runs if str(where) in json.dumps(r.parameters)]
