"""One table per equivalence or extraction rule, each with near misses that must stay unequal.

A false positive is worse than a false negative here: the verifier is also an RL reward.
"""

from __future__ import annotations

import pytest

from scorers.grade import SampleView
from scorers.math import extract_answer, grade_math, verify
from scorers.rewards import math_reward

DECIDED = {"mismatch", "unparseable_answer", "limit_exceeded"}

# rule -> (equal pairs, unequal pairs)
RULES: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {
    "latex {,} separator, padded or not": (
        [("14 {, }916", "14{,}916"), ("14{ ,}916", "14916"), ("1{,}000{,}000", "10^6")],
        [("14 {, }916", "14917"), ("1 {, }5", "15"), ("1{,}5", "1.5")],
    ),
    "semicolons separate solutions, commas their components": (
        [
            ("(5,2),(7,2)", "p=5,q=2;p=7,q=2"),
            ("(7,2),(5,2)", "p=5,q=2;p=7,q=2"),
            ("p=5, q=2; p=7, q=2", "(5, 2), (7, 2)"),
            ("1; 2; 3", "1, 2, 3"),  # single items: still one flat list
        ],
        [
            ("(2,5),(2,7)", "p=5,q=2;p=7,q=2"),  # components are ordered
            ("(5,2),(7,3)", "p=5,q=2;p=7,q=2"),
            ("(5,2)", "p=5,q=2;p=7,q=2"),
            ("5,2,7,2", "p=5,q=2;p=7,q=2"),
            ("(5,2),(7,2),(9,2)", "p=5,q=2;p=7,q=2"),
        ],
    ),
    "constant = constant: the result after the computation": (
        [
            ("\\frac{1}{2} \\$ = \\frac{10}{9}", "10/9"),
            ("2+3=5", "5"),
            ("\\sqrt{16} = 4", "4"),
            ("2 \\cdot 3 = 6 = 6", "6"),
        ],
        [
            ("\\frac{1}{2} = \\frac{10}{9}", "1/2"),
            ("2+3=6", "5"),
            ("0 = x^2-1", "x^2-1"),  # an equation in x stays an equation
            ("\\pi r^2 = 4\\pi", "4\\pi"),
        ],
    ),
    "|x| ranges are unions of intervals": (
        [
            ("z \\in [-\\frac32, -1] \\cup [1, \\frac32]", "1\\leq|z|\\leq \\frac{3}{2}"),
            ("[-3/2,-1] \\cup [1,3/2]", "1 \\le |z| \\le 3/2"),
            ("|x| < 3", "(-3, 3)"),
            ("|x| \\le 3", "[-3, 3]"),
            ("|x| > 3", "(-\\infty, -3) \\cup (3, \\infty)"),
            ("|x| \\ge 3", "(-\\infty, -3] \\cup [3, \\infty)"),
            ("0 < |x| < 2", "(-2, 0) \\cup (0, 2)"),
            ("0 \\le |x| < 2", "(-2, 2)"),
        ],
        [
            ("[1, 3/2]", "1 \\le |z| \\le 3/2"),
            ("[-3/2, 3/2]", "1 \\le |z| \\le 3/2"),
            ("[-3/2,-1] \\cup [1,3/2)", "1 \\le |z| \\le 3/2"),
            ("|x| < 3", "[-3, 3]"),
            ("|x| > 3", "(3, \\infty)"),
            ("|x| < 3", "x < 3"),
            ("|x| \\in [1, 2]", "[1, 2]"),
            ("|x| < a", "(-a, a)"),  # sign of a unknown: not converted
            ("2 < |x| < 1", "(1, 2)"),
        ],
    ),
    "a condition is a set only for a plain name": (
        [
            ("x \\in [1, 4]", "1 \\le x \\le 4"),
            ("-2 \\le x \\le 7", "x \\in [-2, 7]"),
            ("(0, 1)", "0 < f(x) < 1"),
            ("x > 5", "(5, \\infty)"),
        ],
        [
            ("-x < 3", "x < 3"),
            ("x + y < 3", "x < 3"),
            ("\\sin x < \\frac12", "x < \\frac12"),
            ("x^y < 3", "(-\\infty, 3)"),
            ("x/y > 1", "(1, \\infty)"),
            ("x^2 \\in [1, 4]", "x \\in [1, 4]"),
        ],
    ),
    "a two-sided chain on a plain name is its interval, whatever the bounds": (
        [
            ("-\\pi < t \\le \\sqrt{5}", "t \\in (-\\pi, \\sqrt{5}]"),
            ("-\\pi < t \\le \\sqrt{5}", "(-\\pi, \\sqrt{5}]"),
            ("\\sqrt{5} \\ge t > -\\pi", "(-\\pi, \\sqrt{5}]"),
            ("-\\pi < t \\le \\sqrt{5}", "(-\\pi, 5^{1/2}]"),  # bounds equal, not identical
            ("0 \\le \\theta < 2\\pi", "[0, 2\\pi)"),
            ("\\frac{\\pi}{6} \\le x \\le \\frac{5\\pi}{6}", "x \\in [\\pi/6, 5\\pi/6]"),
            ("e < x \\le \\pi", "(e, \\pi]"),
            ("a < x < b", "(a, b)"),
            ("-\\sqrt{2} < t \\le 3", "(-\\sqrt{2}, 3]"),  # already matched before
        ],
        [
            ("-\\pi < t < \\sqrt{5}", "t \\in (-\\pi, \\sqrt{5}]"),  # closedness differs
            ("-\\pi \\le t \\le \\sqrt{5}", "(-\\pi, \\sqrt{5}]"),
            ("-\\pi < t \\le \\sqrt{6}", "(-\\pi, \\sqrt{5}]"),
            ("\\pi < t \\le \\sqrt{5}", "(-\\pi, \\sqrt{5}]"),
            ("-\\pi < t \\le \\sqrt{5}", "[-\\pi, \\sqrt{5})"),
            ("-t < t < 3", "(-t, 3)"),  # a bound that involves the name: not a set of t
            ("x < y < z", "(y, z)"),
        ],
    ),
    "a value written with % is that number or that number / 100, nothing else": (
        [
            ("25\\%", "25"),
            ("25\\%", "0.25"),
            ("25\\%", "\\frac{1}{4}"),
            ("12.5\\%", "0.125"),
            ("-5\\%", "-0.05"),
            ("\\frac{1}{2}\\%", "0.005"),
            ("28 percent", "28\\%"),
            ("28 pct", "0.28"),
            ("25\\% \\text{ of the class}", "0.25"),
            ("\\text{25\\%}", "1/4"),
            ("(10\\%, 20\\%)", "(0.1, 0.2)"),
            ("x = 25\\%", "x = 0.25"),
            ("x = 25\\%", "x = 25"),
            ("x = 25\\%", "0.25"),
            ("2500\\%", "25"),  # 2500 / 100
        ],
        [
            ("2500\\%", "0.25"),
            ("0.25", "25"),  # no % written: no scaling
            ("25", "2500"),
            ("25\\%", "0.25\\%"),  # both written with %: the numbers must agree
            ("25\\%", "2.5"),
            ("25\\%", "0.0025"),
            ("0.25\\%", "25"),
            ("x = 25\\%", "x = 2.5"),
            ("(10\\%, 20\\%)", "(0.2, 0.1)"),
            ("25\\%", "x = 2.5"),
        ],
    ),
    "equations up to a constant factor, inequalities up to a positive one": (
        [
            ("2y = 2x + 4", "y = x + 2"),
            ("-y = -x - 2", "y = x + 2"),  # a negative factor is fine for =
            ("x - y = 3", "y - x = -3"),
            ("2x < 10", "x < 5"),
            ("-x > -5", "x < 5"),  # both sides negated and the sign flipped
            ("10 > 2x", "x < 5"),
            ("2x \\ge 10", "5 \\le x"),
            # rational functions: decided exactly by cancelling the ratio to lowest terms
            ("\\frac{2}{x} + \\frac{2}{y} = 2", "\\frac{1}{x} + \\frac{1}{y} = 1"),
            ("1 = \\frac{1}{x} + \\frac{1}{y}", "\\frac{x+y}{xy} = 1"),
            ("\\frac{2x}{x+1} = 1", "\\frac{x}{x+1} = \\frac{1}{2}"),
            ("\\frac{1}{x} < 1", "\\frac{3}{x} < 3"),
            # irrational factors: left to simplify
            ("\\sqrt{2} x - 2\\sqrt{2} = 0", "x - 2 = 0"),
            ("-\\sqrt{2} x > -2\\sqrt{2}", "x < 2"),
            ("\\pi x = 2\\pi", "x = 2"),
            # need sqrt(2)^2 = 2, which cancel would miss: the radical keeps them off its path
            ("\\sqrt{2} x + 2 = 0", "x + \\sqrt{2} = 0"),
            ("\\sqrt{2} x < 2", "x < \\sqrt{2}"),
            ("2x + 2\\sqrt{2} = 0", "\\sqrt{2} x + 2 = 0"),
        ],
        [
            ("y = x + 2", "y = 2x + 1"),
            ("2x < 10", "x > 5"),  # a negative factor is not fine for <
            ("-x < -5", "x < 5"),
            ("\\frac{1}{x} + \\frac{1}{y} = 1", "x + y = 1"),
            ("\\frac{1}{x} < 1", "1 < x"),
            ("\\frac{x}{x+1} = 2", "\\frac{x}{x+1} = 3"),
            ("x^2 = 2x", "x = 2"),  # the ratio is x, not a constant
            ("\\sqrt{2} x + 2 = 0", "x + \\sqrt{3} = 0"),
            ("\\pi x = 2", "x = 2"),
            ("-\\sqrt{2} x < -2", "x < \\sqrt{2}"),  # factor -sqrt(2): not fine for <
        ],
    ),
    "sums and products are compared as written": (
        [
            ("F_n = \\sum_{k=0}^{n-1} F_{n-k-1} F_k", "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}"),
            ("\\sum_{k=1}^{n} (k+1)^2", "\\sum_{k=1}^{n} (k^2+2k+1)"),
            ("\\sum_{k=1}^{n} k + 1", "1 + \\sum_{k=1}^{n} k"),
            ("\\prod_{i=1}^{n} i^2", "\\prod_{i=1}^{n} i \\cdot i"),
        ],
        [
            ("\\sum_{k=0}^{n} F_k", "\\sum_{k=0}^{n-1} F_k"),
            ("\\sum_{k=1}^{n} F_k", "\\sum_{j=1}^{n} F_k"),  # j's sum of a constant F_k
            ("\\sum_{i=1}^{n} i^2", "\\sum_{i=1}^{n} (-1)"),  # the index i is not sqrt(-1)
            ("\\prod_{k=1}^{n} k", "\\sum_{k=1}^{n} k"),
            ("\\sum_{k=1}^{n} k + 1", "\\sum_{k=1}^{n} (k + 1)"),  # body ends at +
            ("\\sum_{k=1}^{n} 2k", "\\sum_{k=1}^{n} 3k"),
        ],
    ),
}

