"""A real Inspect eval() with mockllm shows the scorer's explanation kinds."""

from __future__ import annotations

from pathlib import Path

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate

from scorers.math import math_verifier
from tasks.math import bundled_samples, math_verified, scripted_completions


def _scored_eval(
    samples: list[Sample], outputs: list[ModelOutput], log_dir: Path, max_samples: int
):
    """A real eval() of `samples` answered by `outputs`, scored by math_verifier()."""
    task = Task(dataset=samples, solver=generate(), scorer=math_verifier())
    [log] = eval(
        task,
        model=get_model("mockllm/model", custom_outputs=outputs),
        log_dir=str(log_dir),
        display="none",
        max_samples=max_samples,
    )
    return log


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
    log = _scored_eval(samples, outputs, tmp_path, max_samples=1)
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


def test_concurrent_scoring_runs_at_most_pool_size_symbolic_comparisons(
    tmp_path: Path, monkeypatch
) -> None:
    # Inspect scores samples concurrently; the verifier's deadline counts waiting for a worker,
    # so symbolic comparisons beyond the pool's size must wait for a turn before their deadline
    # starts (each takes longer than the pool's size times its share would allow otherwise).
    import threading
    import time

    import scorers.math.grader as math_module
    from scorers.workers.bounded import shared_pool

    pool = shared_pool(math_module._SYMBOLIC_MODULES)
    real_call = pool.call
    lock = threading.Lock()
    in_flight, peak = [0], [0]

    def tracked(*args, **kwargs):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            time.sleep(0.2)  # long enough for every concurrent sample to arrive
            return real_call(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(pool, "call", tracked)
    samples = [Sample(id=f"s{i}", input="expand", target="x^2+2x+1") for i in range(6)]
    outputs = [_output("ANSWER: (x+1)^2") for _ in samples]
    log = _scored_eval(samples, outputs, tmp_path, max_samples=6)
    assert [s.scores["math_verifier"].value for s in log.samples] == [1.0] * 6
    assert peak[0] == pool.size


def test_a_sample_that_needs_sympy_before_it_has_started_is_deferred_only_when_allowed() -> None:
    # A fresh process: the symbolic pool has not booted. With may_defer (the scoring stage's
    # first pass) a symbolic comparison is deferred at once and plain ones are graded; asked
    # again without it, the verifier waits for sympy and grades.
    import subprocess
    import sys

    code = """
from scorers.grade import SampleView
from scorers.math import grade_math
ask = lambda text, target, defer: grade_math(SampleView(text, target, may_defer=defer))
print(ask("ANSWER: \\\\sqrt{8}", "2\\\\sqrt{2}", True).status)
print(ask("ANSWER: 1/2", "0.5", True).status)
g = ask("ANSWER: \\\\sqrt{8}", "2\\\\sqrt{2}", False)
print(g.status, g.value)
"""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n")[:3] == ["deferred", "scored", "scored 1.0"]
