"""Sharing one zygote between processes: the scoring stage's workers boot a verifier's heavy
helper (math: sympy, seconds of CPU) once per stage, not once per worker, and keep hard deadlines."""

from __future__ import annotations

import json
import os
import textwrap
import threading
from pathlib import Path

import pytest

import scorers.workers.zygote as zygote
from flows.score import ScoreOptions, grade_batch
from scorers.registry import Verifier
from scorers.workers.bounded import BoundedPool, WorkerTimeout
from scorers.workers.pool import GradingPool

# A stand-in for sympy: records every process that imports it, in a file next to it.
_HEAVY = """
import os, time
with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")


def whose_child():
    return os.getppid()  # the zygote this worker was forked from


def sleep(seconds):
    time.sleep(seconds)
    return "woke"
"""

_VERIFIER = """
from scorers.workers.bounded import shared_pool
from scorers.grade import scored


def grade(view):
    zygote = shared_pool(({heavy!r},)).call({heavy!r} + ":whose_child", timeout_s=30)
    return scored(1.0, answer=view.completion, explanation="ok", reason="ok", zygote=zygote)
"""


@pytest.fixture
def heavy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"heavy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_HEAVY))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _imports(tmp_path: Path) -> list[str]:
    """The pids of the processes that imported the heavy module."""
    log = tmp_path / "imports.log"
    return log.read_text().split() if log.exists() else []


@pytest.fixture
def broker_here(monkeypatch: pytest.MonkeyPatch):
    """This test process as a broker's child (what a grading worker is)."""
    monkeypatch.setattr(zygote, "_BROKER", None)
    broker = zygote.ZygoteBroker()
    zygote.use_broker(broker.channel().detach())
    yield broker
    broker.close()


def test_grading_workers_share_one_zygote(heavy: str, tmp_path: Path) -> None:
    name = f"share_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_VERIFIER.format(heavy=heavy)))
    verifier = Verifier(name="share", grade=__import__(name).grade, module=name)
    rows = [
        {"run_id": "r", "sample_id": str(i), "epoch": 1, "completion": "x", "target": ["x"],
         "metadata": "{}", "error": None}
        for i in range(24)
    ]  # fmt: skip
    pool = GradingPool(2)
    try:
        results = grade_batch(
            pool, verifier, rows, ScoreOptions(workers=2, chunk_size=3), in_process=False
        )
        workers = pool.pids()
    finally:
        pool.close()
    assert [r[0] for r in results] == ["scored"] * 24
    zygotes = {json.loads(r[5])["zygote"] for r in results}
    assert len(zygotes) == 1  # every worker's helpers came from one zygote...
    (shared,) = zygotes
    assert shared not in workers  # ...that belongs to the stage, not to one worker
    assert _imports(tmp_path) == [str(shared)]  # and the heavy module was imported once, there


def test_a_shared_zygote_keeps_the_hard_deadline(heavy: str, broker_here, tmp_path: Path) -> None:
    pool = BoundedPool(size=1, preload=(heavy,))
    try:
        assert pool.call(f"{heavy}:sleep", 0, timeout_s=30) == "woke"
        with pytest.raises(WorkerTimeout):
            pool.call(f"{heavy}:sleep", 30, timeout_s=0.5)
        # the overrunning worker was killed and replaced by a fork of the same zygote
        assert pool.call(f"{heavy}:whose_child", timeout_s=30) != os.getpid()
        assert pool.stats().kills == 1
    finally:
        pool.shutdown()
    assert len(_imports(tmp_path)) == 1


def test_a_pool_whose_broker_is_gone_boots_its_own_zygote(
    heavy: str, broker_here, tmp_path: Path
) -> None:
    broker_here.close()
    pool = BoundedPool(size=1, preload=(heavy,))
    try:
        parent = pool.call(f"{heavy}:whose_child", timeout_s=30)
    finally:
        pool.shutdown()
    assert parent != os.getpid()
    assert _imports(tmp_path) == [str(parent)]


def test_zygotes_of_a_closed_broker_exit(heavy: str) -> None:
    broker = zygote.ZygoteBroker()
    z = broker.zygote((heavy,))
    pid, conn = z.fork()
    conn.recv()  # the worker's "ready"
    broker.close()
    z.proc.wait(timeout=10)
    with pytest.raises((EOFError, OSError)):
        conn.recv()  # the worker died with its zygote
    with pytest.raises(zygote.ZygoteFailed):
        broker.zygote((heavy,))


def test_closing_a_broker_ends_a_zygote_stuck_in_its_imports(tmp_path: Path, monkeypatch) -> None:
    name = f"stuck_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "importing.pid"
    (tmp_path / f"{name}.py").write_text(
        f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    broker = zygote.ZygoteBroker()
    outcome: list[BaseException] = []

    def boot() -> None:
        try:
            broker.zygote((name,))
        except zygote.ZygoteFailed as exc:
            outcome.append(exc)

    booting = threading.Thread(target=boot, daemon=True)
    booting.start()
    while not marker.exists() or not marker.read_text():
        booting.join(0.05)
    pid = int(marker.read_text())
    broker.close()  # must not wait for the import (a user's Ctrl-C, a flow that is done)
    booting.join(30)
    assert len(outcome) == 1  # the boot gave up...
    assert _gone(pid)  # ...and the stuck zygote was killed and reaped


def _gone(pid: int, patience_s: float = 30.0) -> bool:
    """Whether `pid` disappears (killed and reaped) within a generous wait."""
    for _ in range(int(patience_s / 0.05)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        threading.Event().wait(0.05)
    return False


def test_a_stage_boots_declared_helpers_up_front(heavy: str, tmp_path: Path) -> None:
    name = f"early_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_VERIFIER.format(heavy=heavy)))
    verifier = Verifier(name="early", grade=__import__(name).grade, module=name,
                        helpers=((heavy,),))  # fmt: skip
    pool = GradingPool(2)
    try:
        pool.start([verifier.module], verifier.helpers)
        # the helper's zygote boots before any sample asks for it
        while not _imports(tmp_path):
            threading.Event().wait(0.05)
        (booted,) = _imports(tmp_path)
        rows = [
            {"run_id": "r", "sample_id": str(i), "epoch": 1, "completion": "x",
             "target": ["x"], "metadata": "{}", "error": None}
            for i in range(12)
        ]  # fmt: skip
        results = grade_batch(
            pool, verifier, rows, ScoreOptions(workers=2, chunk_size=3), in_process=False
        )
    finally:
        pool.close()
    assert {json.loads(r[5])["zygote"] for r in results} == {int(booted)}
    assert _imports(tmp_path) == [booted]
