"""Inspect tasks graded by the math verifier: a small bundled set and user-supplied GSM8K files.

The bundled problems and `scripted_completions()` (correct and wrong completions to drive
`mockllm`) live in `tasks.math_problems`. This file is loaded by Inspect's own CLI too
(`inspect eval tasks/math.py@math_verified`), under a module name missing from `sys.modules`:
keep dataclasses out of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.solver import generate, prompt_template

from scorers.math import math_verifier
from tasks.math_problems import DATA, ScriptedSample, bundled_samples, scripted_completions

__all__ = [
    "DATA",
    "ScriptedSample",
    "bundled_samples",
    "gsm8k_verified",
    "math_verified",
    "scripted_completions",
]

PROMPT = """Solve the problem. Reason step by step, then write the final answer on its own last
line as `ANSWER: <answer>` (LaTeX allowed).

{prompt}"""

# GSM8K references end with "#### <n>"; model solutions in the GSM8K repo end with "A: <n>".
GSM8K_PATTERNS = ("answer_line", "boxed", "gsm8k", r"^\s*A:\s*(\S.*)$")


@task
def math_verified(timeout_s: float = 2.0) -> Task:
    """The bundled math problems, graded by `math_verifier()`.

    Args:
        timeout_s: hard limit per verification.
    """
    return Task(
        dataset=bundled_samples(),
        solver=[prompt_template(PROMPT), generate()],
        scorer=math_verifier(timeout_s=timeout_s),
    )


def _gsm8k_reference(answer: str) -> str:
    tail = answer.rsplit("####", 1)
    return tail[-1].strip() if len(tail) == 2 else answer.strip()


@task
def gsm8k_verified(path: str, limit: int | None = None, timeout_s: float = 2.0) -> Task:
    """GSM8K-format problems from a JSONL file the user supplies, graded by `math_verifier()`.

    Args:
        path: JSONL with `question` and `answer` (the answer ends with `#### <number>`).
        limit: read at most this many problems.
        timeout_s: hard limit per verification.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"GSM8K file {path!r} not found: pass a JSONL with question/answer")
    samples = []
    for n, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            samples.append(
                Sample(id=n, input=row["question"], target=_gsm8k_reference(row["answer"]))
            )
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(
                f"{path}:{n}: not a GSM8K row ({exc}); each line needs question and answer"
            ) from exc
        if limit is not None and len(samples) >= limit:
            break
    return Task(
        dataset=samples,
        solver=[prompt_template(PROMPT), generate()],
        scorer=math_verifier(answer_patterns=GSM8K_PATTERNS, timeout_s=timeout_s),
    )
