"""The code verifier: run a model's code against unit tests, in the Docker sandbox only.

Public API (import from here): `extract_code`, `run_unit_tests`, `grade_unit_tests`,
`unit_tests_for`, `TestVerdict`, `DEFAULT_TIMEOUT_S`, and `unit_test_scorer`, the Inspect
scorer. Modules:

- `grader`: extraction, the sandboxed test run, and the registered "unit_tests" verifier;
- `scorer`: `unit_test_scorer`, `grade_unit_tests` behind Inspect's @scorer (imports Inspect, so
  it is loaded only when asked for).

The container machinery it runs in is `scorers.sandbox`.
"""

from typing import Any

from scorers.code.grader import (
    DEFAULT_TIMEOUT_S,
    TestVerdict,
    extract_code,
    grade_unit_tests,
    run_unit_tests,
    unit_tests_for,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TestVerdict",
    "extract_code",
    "grade_unit_tests",
    "run_unit_tests",
    "unit_test_scorer",
    "unit_tests_for",
]


def __getattr__(name: str) -> Any:
    # Inspect costs a second of imports, which the scoring stage's workers must not pay.
    if name == "unit_test_scorer":
        from scorers.code.scorer import unit_test_scorer

        return unit_test_scorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
