"""The reward is the scorer's verdict, on every pair of the reference data (issue 15).

Every labelled pair in ../shared/data is graded once by the scorer's function (what the
scoring stage stores) and once through each trainer adapter (TRL batch, verl batch and
per-sample, OpenRLHF file form): the reward is the scorer's score where it scored, and "no
reward" (None, or the documented value with the flag) exactly where it did not.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from scorers.code import grade_unit_tests
from scorers.grade import Grade, SampleView
from scorers.math import grade_math
from scorers.rewards import compute_score, compute_score_batch, openrlhf_reward, trl_reward
from tasks.math import GSM8K_PATTERNS


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _value(grade: Grade) -> float | None:
    return grade.value if grade.status == "scored" else None


def _math_pairs(shared: Path, name: str) -> tuple[list[str], list[str], dict[str, Any]]:
    if name == "gsm8k":
        rows = _jsonl(shared / "gsm8k" / "gsm8k_model_solutions_labeled.jsonl")
        return (
            [r["candidate"] for r in rows],
            [r["reference"] for r in rows],
            {"answer_patterns": list(GSM8K_PATTERNS)},
        )
    if name == "math500":  # the reference solutions themselves, ending in \boxed{answer}
        rows = _jsonl(shared / "math" / "math500_test.jsonl")
        return [r["solution"] for r in rows], [r["answer"] for r in rows], {}
    rows = _jsonl(shared / "math" / f"{name}.jsonl")
    return [f"ANSWER: {r['candidate']}" for r in rows], [r["reference"] for r in rows], {}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["math_verify_tests", "other_grader_tests", "math500", "gsm8k"])
def test_math_rewards_equal_the_scorer_on_every_pair(shared_data: Path, name: str) -> None:
    texts, refs, params = _math_pairs(shared_data, name)
    # timeout generous: a loaded machine must not turn a slow symbolic pair into a difference
    params = {**params, "timeout_s": 20.0}
    scorer = [
        _value(grade_math(SampleView(completion=t, target=r, metadata=params)))
        for t, r in zip(texts, refs, strict=True)
    ]
    assert None not in scorer or name != "gsm8k"  # every GSM8K reference is a number
    trl = trl_reward("math", **params)(prompts=[""] * len(texts), completions=texts, answer=refs)
    chat = trl_reward("math", **params)(
        completions=[[{"role": "assistant", "content": t}] for t in texts], answer=refs
    )
    verl = compute_score_batch(["x"] * len(texts), texts, refs, None, **params)
    orl = openrlhf_reward("math", **params)([f"Q:{t}" for t in texts], ["Q:"] * len(texts), refs)
    assert trl == scorer
    assert chat == scorer
    assert [None if v["unscored"] else v["score"] for v in verl] == scorer
    flags = orl["extra_logs"]["unscored"]
    assert [None if f else r for r, f in zip(orl["rewards"], flags, strict=True)] == scorer
    # and one sample at a time, as verl's default managers call it
    for t, r, want in list(zip(texts, refs, scorer, strict=True))[:300]:
        one = compute_score("x", t, r, None, **params)
        assert (None if one["unscored"] else one["score"]) == want


def _humaneval(shared: Path) -> list[dict]:
    with gzip.open(shared / "code" / "HumanEval.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.docker
def test_code_rewards_equal_the_scorer_on_humaneval_and_mbpp(
    docker_sandbox, shared_data: Path
) -> None:
    humaneval = _humaneval(shared_data)
    # the canonical solution as a fenced body (the prompt holds the signature), and a wrong one
    he_texts = [f"```python\n{p['canonical_solution']}```" for p in humaneval]
    he_texts += [f"```python\n{p['prompt']}    return None\n```" for p in humaneval[:40]]
    he_rows = humaneval + humaneval[:40]
    he_meta = [{k: p[k] for k in ("prompt", "test", "entry_point")} for p in he_rows]
    mbpp = json.loads((shared_data / "code" / "sanitized-mbpp.json").read_text())
    mb_texts = [f"```python\n{p['code']}\n```" for p in mbpp]
    mb_meta = [{"test_list": p["test_list"], "test_imports": p["test_imports"]} for p in mbpp]

    texts, metas = he_texts + mb_texts, he_meta + mb_meta
    grades = [
        grade_unit_tests(SampleView(completion=t, target="", metadata=m))
        for t, m in zip(texts, metas, strict=True)
    ]
    scorer = [_value(g) for g in grades]
    assert scorer.count(1.0) > 500 and 0.0 in scorer
    # A few solutions run for seconds (MBPP 123 sums divisors up to 9,999): near the 10 s limit
    # their verdict depends on the machine's load, in the scorer as in the reward.
    timing = {i for i, g in enumerate(grades) if g.metadata.get("duration_s", 0) > 3}
    assert len(timing) < 5

    def agree(got: list) -> None:
        assert [g for i, g in enumerate(got) if i not in timing] == [
            s for i, s in enumerate(scorer) if i not in timing
        ]

    trl_he = trl_reward("unit_tests")(
        prompts=[m["prompt"] for m in he_meta], completions=he_texts,
        test=[m["test"] for m in he_meta], entry_point=[m["entry_point"] for m in he_meta],
    )  # fmt: skip
    trl_mb = trl_reward("unit_tests")(
        completions=mb_texts, test_list=[m["test_list"] for m in mb_meta],
        test_imports=[m["test_imports"] for m in mb_meta],
    )  # fmt: skip
    agree(trl_he + trl_mb)
    verl = compute_score_batch(
        ["code"] * len(texts), texts, [json.dumps(m) for m in metas], None, verifier="unit_tests"
    )
    agree([None if v["unscored"] else v["score"] for v in verl])
