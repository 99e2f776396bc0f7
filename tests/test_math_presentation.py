"""Presentation around the final answer: bold, a final-answer heading, display-math delimiters.

Stripped both when extracting from a completion and when an answer string is given directly.
Near misses: a bold number inside other prose is never taken as the answer.
"""

from __future__ import annotations

import pytest

from scorers.grade import SampleView
from scorers.math import DEFAULT_PATTERNS, extract_answer, grade_math, is_correct, verify

VERIFICATION = (
    "We need 3 boxes of 5 and 2 more: 3 * 5 + 2 = 17.\n"
    "Verification: 17 - 2 = 15, and 15 / 5 = 3, so 3 boxes of 5 plus 2 is 17; 4 boxes would "
    "give 22, which is too many, and 2 boxes give 12.\n\n"
)
# The strategy lists benchmarks/verifier_accuracy.py uses for Math-Verify's "latex" and "expr"
# match types; the default list is what math_verifier() and math_reward() use.
LATEX = ["answer_line", "final_answer", "boxed", "final_line", "last_math", "whole"]
EXPR = ["answer_line", "final_answer", "boxed", "final_line", "last_value", "whole", "last_number"]

# completion -> the answer extracted from it (by the defaults and by both benchmark lists)
EXTRACTED = [
    ("**Final Answer:** **17**", "17"),
    (VERIFICATION + "**Final Answer:** **17**", "17"),
    ("The answer is __17__", "17"),
    (VERIFICATION + "So the answer is __17__.", "17"),
    (VERIFICATION + "**17**", "17"),
    (VERIFICATION + "***17***", "17"),
    (VERIFICATION + "**Final Answer**\n\n**17**", "17"),
    ("**Final Answer:** 17", "17"),
    ("So the answer is **17 apples**.", "17"),
    ("The answer is 17. I hope it is correct.", "17"),
    ("The answer is $3! \\times 5! = 720$.", "3! \\times 5! = 720"),
    ("Thus the answer is \\(\\frac{1}{2}\\).", "\\frac{1}{2}"),
    ("The answer is **odd**.", "odd"),
    ("Final Answer\n\\[\n\\boxed{x \\ge 3}\n\\]", "x \\ge 3"),
    ("## Final Answer\n\\[\nx \\ge 3\n\\]", "x \\ge 3"),
    ("**Final Answer**\n$$\\frac{1}{2}$$", "\\frac{1}{2}"),
    ("The final answer is $$17$$", "17"),
    ("ANSWER: **17**", "17"),  # answer_line: the bold around the value is not part of it
]

# completion -> nothing extracted by the defaults: no answer is stated on the last line
NOT_EXTRACTED = [
    "We found **3** cases, so the total is 12.",  # a bold number inside prose
    VERIFICATION + "There are **3** boxes of **5**.",
    "There are **3** red balls and **4** blue ones.",
    "**Step 3:** **17**",  # bold after a label that is not a final-answer heading
    "The **answer** depends on 12.",
    "**17** or **18**",  # a hedge is not one answer
    "The answer is not 17.",
    "The answer is about **17**.",
    "The answer is **3** cases more than 12.",
    "We may check our answer: 17 * 44 = 748, so our answer is correct.",
    "**Answer verified.**",
    "Let us compute the answer\n$$ 3 + 4 = 7 $$",  # a display block after prose, not a heading
    "the answer is 17 because 3 + 14 = 17",
    "The answer is 17. Or maybe 18.",  # a hedge after the statement
    "The answer is 17. Wait, no: it is 18.",
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTED, ids=[t[-40:] for t, _ in EXTRACTED])
@pytest.mark.parametrize(
    "patterns", [DEFAULT_PATTERNS, LATEX, EXPR], ids=["default", "latex", "expr"]
)
def test_the_stated_answer_is_extracted_without_its_presentation(
    text: str, expected: str, patterns: list[str]
) -> None:
    assert extract_answer(text, patterns) == expected


@pytest.mark.parametrize("text", NOT_EXTRACTED, ids=[t[-40:] for t in NOT_EXTRACTED])
def test_a_number_that_is_not_stated_as_the_answer_is_not_extracted(text: str) -> None:
    assert extract_answer(text) is None


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("We found **3** cases, so the total is 12.", "3"),
        ("We found **3** cases, so the total is 12.", "12"),
        ("The answer is **17** or **18**", "17"),
        ("The answer is **17** or **18**", "18"),
        ("The answer is about **17**.", "17"),
        (VERIFICATION + "There are **3** boxes of **5**.", "3"),
    ],
)
def test_near_misses_grade_zero(text: str, reference: str) -> None:
    grade = grade_math(SampleView(completion=text, target=reference))
    assert grade.correct is False, grade


