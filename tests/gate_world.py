"""Builds real warehouses for the gate and report tests.

Logs come from real Inspect `eval()` runs against mockllm (each output carries `usage`, so no
tokenizer download); they are ingested by the real `Warehouse`; score rows are written through
its real `write_scores` path, graded by the small verifiers below, which stand in for the
scoring stage (the thing under test here is the gate, not the scorer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage
from inspect_ai.solver import generate

from scorers.grade import Grade, SampleView, scored, unscored
from warehouse import SCORE_SCHEMA, Warehouse


def exact(view: SampleView) -> Grade:
    """Right when the completion equals a target (after trimming)."""
    got = view.completion.strip()
    ok = got in [t.strip() for t in view.targets]
    return scored(
        1.0 if ok else 0.0,
        answer=got,
        explanation=f"{'match' if ok else 'mismatch'}: got {got!r}",
        reason="verified_equal" if ok else "mismatch",
    )


def outage_judge(view: SampleView) -> Grade:
    """A judge that times out on exactly the samples it would have marked wrong."""
    grade = exact(view)
    if grade.value == 1.0:
        return grade
    return unscored("timeout", "judge timed out", answer=grade.answer)


def lenient(view: SampleView) -> Grade:
    """A changed verifier: also accepts the answer with a trailing '.0'."""
    got = view.completion.strip().removesuffix(".0")
    ok = got in [t.strip() for t in view.targets]
    return scored(
        1.0 if ok else 0.0,
        answer=got,
        explanation=f"{'match' if ok else 'mismatch'}: got {got!r}",
        reason="verified_equal" if ok else "mismatch",
    )


def run_eval(
    log_dir: Path,
    answers: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    task_name: str = "arith",
    model: str = "mockllm/model",
    epochs: int = 1,
    errors: Sequence[int] = (),
    metadata: dict | None = None,
    limit: int | None = None,
) -> Path:
    """One real Inspect eval; sample i is answered answers[(i, epoch)] in generation order.

    Args:
        answers: one completion per generated (sample, epoch), in the order Inspect asks.
        targets: per sample; defaults to str(i) for sample id i.
        errors: generation indices whose model call raises (the sample errors).
    """
    n = len(answers) // epochs
    targets = list(targets) if targets is not None else [str(i) for i in range(n)]
    dataset = [Sample(id=f"q{i:03d}", input=f"What is {i}?", target=targets[i]) for i in range(n)]
    # Generation order across epochs is not guaranteed, so answers are keyed by
    # (sample input, nth time it was asked) rather than by call order.
    asked: dict[str, int] = {}
    by_key = {(f"What is {i}?", e): answers[e * n + i] for i in range(n) for e in range(epochs)}
    error_keys = {(f"What is {i % n}?", i // n) for i in errors}

    def respond(input, tools, tool_choice, config) -> ModelOutput:  # noqa: A002
        text = input[-1].text if isinstance(input, list) else str(input)
        nth = asked.get(text, 0)
        asked[text] = nth + 1
        if (text, nth) in error_keys:
            raise RuntimeError("model server went away")
        out = ModelOutput.from_content(model=model.split("/", 1)[1], content=by_key[(text, nth)])
        out.usage = ModelUsage(input_tokens=5, output_tokens=2, total_tokens=7)
        return out

    task = Task(dataset=dataset, solver=generate(), name=task_name, epochs=epochs)
    [log] = eval(
        task,
        model=model,
        model_args={"custom_outputs": respond},
        log_dir=str(log_dir),
        score=False,
        display="none",
        fail_on_error=False,
        limit=limit,
        metadata=metadata,
        max_connections=1,
        max_samples=1,
    )
    return Path(log.location)


def score_run(
    wh: Warehouse,
    run_id: str,
    grade: Callable[[SampleView], Grade],
    *,
    scorer: str = "exact",
    fingerprint: str = "fp-v1",
    retry: str | None = None,
) -> int:
    """Grade every sample of a run and write the rows through Warehouse.write_scores; `retry`
    also grades retryable unscored samples again (`Warehouse.samples_to_score`)."""
    todo = wh.samples_to_score(scorer, fingerprint, run_ids=[run_id], retry=retry).to_pylist()
    now = datetime.now(UTC)
    rows = []
    for s in todo:
        if s["error"]:
            g = Grade("error", None, None, f"sample errored: {s['error'][:60]}", "sample_error")
        else:
            g = grade(SampleView(completion=s["completion"] or "", target=s["target"]))
        rows.append(
            {
                "run_id": s["run_id"],
                "sample_id": s["sample_id"],
                "epoch": s["epoch"],
                "scorer": scorer,
                "fingerprint": fingerprint,
                "status": g.status,
                "value": g.value,
                "answer": g.answer,
                "explanation": g.explanation,
                "reason": g.reason,
                "metadata": "{}",
                "scored_at": now,
                "duration_s": 0.001,
                "attempt": s["attempt"],
            }
        )
    return wh.write_scores(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA))


def ingest(wh: Warehouse, log: Path) -> str:
    [res] = wh.ingest_logs([log])
    assert res.error is None, res.error
    assert res.run_id is not None
    return res.run_id
