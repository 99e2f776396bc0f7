"""Rebuild the `TaskState` an Inspect scorer grades, from what the warehouse keeps of a sample.

As Inspect's own re-scoring does (`inspect_ai._eval.score.task_state_from_sample`): input,
target, choices, messages, output, metadata and store, the run's model name and the sample's
epoch and uuid. No model is bound: a scorer that calls `get_model()` without a model of its
own does not reach the generator (a grader role is the place to give it one).

The marks of the `multiple_choice` solver. `choice()` grades by which choices the solver
marked while generating (`Choice.correct`), and a log keeps only the choice texts, so Inspect's
own re-score of a multiple-choice log grades nearly every sample `I` with an empty answer.
Here, when the run's solver plan has a `multiple_choice` step, the marks are set again from
the saved output exactly as that solver sets them (Inspect's own `parse_answers` and
`set_choices_based_on_generated_response`, with the step's `multiple_correct`). When a sample
has choices but the plan has no such step, nobody can say which choices were marked: the
choices are then `_UnknownMark`s, and a scorer that reads a mark leaves the sample unscored
(reason `choice_marks_unknown`) instead of grading it wrong.
"""

from __future__ import annotations

import json
from typing import Any

from inspect_ai.model import ChatMessage, ModelName, ModelOutput
from inspect_ai.scorer import Target
from inspect_ai.solver import TaskState
from inspect_ai.solver._multiple_choice import (
    parse_answers,
    set_choices_based_on_generated_response,
)
from inspect_ai.solver._task_state import Choice
from pydantic import TypeAdapter

__all__ = ["MarksUnknown", "StateNotStored", "rebuild_state"]

_MESSAGES = TypeAdapter(list[ChatMessage])
_MC_SOLVER = "multiple_choice"


class StateNotStored(Exception):
    """The sample was stored before the warehouse kept what a TaskState needs."""


class MarksUnknown(Exception):
    """The scorer read a choice mark that the log does not keep."""


class _UnknownMark(Choice):
    """A choice whose mark the log does not keep: reading it is recorded, not answered."""

    def __init__(self, value: str, original_position: int, reads: list[int]) -> None:
        self._reads = reads
        self._mark: bool | None = None
        self._set = False
        super().__init__(value=value, correct=None, original_position=original_position)

    @property  # type: ignore[override]
    def correct(self) -> bool | None:
        if not self._set:
            self._reads.append(self.original_position)
        return self._mark

    @correct.setter
    def correct(self, value: bool | None) -> None:
        # the dataclass __init__ sets None; a scorer or solver that marks it makes it known
        if value is not None:
            self._set = True
        self._mark = value


def _input(text: str | None) -> str | list[ChatMessage]:
    """The stored input: a string, or the JSON text of a chat message list."""
    if text and text.startswith("[{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text
        if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
            return _MESSAGES.validate_python(value)
    return text or ""


def _multiple_choice_step(plan: Any) -> dict[str, Any] | None:
    steps = (plan or {}).get("steps") or [] if isinstance(plan, dict) else []
    found = None
    for step in steps:
        solver = str(step.get("solver") or "")
        if solver.rsplit("/", 1)[-1] == _MC_SOLVER:
            found = step
    return found


def rebuild_state(
    state_json: str | None,
    completion: str | None,
    targets: list[str] | None,
    metadata: dict[str, Any],
    sample_id: str | None,
) -> tuple[TaskState, Target, list[int]]:
    """The TaskState and Target of one stored sample, and the list that collects the choice
    marks a scorer reads without the log keeping them (empty: none read, or none unknown).

    Raises:
        StateNotStored: the sample predates migration 10 (its messages were not kept).
    """
    d = json.loads(state_json) if state_json else {}
    raw_messages = d.get("messages")
    if raw_messages is None and (d.get("n_messages") or 0) > 0 or not d:
        raise StateNotStored
    messages = _MESSAGES.validate_python(raw_messages or [])
    output = (
        ModelOutput.model_validate(d["output"])
        if d.get("output")
        else ModelOutput.from_content(model=str(d.get("model") or ""), content=completion or "")
    )
    target = Target(list(targets or []))
    choices = d.get("choices")
    model = str(d.get("model") or "none/none")
    sid: int | str = sample_id if sample_id is not None else ""
    if d.get("id_is_int") and isinstance(sid, str) and sid.lstrip("-").isdigit():
        sid = int(sid)  # the id as Inspect gave it to the scorer at eval time
    state = TaskState(
        model=ModelName(model if "/" in model else f"{model}/{model}"),
        sample_id=sid,
        epoch=int(d.get("epoch") or 1),
        input=_input(d.get("input")),
        target=target,
        choices=list(choices) if choices is not None else None,
        messages=messages,
        output=output,
        completed=True,
        metadata=metadata,
        store=d.get("store") or {},
        sample_uuid=d.get("uuid"),
    )
    reads: list[int] = []
    if choices:
        step = _multiple_choice_step(d.get("plan"))
        if step is not None:
            multiple = bool((step.get("params") or {}).get("multiple_correct"))
            answers = parse_answers(state, multiple)
            if answers:
                set_choices_based_on_generated_response(state=state, answers=answers)
        else:
            state.choices._choices = [  # noqa: SLF001 - Choices has no setter for its items
                _UnknownMark(c, i, reads) for i, c in enumerate(choices)
            ]
    return state, target, reads
