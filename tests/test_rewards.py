"""The reward and the scorer agree on every case, because both call grade_math."""

from __future__ import annotations

import json
from pathlib import Path

from test_math_verify import EQUAL, NOT_EQUAL

from scorers.grade import SampleView
from scorers.math import grade_math
from scorers.rewards import math_reward
from tasks.math import scripted_completions


def _scorer_correct(completion: str, reference: str) -> bool:
    return grade_math(SampleView(completion=completion, target=reference)).correct


def test_reward_matches_scorer_on_table_cases() -> None:
    for candidate, reference in EQUAL + NOT_EQUAL:
        completion = f"Reasoning.\nANSWER: {candidate}"
        assert math_reward(completion, reference) == float(_scorer_correct(completion, reference))


def test_reward_matches_scorer_on_bundled_scripts() -> None:
    problems = {
        json.loads(line)["id"]: json.loads(line)["answer"]
        for line in (Path("tasks/data/math_problems.jsonl")).read_text().splitlines()
    }
    for script in scripted_completions():
        ref = problems[script.id]
        assert (
            math_reward(script.correct, ref) == 1.0 == float(_scorer_correct(script.correct, ref))
        )
        assert math_reward(script.wrong, ref) == 0.0 == float(_scorer_correct(script.wrong, ref))


def test_reward_matches_scorer_on_shared_data(shared_data: Path) -> None:
    rows = [
        json.loads(line)
        for line in (shared_data / "math" / "other_grader_tests.jsonl").read_text().splitlines()
    ]
    for row in rows:
        completion = f"ANSWER: {row['candidate']}"
        assert math_reward(completion, row["reference"]) == float(
            _scorer_correct(completion, row["reference"])
        )


def test_reward_is_zero_without_answer() -> None:
    assert math_reward("I do not know.", "3") == 0.0
