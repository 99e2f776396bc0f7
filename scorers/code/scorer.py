"""The unit-test verifier as an Inspect scorer: `grade_unit_tests` behind Inspect's @scorer.

Kept apart from `scorers.code` so the verifier core imports without Inspect;
`from scorers.code import unit_test_scorer` still works (the module forwards the name).
"""

from __future__ import annotations

import anyio
from inspect_ai.scorer import Score, Scorer, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState

from scorers.code.grader import grade_unit_tests
from scorers.grade import SampleView

__all__ = ["unit_test_scorer"]


@scorer(metrics=[accuracy(), stderr()])
def unit_test_scorer() -> Scorer:
    """Inspect scorer: reads only the completion, the target and sample metadata, so a saved
    log can be re-scored later with no generation-time sandbox."""

    async def score(state: TaskState, target: Target) -> Score:
        view = SampleView(
            completion=state.output.completion,
            target=list(target.target),
            metadata=dict(state.metadata or {}),
            sample_id=state.sample_id,
        )
        grade = await anyio.to_thread.run_sync(grade_unit_tests, view)
        return grade.to_score()

    return score
