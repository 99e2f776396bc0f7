"""All 164 HumanEval canonical solutions pass in the real sandbox; the same with `return None` fail."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from scorers.code import run_unit_tests, unit_tests_for
from tasks.code import humaneval_problems

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _run_all(variant: str) -> dict[str, object]:
    problems = humaneval_problems()

    def one(p: dict):
        body = p["canonical_solution"] if variant == "canonical" else "    return None\n"
        tests, entry_point = unit_tests_for({"test": p["test"], "entry_point": p["entry_point"]})
        return p["task_id"], run_unit_tests(p["prompt"] + body, tests, entry_point=entry_point)

    with ThreadPoolExecutor(max_workers=2) as executor:
        return dict(executor.map(one, problems))


def test_all_164_canonical_solutions_pass(docker_sandbox):
    verdicts = _run_all("canonical")
    assert len(verdicts) == 164
    failing = {k: (v.status, v.detail[:200]) for k, v in verdicts.items() if not v.passed}
    assert failing == {}


def test_all_164_return_none_bodies_fail(docker_sandbox):
    verdicts = _run_all("none")
    assert len(verdicts) == 164
    passing = [k for k, v in verdicts.items() if v.passed]
    assert passing == []
    # Failures are real test failures, not sandbox trouble.
    assert {v.status for v in verdicts.values()} == {"failed"}
