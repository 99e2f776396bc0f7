"""Hostile model output: injections never execute, pathological inputs stay within the bound."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scorers.math import verify, warm_up

TIMEOUT_S = 2.0


@pytest.fixture(scope="module", autouse=True)
def warm_worker() -> None:
    warm_up()  # start-up of the worker is not what these tests bound


def test_injection_strings_are_false_and_leave_no_trace(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    attacks = [
        f"__import__('os').system('touch {marker}')",
        f'__import__("os").system("touch {marker}")',
        "().__class__.__base__.__subclasses__()",
        "x.__class__.__mro__[1].__subclasses__()",
        f"open('{marker}', 'w').write('x')",
        f"eval(\"open('{marker}','w')\")",
        f"exec(\"import os; os.system('touch {marker}')\")",
        "lambda: 1",
        "import os",
        f"\\text{{__import__('os').system('touch {marker}')}}",
    ]
    for attack in attacks:
        for candidate, reference in ((attack, "1"), (attack, "x + 1"), ("1", "1")):
            verdict = verify(candidate, reference)
            if candidate == attack:
                assert not verdict.equal, attack
    assert not marker.exists()


def test_attack_as_symbolic_reference_is_compared_by_name_only() -> None:
    # The reference parses to symbols named after the words; nothing is looked up or called.
    verdict = verify("1", "os.system(1)")
    assert not verdict.equal


PATHOLOGICAL = [
    "9^9^9^9",
    "10^{10^{10}}",
    "(" * 5000 + "1" + ")" * 5000,
    "1" * 200_000,
    "x" * 4_000_000,
    "(x+1)^{100000}",
    "x^{x^{x^{x^{x}}}}",
    "\\frac{1}{" * 3000 + "1" + "}" * 3000,
    "99999999!",
    "2^{2^{2^{2^{2^{2}}}}}",
    "\\sqrt{" * 60 + "x" + "}" * 60 + "+" + "(x+1)^{200}" * 40,
    # presentation wrappers (scorers.math._parse.strip_presentation) at the size limit
    "**" * 4_999 + "x" + "__" * 4_999,
    "Final Answer:\n" * 1_400,
    "\\[" * 4_999 + "x" + "\\]" * 4_999,
    "The answer is " * 1_400 + "x",
]


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("candidate", PATHOLOGICAL, ids=lambda s: s[:24])
def test_pathological_input_returns_within_limit_and_next_call_works(candidate: str) -> None:
    start = time.monotonic()
    verdict = verify(candidate, "x^2 + 2x + 1", timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert not verdict.equal
    assert elapsed < TIMEOUT_S + 0.5, (verdict, elapsed)
    assert verify("(x+1)^2", "x^2+2x+1").equal
    assert verify("0.5", "\\frac12").equal


@pytest.mark.slow
def test_timeout_is_a_false_verdict_with_reason() -> None:
    verdict = verify("x^{x^{x^{x^{x}}}}", "x^2 + 2x + 1", timeout_s=0.5)
    assert not verdict.equal
    assert verdict.reason in {"timeout", "mismatch", "limit_exceeded"}
