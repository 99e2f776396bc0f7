"""The math verifier as an Inspect scorer: `grade_math` behind Inspect's @scorer interface.

Kept apart from `scorers.math` so the verifier core imports without Inspect;
`from scorers.math import math_verifier` still works (the module forwards the name).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from inspect_ai.scorer import Score, Scorer, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState

from scorers.grade import SampleView
from scorers.math.grader import DEFAULT_PATTERNS, DEFAULT_TIMEOUT_S, grade_math

__all__ = ["math_verifier"]


@scorer(metrics=[accuracy(), stderr()])
def math_verifier(
    *, answer_patterns: Sequence[str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Scorer:
    """Inspect scorer: extract the final answer and verify it against the target.

    Args:
        answer_patterns: extraction strategies or regexes (see scorers.math._extract); default
            ANSWER line, then \\boxed{}, then `####`.
        timeout_s: hard limit per verification; a timeout is unscored with reason "timeout".
    """
    patterns = list(answer_patterns or DEFAULT_PATTERNS)

    async def score(state: TaskState, target: Target) -> Score:
        view = SampleView(
            completion=state.output.completion,
            target=list(target.target),
            metadata={
                **(state.metadata or {}),
                "answer_patterns": patterns,
                "timeout_s": timeout_s,
            },  # fmt: skip
            sample_id=state.sample_id,
        )
        # Off the event loop: a symbolic check may wait up to timeout_s on its worker.
        grade = await anyio.to_thread.run_sync(grade_math, view)
        return grade.to_score()

    return score
