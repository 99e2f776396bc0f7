"""TRL reward functions over gradebook verifiers (`scorers.rewards.trl_reward`).

TRL's GRPOTrainer calls each reward function as
`f(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_extra=...,
log_metric=..., **every other dataset column as a list)` and takes a `list[float | None]`
back, None meaning "no reward for this one". It awaits the function (gathered with the other
async ones) when `inspect.iscoroutinefunction(f)`; AsyncGRPOTrainer pickles the reward functions
into a spawned process and calls sync ones in a thread there. Both classes below are plain data
plus a verifier name, so they pickle, and grade with the workers of whichever process they are
called in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scorers.grade import Grade
from scorers.rewards._core import (
    Item,
    RewardSpec,
    completion_text,
    grade_all,
    no_completion,
    reward_value,
    target_of,
)

__all__ = ["AsyncTRLReward", "TRLReward", "trl_reward"]

# What TRL passes besides the dataset's own columns.
_TRAINER_ARGS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
     "environments"}
)  # fmt: skip
_CODE_TEST_COLUMNS = ("test", "test_list")


class TRLReward:
    """A TRL reward function grading with one gradebook verifier (sync; see `AsyncTRLReward`).

    Attributes:
        __name__: "gradebook_<verifier>", the name TRL logs its rewards under.
        column: the dataset column holding the reference answer.
        spec: the verifier and the parameters it grades with.
    """

    def __init__(self, verifier: str, column: str, params: Mapping[str, Any]) -> None:
        self.spec = RewardSpec.make(verifier, params, who=f"trl_reward({verifier!r})")
        self.column = column
        self.__name__ = f"gradebook_{verifier}"

    @property
    def verifier(self) -> str:
        return self.spec.verifier

    @property
    def fingerprint(self) -> str:
        """The verifier fingerprint this reward grades with (log it with the run; the warehouse's
        `verifiers.fingerprint` for the same verifier and parameters is the same digest)."""
        return self.spec.fingerprint

    def __repr__(self) -> str:
        params = "".join(f", {k}={v!r}" for k, v in self.spec.params.items())
        return f"trl_reward({self.verifier!r}, column={self.column!r}{params})"

    def __call__(
        self,
        completions: Sequence[Any] | None = None,
        prompts: Sequence[Any] | None = None,
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        """Rewards for a batch, in order: 1.0/0.0 (or partial credit), None when unscored."""
        grades = self.grades(completions, prompts, kwargs)
        self._log(grades, kwargs)
        return [reward_value(g) for g in grades]

    def grades(
        self, completions: Sequence[Any] | None, prompts: Sequence[Any] | None,
        kwargs: Mapping[str, Any],
    ) -> list[Grade]:  # fmt: skip
        """The verifier's full verdicts (reason, explanation, answer) for a TRL call."""
        completions = list(completions or [])
        n = len(completions)
        if n == 0:
            return []
        columns = {
            k: v
            for k, v in kwargs.items()
            if k not in _TRAINER_ARGS and isinstance(v, list | tuple)
        }
        for name, values in columns.items():
            if len(values) != n:
                raise ValueError(
                    f"{self.__name__}: column {name!r} has {len(values)} values for {n} completions"
                )
        self._check_columns(columns)
        texts = [completion_text(c) for c in completions]
        items = [
            self._item(i, texts[i], prompts, columns) for i in range(n) if texts[i] is not None
        ]
        graded = iter(grade_all(self.spec, items))
        return [
            next(graded) if text is not None else no_completion("the completion holds no text")
            for text in texts
        ]

    def _check_columns(self, columns: Mapping[str, Any]) -> None:
        if self.verifier == "unit_tests":
            if not any(c in columns for c in _CODE_TEST_COLUMNS):
                raise ValueError(
                    f"{self.__name__}: the dataset has no `test` or `test_list` column "
                    f"(columns: {', '.join(sorted(columns)) or 'none'})"
                )
        elif self.column not in columns:
            raise ValueError(
                f"{self.__name__}: no dataset column {self.column!r} with the reference answer "
                f"(columns: {', '.join(sorted(columns)) or 'none'}); pass column=..."
            )

    def _item(
        self, i: int, text: str, prompts: Sequence[Any] | None, columns: Mapping[str, Any]
    ) -> Item:
        row = {name: values[i] for name, values in columns.items()}
        # HumanEval-style rows: a plain-text prompt holds the signature and imports that a
        # completion may rely on (the scorer reads them from the sample's `prompt` metadata).
        if self.verifier == "unit_tests" and "prompt" not in row and prompts is not None:
            prompt = prompts[i] if i < len(prompts) else None
            if isinstance(prompt, str):
                row["prompt"] = prompt
        target = target_of(row.get(self.column)) if self.column in row else ""
        return Item(text, target, row)

    def _log(self, grades: list[Grade], kwargs: Mapping[str, Any]) -> None:
        log_extra: Callable[[str, list], None] | None = kwargs.get("log_extra")
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        if callable(log_extra):
            log_extra(f"{self.__name__}_reason", [g.reason for g in grades])
        if callable(log_metric) and grades:
            unscored = sum(g.status != "scored" for g in grades)
            log_metric(f"{self.__name__}/unscored_frac", unscored / len(grades))


async def _signature(
    completions: Sequence[Any] | None = None,
    prompts: Sequence[Any] | None = None,
    completion_ids: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    raise NotImplementedError  # never called: only its code object is lent to AsyncTRLReward


class AsyncTRLReward(TRLReward):
    """The same reward as a coroutine function: TRL gathers it with its other async rewards,
    and the grading runs in a thread so the event loop is never blocked."""

    async def __call__(  # type: ignore[override]
        self,
        completions: Sequence[Any] | None = None,
        prompts: Sequence[Any] | None = None,
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        grades = await asyncio.to_thread(self.grades, completions, prompts, kwargs)
        self._log(grades, kwargs)
        return [reward_value(g) for g in grades]

    # Trainers await a reward only when `inspect.iscoroutinefunction(f)` is true, and for a
    # callable object (not a function) that holds only if it looks like one: a code object
    # with the coroutine flag and the function attributes, the duck type inspect accepts for
    # compiled functions. Class attributes, so pickling the object is unaffected.
    __code__ = _signature.__code__
    __defaults__ = _signature.__defaults__
    __kwdefaults__ = None


def trl_reward(
    verifier: str = "math", column: str = "answer", *, asynchronous: bool = False, **params: Any
) -> TRLReward:
    """A TRL reward function that grades with a gradebook verifier.

    Args:
        verifier: a registered verifier: "math" (the reference in `column`) or "unit_tests"
            (HumanEval/MBPP tests from the `test` + `entry_point` or `test_list` (+
            `test_imports`) columns, run in the Docker sandbox).
        column: the dataset column holding the reference answer (math).
        asynchronous: return a coroutine function (TRL gathers async rewards concurrently).
        **params: verifier parameters, e.g. `answer_patterns=[...]`, `timeout_s=2.0` (math); a
            dataset column of the same name overrides them per sample.

    Returns:
        A picklable callable named "gradebook_<verifier>", with `.fingerprint`.

    Raises:
        ValueError: unknown verifier or parameter, or a parameter value the verifier rejects.
    """
    cls = AsyncTRLReward if asynchronous else TRLReward
    return cls(verifier, column, params)