@pytest.mark.parametrize(("text", "reference"), EXTRACTED)
def test_presented_answers_grade_correct_end_to_end(text: str, reference: str) -> None:
    if reference == "3! \\times 5! = 720":
        reference = "720"
    grade = grade_math(SampleView(completion=text, target=reference))
    assert grade.correct is True, grade


# An answer string given directly to is_correct / verify, with its presentation.
DIRECT_EQUAL = [
    ("Final Answer\n\\[\n\\boxed{x \\ge 3}\n\\]", "x \\ge 3"),
    ("Final Answer\n\\[\n\\boxed{x \\ge 3}\n\\]", "[3, \\infty)"),
    ("**Final Answer:** **17**", "17"),
    ("The answer is __17__", "17"),
    ("**17**", "17"),
    ("__17__.", "17"),
    ("**$\\frac{1}{2}$**", "0.5"),
    ("\\[ x \\ge 3 \\]", "x \\ge 3"),
    ("$$\n\\frac{1}{2}\n$$", "1/2"),
    ("\\(\\frac12\\)", "1/2"),
    ("## Final Answer\n$$\\boxed{17}$$", "17"),
    ("The final answer is $17$", "17"),
    ("Answer: 17", "17"),
    ("\\boxed{**17**}", "17"),
]

DIRECT_UNEQUAL = [
    ("**Final Answer:** **17**", "18"),
    ("Final Answer\n\\[\n\\boxed{x \\ge 3}\n\\]", "x > 3"),
    ("**17** or **18**", "17"),  # a hedge stays unparseable or a two-element answer
    ("The answer is not 17", "17"),
    ("We found **3** cases, so the total is 12.", "3"),
    # Math-Verify's labels: inline math does not span lines, and a bare "Answer" is no heading
    ("Answer $ \n 9 \n $", "9"),
    ("Answer \\( \n 9 \n \\)", "9"),
    ("z^*", "z"),  # a star after ^ is not emphasis
]


@pytest.mark.parametrize(("answer", "reference"), DIRECT_EQUAL)
def test_an_answer_given_directly_is_read_without_its_presentation(
    answer: str, reference: str
) -> None:
    assert is_correct(answer, reference), verify(answer, reference)
    assert is_correct(reference, answer)  # the reference side is read the same way


@pytest.mark.parametrize(("answer", "reference"), DIRECT_UNEQUAL)
def test_presentation_near_misses_stay_unequal(answer: str, reference: str) -> None:
    verdict = verify(answer, reference)
    assert not verdict.equal, verdict
    assert verdict.reason in {"mismatch", "unparseable_answer"}, verdict


def test_other_strategies_read_emphasis_too() -> None:
    assert extract_answer("so the total is __17__", ["last_number"]) == "17"
    assert extract_answer("x_1 + x_2 = 5 and x_3", ["last_number"]) == "5"  # not subscripts
    assert extract_answer("## Final Answer\n\\[\nx \\ge 3\n\\]", ["final_answer"]) == "x \\ge 3"


PATHOLOGICAL = [
    "**" * 500_000 + "17",
    "17" + "**" * 500_000,
    "answer is " * 200_000,
    "The answer is " + "_" * 1_000_000 + "17",
    "\\[" * 300_000 + "\\]",
    "$$" * 500_000,
    "Final Answer\n" * 100_000 + "**" * 100_000,
    ("**" + "x" * 50 + "\n") * 50_000 + "**" + "1" * 100_000 + "**",
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=lambda s: repr(s[:16]))
def test_presentation_scans_are_linear_on_megabyte_inputs(text: str) -> None:
    # Shapes that make a backtracking scan quadratic (hours on these sizes); must finish
    # (pytest-timeout guards). The parser refuses more than 20,000 chars before stripping.
    for patterns in (DEFAULT_PATTERNS, LATEX, EXPR):
        extract_answer(text, patterns)
    assert verify(text, "17").reason == "limit_exceeded"
    assert verify(text[:20_000], "17").reason in {"verified_equal", "mismatch",
                                                  "unparseable_answer"}  # fmt: skip