CASES = [
    pytest.param(c, r, True, id=f"{rule}: {c} = {r}")
    for rule, (equal, _) in RULES.items()
    for c, r in equal
] + [
    pytest.param(c, r, False, id=f"{rule}: {c} != {r}")
    for rule, (_, unequal) in RULES.items()
    for c, r in unequal
]


@pytest.mark.parametrize(("candidate", "reference", "expected"), CASES)
def test_rule(candidate: str, reference: str, expected: bool) -> None:
    verdict = verify(candidate, reference)
    assert verdict.equal is expected, verdict
    if not expected:
        assert verdict.reason in DECIDED, verdict
    # Symmetric: the rules do not depend on which side is the reference.
    assert verify(reference, candidate).equal is expected


def test_sums_are_never_evaluated() -> None:
    # Evaluating would be unsound with opaque subscripts, so these true identities are misses.
    assert not verify("\\sum_{k=1}^{3} k", "6").equal
    assert not verify("\\sum_{k=1}^{n} k", "\\frac{n(n+1)}{2}").equal


def test_a_sum_without_a_range_is_not_parsed() -> None:
    assert verify("\\sum k", "1").reason == "unparseable_answer"
    assert verify("1", "\\sum_{k} k").reason == "invalid_target"


EXTRACTION = [
    # boxes separated only by symbols form one answer; words or a relation separate them
    ("\\boxed{35 cm} ++++++ \\boxed{4}", "35 cm, 4"),
    ("$\\\\boxed{35 cm} ++++++ \\\\boxed{4}$", "35 cm, 4"),
    ("\\boxed{2+2} = \\boxed{4}", "4"),
    ("\\boxed{3} then \\boxed{7}", "7"),
    ("\\boxed{3} \\to \\boxed{7}", "7"),
    ("\\boxed{4} or maybe \\boxed{5}", "4, 5"),  # a hedge stays visible
]

