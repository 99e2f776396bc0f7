"""The math verifier: extract a final answer, decide whether it equals the reference.

Public API (import from here): `extract_answer`, `verify`, `is_correct`, `grade_math`,
`warm_up`, `Verdict`, `DEFAULT_PATTERNS`, `DEFAULT_TIMEOUT_S`, and `math_verifier`, the Inspect
scorer. The parser and the grader are separate modules, tested separately:

- `_parse`: a non-evaluating parser for answer strings (never sympify or eval model output);
- `_extract`: where the final answer is in a completion (ANSWER:, \\boxed{}, ####, last line);
- `_compare`: exact comparison of rational answers, in-process;
- `_symbolic`: sympy equivalence, run only in the bounded worker processes;
- `grader`: `verify` / `grade_math`, and the registered "math" verifier;
- `scorer`: `math_verifier`, `grade_math` behind Inspect's @scorer (imports Inspect, so it is
  loaded only when asked for: the scoring stage's workers and RL rewards import the grader).
"""

from typing import Any

from scorers.math.grader import (
    DEFAULT_PATTERNS,
    DEFAULT_TIMEOUT_S,
    Verdict,
    extract_answer,
    grade_math,
    is_correct,
    verify,
    warm_up,
)

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_TIMEOUT_S",
    "Verdict",
    "extract_answer",
    "grade_math",
    "is_correct",
    "math_verifier",
    "verify",
    "warm_up",
]


def __getattr__(name: str) -> Any:
    # Inspect costs seconds of imports, which the grader's callers must not pay.
    if name == "math_verifier":
        from scorers.math.scorer import math_verifier

        return math_verifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
