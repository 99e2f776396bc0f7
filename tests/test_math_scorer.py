"""A real Inspect eval() with mockllm shows the scorer's explanation kinds."""

from __future__ import annotations

from pathlib import Path

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate

from scorers.math import math_verifier
from tasks.math import bundled_samples, math_verified, scripted_completions


def _output(text: str) -> ModelOutput:
    out = ModelOutput.from_content(model="mockllm/model", content=text)
    out.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return out


def test_eval_yields_the_explanation_kinds(tmp_path: Path) -> None:
    samples = [
        Sample(id="right", input="2+2?", target="4"),
        Sample(id="wrong", input="2+3?", target="5"),
        Sample(id="none", input="2+4?", target="6"),
        Sample(id="bad-target", input="?", target="\\frac{1}{"),
    ]
    outputs = [
        _output("Sum is four.\nANSWER: 4"),
        _output("ANSWER: 6"),
        _output("I am not sure."),
        _output("ANSWER: 1"),
    ]
    task = Task(dataset=samples, solver=generate(), scorer=math_verifier())
    [log] = eval(
        task,
        model=get_model("mockllm/model", custom_outputs=outputs),
        log_dir=str(tmp_path),
        display="none",
        max_samples=1,
    )
    assert log.status == "success"
    scores = {s.id: s.scores["math_verifier"] for s in log.samples}
    assert scores["right"].explanation == "verified equal" and scores["right"].value == 1.0
    assert scores["wrong"].explanation == "mismatch: got 6, want 5"
    assert scores["wrong"].value == 0.0
    assert scores["none"].explanation == "no parseable answer"
    assert scores["none"].metadata["reason"] == "no_answer"
    assert scores["bad-target"].metadata["reason"] == "invalid_target"


def test_bundled_task_grades_scripted_completions(tmp_path: Path) -> None:
    scripts = {s.id: s for s in scripted_completions()}
    ids = [s.id for s in bundled_samples()]
    outputs = [_output(scripts[i].correct if n % 2 == 0 else scripts[i].wrong)
               for n, i in enumerate(ids)]  # fmt: skip
    [log] = eval(
        math_verified(),
        model=get_model("mockllm/model", custom_outputs=outputs),
        log_dir=str(tmp_path),
        display="none",
        max_samples=1,
    )
    values = {s.id: s.scores["math_verifier"].value for s in log.samples}
    expected = {i: (1.0 if n % 2 == 0 else 0.0) for n, i in enumerate(ids)}
    assert values == expected