FINAL_ANSWER = [
    ("Final Answer: The final answer is $12$ and $13$. I hope it is correct.", "12, 13"),
    ("Final Answer: The final answer is $12$ or $13$. I hope it is correct.", "12, 13"),
    ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "3"),
    ("Final Answer: the tank holds 1,200 liters in all.", "1,200"),
    ("Final Answer: 3 hours", "3 hours"),
    # qualified, negated or ambiguous numbers are not the answer: the prose is kept (unparseable)
    ("Final Answer: at least 3 hours", "at least 3 hours"),
    ("Final Answer: it takes about 3 hours", "it takes about 3 hours"),
    ("Final Answer: it isn't 4 hours", "it isn't 4 hours"),
    (
        "Final Answer: Jane took 3 hours and Rod took 8 hours",
        "Jane took 3 hours and Rod took 8 hours",
    ),
    ("Final Answer: 3 of the two boxes", "3 of the two boxes"),
]

LAST_VALUE = [
    ("We get $d = \\frac{90}{n}$. Therefore, there are 12 distinct sequences.", "12"),
    ("$$\\frac{a}{b} \\geq 2.$$ The error increases by 100%.", "100"),
    ("So $x = 5$. Done.", "x = 5"),
    ("It is $3$ and $4$.", "3, 4"),
    ("So $x=5$. Hence about 12 ways.", None),  # hedged number: refused
    ("So $x=5$. So 12 is not divisible by 7.", None),
    ("plain text 12", None),  # no math span: left to `whole` / `last_number`
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTION)
def test_box_joining(text: str, expected: str) -> None:
    assert extract_answer(text, ["boxed"]) == expected


