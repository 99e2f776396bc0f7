"""The one result type every gradebook verifier returns.

A verifier is a pure function of what a saved log holds (completion, target, sample metadata)
returning a `Grade`. The Inspect @scorer wrappers, the Prefect scoring stage and the RL reward
all call the same function and convert its `Grade`, so a measurement, a stored score and a
reward can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # grading workers import this module; only to_score() needs Inspect
    from inspect_ai.scorer import Score

GradeStatus = Literal["scored", "unscored", "error", "deferred"]


@dataclass(frozen=True, slots=True)
class SampleView:
    """What a verifier may read: only what the log (or the warehouse) keeps.

    `may_defer`: the caller has other samples to grade meanwhile, so the verifier may answer
    `deferred()` instead of waiting for a helper that is still starting (the scoring stage sets
    it on its first pass and asks again, without it, after the rest).

    `deadline`: a `time.monotonic()` instant by which the grade must be returned. Waiting for a
    helper that other callers hold counts against it (an RL reward called from many threads at
    once must still answer in time). None: the verifier's own limit, after waiting its turn.

    `state`: the stored sample as one JSON document (input, choices, messages, output, store,
    the run's model and solver plan), for a verifier that rebuilds Inspect's TaskState from it
    (`Verifier.reads_state`); None for the others.
    """

    completion: str
    target: str | list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    sample_id: str | int | None = None
    may_defer: bool = False
    deadline: float | None = None
    state: str | None = None

    @property
    def targets(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)


@dataclass(frozen=True, slots=True)
class Grade:
    """A verifier's verdict on one sample.

    Attributes:
        status: "scored" when the verifier decided; "unscored" when it could not (timeout,
            sandbox unavailable, invalid target); "error" when the verifier itself raised.
            Principle 6: a grader failure is never a wrong answer and never a right one.
            "deferred" (only when the SampleView allowed it): ask again later; never stored.
        value: 1.0 or 0.0 (or a partial credit) when scored, None otherwise.
        answer: the extracted answer (what was compared), if any.
        explanation: one human line, e.g. "mismatch: got 41, want 42".
        reason: a machine code, e.g. "verified_equal", "mismatch", "no_answer", "timeout",
            "invalid_target", "sandbox_unavailable", "verifier_error".
        metadata: small JSON-serialisable details.
    """

    status: GradeStatus
    value: float | None
    answer: str | None
    explanation: str
    reason: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.status == "scored" and self.value == 1.0

    def to_score(self) -> Score:
        """Convert to an Inspect `Score` (unscored/error become NaN-valued unscored scores)."""
        from inspect_ai.scorer import Score

        meta = {"reason": self.reason, "status": self.status, **self.metadata}
        if self.status == "scored" and self.value is not None and not math.isnan(self.value):
            return Score(
                value=self.value,
                answer=self.answer,
                explanation=self.explanation,
                metadata=meta,
            )
        return Score.unscored(
            reason=self.reason,
            answer=self.answer,
            explanation=self.explanation,
            metadata=meta,
        )


def scored(
    value: float, *, answer: str | None, explanation: str, reason: str, **meta: Any
) -> Grade:
    return Grade("scored", float(value), answer, explanation, reason, dict(meta))


def unscored(reason: str, explanation: str, *, answer: str | None = None, **meta: Any) -> Grade:
    return Grade("unscored", None, answer, explanation, reason, dict(meta))


def deferred(why: str) -> Grade:
    """Not graded yet: grading now would wait on a helper that is still starting. Only for a
    SampleView with `may_defer`; the caller asks again later."""
    return Grade("deferred", None, None, why, "deferred")
