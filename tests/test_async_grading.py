"""Inspect scorers in a grading worker (scorers.workers.async_grading): chunks graded side by side in one
event loop, and a scorer busy in Python code stopped at its limit without stopping the others.

Real worker processes (scorers.workers.pool), Inspect's own `model_graded_qa` against a local
judge server, and a scorer file that never awaits.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
from pathlib import Path

import pytest

from scorers.inspect_scorers.grading import InspectGrade
from scorers.workers.pool import GradingPool
from sweeps.mock_server import scripted_server


def _row(i: int, answer: str, target: str) -> tuple:
    state = {"messages": [], "input": f"Q{i}: what is {target}?", "model": "openai-api/gen/m",
             "epoch": 1}  # fmt: skip
    return (answer, [target], "{}", str(i), json.dumps(state))


class HeldJudge:
    """Grades "[Submission]" against "[Criterion]"; the question `held` waits for `release`."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.release = threading.Event()
        self.waiting = threading.Event()

    def __call__(self, model: str, messages: list[dict]) -> str:
        text = str(messages[-1].get("content", ""))
        if int(re.search(r"Q(\d+):", text).group(1)) == self.held:
            self.waiting.set()
            self.release.wait(60)
        sub = re.search(r"\[Submission\]: (.*?)\n\*\*\*", text, re.S).group(1)
        crit = re.search(r"\[Criterion\]: (.*?)\n\*\*\*", text, re.S).group(1)
        return f"GRADE: {'C' if crit.strip() in sub else 'I'}"


@pytest.mark.slow
def test_a_worker_grades_its_next_chunks_while_one_waits_on_the_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One worker, three chunks; the judge holds one sample of the first chunk. The other two
    chunks are graded and handed back while it waits (a worker taking one chunk at a time
    would sit idle until the judge answered), and the held one is graded once it does."""
    monkeypatch.setenv("JUDGE_API_KEY", "test")
    judge = HeldJudge(held=1)
    with scripted_server(judge, models=["j"]) as server:
        role = {"model": "openai-api/judge/j", "base_url": server.base_url, "args": {},
                "config": {"max_connections": 8, "attempt_timeout": 60}}  # fmt: skip
        spec = {"kind": "registry", "scorer": "model_graded_qa", "params": {},
                "roles": {"grader": role}}  # fmt: skip
        chunks = [[_row(i, str(i * 2), str(i * 2)) for i in range(c * 4 + 1, c * 4 + 5)]
                  for c in range(3)]  # fmt: skip
        done: dict[int, list] = {}
        order: list[int] = []

        def finished(job: int, results: list) -> None:
            done[job] = results
            order.append(job)
            if len(done) == 2:
                assert judge.waiting.is_set()
                judge.release.set()  # only now: the held sample was in flight all along

        pool = GradingPool(1)
        try:
            pool.map(InspectGrade(json.dumps(spec)), chunks, 120.0, finished)
        finally:
            judge.release.set()
            pool.close()
    assert order == [1, 2, 0]
    for job, chunk in enumerate(chunks):
        assert [r[:2] for r in done[job]] == [("scored", 1.0)] * len(chunk), done[job]


SPINNER = textwrap.dedent(
    """
    from inspect_ai.scorer import CORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState


    @scorer(metrics=[accuracy()])
    def spinner():
        async def score(state: TaskState, target: Target) -> Score:
            if state.sample_id == "2":
                while True:  # busy in Python code: never reaches an await
                    pass
            return Score(value=CORRECT, answer=state.output.completion)

        return score
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["worker", "in process"])
def test_a_scorer_busy_in_python_past_its_limit_is_stopped_and_the_others_are_graded(
    where: str, tmp_path: Path
) -> None:
    from scorers.workers.pool import grade_chunk

    path = tmp_path / "spin_scorer.py"
    path.write_text(SPINNER)
    grade = InspectGrade(json.dumps({"kind": "file", "scorer": "spinner", "file": str(path),
                                     "params": {}}))  # fmt: skip
    rows = [_row(i, f"a{i}", "x") for i in (1, 2, 3)]
    if where == "worker":
        got: list = []
        pool = GradingPool(1)
        try:
            pool.map(grade, [rows], 1.0, lambda job, results: got.extend(results))
        finally:
            pool.close()
    else:
        got = grade_chunk(grade, rows, 1.0)
    assert [(r[0], r[1], r[4]) for r in got] == [
        ("scored", 1.0, "correct"),
        ("unscored", None, "timeout"),
        ("scored", 1.0, "correct"),
    ], got
    assert "did not finish within 1s" in got[1][3]
    assert [r[2] for r in got] == ["a1", None, "a3"]


@pytest.fixture
def own_registry():
    import inspect_scorer_kit as kit

    yield from kit.isolated_registry()


def test_the_fingerprint_covers_how_a_sample_is_graded_not_how_samples_are_scheduled(
    own_registry,
) -> None:
    """grading.py (the TaskState rebuild, the scorer's call, the conversion) is in an Inspect
    scorer's fingerprint; the worker's event loop and watchdog are not, so a change to them
    grades nothing again."""
    from scorers.identity.fingerprint import fingerprint
    from scorers.inspect_scorers.specs import resolve

    fp = fingerprint(resolve("match", trusted=True))
    modules = [line for line in fp.source.splitlines() if line.startswith("# ---- module")]
    assert "# ---- module scorers.inspect_scorers.grading" in modules
    assert "# ---- module scorers.inspect_scorers.judges" in modules
    assert not [m for m in modules if m.startswith("# ---- module flows")], modules


def test_a_chunk_that_fails_outside_its_samples_is_answered_as_failed_never_awaited_for_ever():
    """A worker whose async chunk raises past the per-sample code answers the job with the
    error, as a synchronous job's failure is answered: the stage, which waits for an answer to
    every job it handed out, would otherwise wait for ever."""
    from async_fault_kit import BindFails

    rows = [_row(i, f"a{i}", "x") for i in (1, 2)]
    got: list = []
    pool = GradingPool(1)
    stage = threading.Thread(
        target=lambda: pool.map(BindFails(), [rows, rows], 5.0, lambda j, r: got.append(r)),
        daemon=True,
    )
    try:
        stage.start()
        stage.join(120)  # a bound on a hang, not a timing: the answer comes at once
        assert not stage.is_alive(), "the stage is still waiting for the worker's answer"
    finally:
        pool.close()
    assert len(got) == 2
    for results in got:
        assert [r[0] for r in results] == ["unscored", "unscored"]
        assert "RuntimeError: the scorer's package is broken" in results[0][3], results
