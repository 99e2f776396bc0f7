"""The HumanEval task end to end: a real Inspect eval() with mockllm, scored in the sandbox, and
the same verdicts from the registered verifier reading only what the log keeps."""

from __future__ import annotations

import math

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, ModelUsage, get_model

from scorers.grade import SampleView
from scorers.registry import get_verifier
from tasks.code import humaneval, humaneval_problems

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _answers() -> list[str]:
    p0, p1, _ = humaneval_problems()[:3]
    return [
        f"Here you go:\n```python\n{p0['prompt']}{p0['canonical_solution']}```",
        f"```python\n{p1['prompt']}    return None\n```",
        "I am not sure how to solve this.",
    ]


def test_humaneval_eval_scores_in_the_sandbox(docker_sandbox, tmp_path):
    outputs = [
        ModelOutput.from_content("mockllm/model", text).model_copy(
            update={"usage": ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)}
        )
        for text in _answers()
    ]
    model = get_model("mockllm/model", custom_outputs=outputs)
    (log,) = inspect_eval(humaneval(limit=3), model=model, log_dir=str(tmp_path), display="none")
    assert log.status == "success"
    by_id = {s.id: s for s in log.samples}
    values = {sid: next(iter(s.scores.values())).value for sid, s in by_id.items()}
    assert values == {"HumanEval/0": 1.0, "HumanEval/1": 0.0, "HumanEval/2": 0.0}
    reasons = {sid: next(iter(s.scores.values())).metadata["reason"] for sid, s in by_id.items()}
    assert reasons == {
        "HumanEval/0": "tests_passed",
        "HumanEval/1": "tests_failed",
        "HumanEval/2": "no_answer",
    }

    # Re-scoring from the log alone (completion, target, metadata) agrees.
    verifier = get_verifier("unit_tests")
    assert verifier.module == "scorers.code" and verifier.params["image"].startswith(
        "gradebook-sandbox:"
    )
    for sample in log.samples:
        view = SampleView(sample.output.completion, sample.target, sample.metadata, sample.id)
        grade = verifier.grade(view)
        assert grade.status == "scored" and not math.isnan(grade.value)
        assert grade.value == values[sample.id]
