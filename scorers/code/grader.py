"""Unit-test verification of model-written code, in the Docker sandbox only.

Extraction (`extract_code`) and verification (`run_unit_tests`) are separate: a score's
explanation tells "no code found" from "tests failed" from "tests passed". The verdict is the
trusted harness's own (see `scorers/sandbox/_harness.py`): nothing the submission prints, patches or
returns can make it read as passed. Without Docker the sample is unscored with reason
"sandbox_unavailable"; code is never run on the host.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from scorers.grade import Grade, SampleView, scored, unscored
from scorers.registry import Verifier, register
from scorers.sandbox.image import ImageBuildError, image_tag
from scorers.sandbox.pool import SandboxUnavailable, default_pool

TestStatus = Literal["passed", "failed", "timeout", "error", "no_code", "sandbox_unavailable"]
DETAIL_CAP = 2000
DEFAULT_TIMEOUT_S = 10.0

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3", ""}


@dataclass(frozen=True)
class TestVerdict:
    """The outcome of running one submission against its tests."""

    passed: bool
    status: TestStatus
    detail: str
    duration_s: float

    __test__ = False  # not a pytest test class


def extract_code(text: str) -> str | None:
    """The code to test from a model's answer.

    Policy: the LAST fenced block tagged python/py/python3 or untagged wins (models often show
    a draft first and the final version last); an unterminated final fence runs to the end of
    the text. Blocks tagged with another language are ignored. An answer without any fence is
    taken whole only when it parses as Python source containing a `def` or `class`
    (checked with `ast.parse`, which never executes it); otherwise there is no code.
    """
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    blocks = [b for b in blocks if b.strip()]
    if blocks:
        return blocks[-1].rstrip() + "\n"
    if "```" in text:
        return None
    import ast

    stripped = text.strip()
    if not stripped:
        return None
    try:
        tree = ast.parse(stripped)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body):
        return stripped + "\n"
    return None


def run_unit_tests(
    code: str,
    tests: str,
    *,
    entry_point: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TestVerdict:
    """Run `tests` against `code` in the sandbox.

    Args:
        code: the submission (untrusted). Empty or None-like input gives status "no_code".
        tests: Python source that raises on failure (HumanEval's `check` followed by a call
            `check(entry_point)`, or MBPP-style `assert` lines). It runs in the trusted harness
            process and calls the submission's top-level functions by name.
        entry_point: the function the submission must define.
        timeout_s: hard wall-clock limit; an expired run is "timeout" (not passed).

    Returns:
        A TestVerdict; `passed` is True only when the harness ran every test statement to the
        end without an exception and called the submission at least once.
    """
    if not code or not code.strip():
        return TestVerdict(False, "no_code", "no code to run", 0.0)
    try:
        pool = default_pool()
    except (SandboxUnavailable, ImageBuildError) as exc:
        return TestVerdict(False, "sandbox_unavailable", str(exc)[:DETAIL_CAP], 0.0)
    started = time.monotonic()
    try:
        outcome = pool.run_tests(code, tests, entry_point=entry_point, timeout_s=timeout_s)
    except SandboxUnavailable as exc:
        return TestVerdict(
            False, "sandbox_unavailable", str(exc)[:DETAIL_CAP], time.monotonic() - started
        )
    return TestVerdict(
        outcome.passed, outcome.status, outcome.detail[:DETAIL_CAP], outcome.duration_s
    )


def unit_tests_for(metadata: dict[str, Any]) -> tuple[str, str | None] | None:
    """The test source and entry point a sample's metadata carries (HumanEval or MBPP shape)."""
    entry_point = metadata.get("entry_point")
    test = metadata.get("test")
    if isinstance(test, str) and test.strip():
        if entry_point and "def check(" in test and f"check({entry_point})" not in test:
            test = f"{test}\n\ncheck({entry_point})\n"
        return test, entry_point
    test_list = metadata.get("test_list")
    if isinstance(test_list, list) and test_list:
        setup = metadata.get("test_imports") or []
        return "\n".join([*map(str, setup), *map(str, test_list)]) + "\n", entry_point
    return None


def grade_unit_tests(sample: SampleView) -> Grade:
    """Verifier "unit_tests": extract the code, run the sample's tests in the sandbox."""
    spec = unit_tests_for(sample.metadata)
    if spec is None:
        return unscored("invalid_target", "sample metadata has no `test` or `test_list`")
    tests, entry_point = spec
    code = extract_code(sample.completion)
    if code is None:
        return scored(
            0.0, answer=None, explanation="no parseable code in the answer", reason="no_answer"
        )
    # HumanEval prompts hold imports and helpers the completion relies on; a completion that
    # does not restate the signature is a body to append to the prompt.
    prompt = sample.metadata.get("prompt")
    if isinstance(prompt, str) and entry_point and f"def {entry_point}" not in code:
        code = prompt + code
    verdict = run_unit_tests(code, tests, entry_point=entry_point, timeout_s=DEFAULT_TIMEOUT_S)
    meta = {"test_status": verdict.status, "duration_s": round(verdict.duration_s, 4)}
    if verdict.status == "sandbox_unavailable":
        return unscored("sandbox_unavailable", verdict.detail, answer=code, **meta)
    if verdict.status == "error":
        return unscored("verifier_error", verdict.detail, answer=code, **meta)
    if verdict.passed:
        return scored(1.0, answer=code, explanation=verdict.detail, reason="tests_passed", **meta)
    reason = "timeout" if verdict.status == "timeout" else "tests_failed"
    return scored(0.0, answer=code, explanation=verdict.detail, reason=reason, **meta)


def _image_param() -> str:
    try:
        return image_tag()
    except ImageBuildError:
        return "unknown"


register(
    Verifier(
        name="unit_tests",
        grade=grade_unit_tests,
        module="scorers.code",
        params={"timeout_s": DEFAULT_TIMEOUT_S, "image": _image_param()},
        label="unit tests in the Docker sandbox (harness/submission split by uid)",
    )
)
