"""The bundled math problems and their scripted completions (for mockllm and the demo).

The problems (tasks/data/math_problems.jsonl) were written for this project: each has a
reference answer and a plausible wrong answer, covering integers, decimals, fractions,
percentages, radicals, expressions, equations, tuples, intervals, sets, ± and matrices.

Kept out of `tasks/math.py` on purpose: Inspect's own loader (`inspect eval tasks/math.py@...`)
runs a task file under a module name that is not in `sys.modules`, and `@dataclass` with
`from __future__ import annotations` looks its module up there. A task file therefore defines
no dataclasses; this module is imported normally.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inspect_ai.dataset import Sample

DATA = Path(__file__).parent / "data" / "math_problems.jsonl"


@dataclass(frozen=True)
class ScriptedSample:
    id: str
    correct: str
    wrong: str


def _problems() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def bundled_samples() -> list[Sample]:
    return [
        Sample(id=p["id"], input=p["question"], target=p["answer"], metadata={"kind": p["kind"]})
        for p in _problems()
    ]


def scripted_completions() -> list[ScriptedSample]:
    """For each bundled sample, a completion the verifier grades correct and one it grades wrong."""
    out = []
    for p in _problems():
        out.append(
            ScriptedSample(
                id=p["id"],
                correct=f"Working through the problem carefully.\nANSWER: {p['answer']}",
                wrong=f"A quick guess.\nANSWER: {p['wrong']}",
            )
        )
    return out