@pytest.mark.parametrize(("text", "expected"), FINAL_ANSWER)
def test_final_answer(text: str, expected: str) -> None:
    assert extract_answer(text, ["final_answer"]) == expected


def test_prose_final_answers_grade_as_a_user_expects() -> None:
    def graded(text: str, ref: str) -> bool:
        return verify(extract_answer(text, ["final_answer"]), ref).equal

    assert graded("Final Answer: Jane started growing Sphere 3 hours ago.", "3")
    assert not graded("Final Answer: Jane started growing Sphere 3 hours ago.", "8")
    assert not graded("Final Answer: at least 3 hours", "3")
    assert not graded("Final Answer: it is not 3.", "3")
    assert not graded("Final Answer: The final answer is $12$ or $13$.", "13")


@pytest.mark.parametrize(("text", "expected"), LAST_VALUE)
def test_last_value(text: str, expected: str | None) -> None:
    assert extract_answer(text, ["last_value"]) == expected


def test_reward_agrees_with_the_scorer_on_every_rule() -> None:
    for rule, (equal, unequal) in RULES.items():
        for candidate, reference in equal + unequal:
            completion = f"Work.\nANSWER: {candidate}"
            scored = grade_math(SampleView(completion=completion, target=reference)).correct
            assert math_reward(completion, reference) == float(scored), rule
            assert scored is ((candidate, reference) in equal), (rule, candidate, reference)
