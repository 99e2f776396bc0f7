"""Rewards for RL training, built on the very functions that grade evaluations.

`math_reward` calls `grade_math`, the function behind the `math` verifier and the Inspect
`math_verifier()` scorer, so a reward and a measured score can never disagree (principle 2).
"""

from __future__ import annotations

from scorers.grade import SampleView
from scorers.math import DEFAULT_PATTERNS, DEFAULT_TIMEOUT_S, grade_math


def math_reward(
    completion: str,
    reference: str,
    *,
    answer_patterns: tuple[str, ...] = DEFAULT_PATTERNS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """1.0 exactly when the math scorer grades `completion` CORRECT against `reference`, else 0.0.

    Unscored outcomes (timeout, invalid reference) give 0.0: no reward without a verified answer.

    Args:
        completion: the model's full completion (the answer is extracted from it).
        reference: the reference answer.
        answer_patterns: extraction strategies, as for `math_verifier()`.
        timeout_s: hard verification limit, as for `math_verifier()`.
    """
    view = SampleView(
        completion=completion,
        target=reference,
        metadata={"answer_patterns": list(answer_patterns), "timeout_s": timeout_s},
    )
    return 1.0 if grade_math(view).correct else 0.0
