"""Grading one sample with an Inspect scorer: rebuild its TaskState, score it, convert the Score.

This module decides an Inspect scorer's verdicts in gradebook, so it is part of every Inspect
scorer's fingerprint (`Verifier.code`), beside the scorer's own code: changing it is a new
verifier version, and every stored score of an Inspect scorer is graded again. How samples are
scheduled (the event loop a grading worker keeps, how many samples are in flight, the watchdog
that stops a scorer busy past its limit) belongs to the worker (scorers.workers.async_grading), outside
this module, so that changing it grades nothing again.

`InspectGrade` is what a `Verifier` for an Inspect scorer grades with: a small picklable object
that names the scorer spec. A grading process binds it once (`bind`: the scorer created from the
spec, an installed scorer by registry name or a file the parent was given through the recording
loader; its judges built and bound to their model roles), then grades each sample with
`grade_row`.

Per-sample isolation, as for gradebook's own verifiers:
- a scorer that raises leaves the sample `unscored`, reason `verifier_error`, with a short
  traceback in the row's metadata; one that runs past the limit, `timeout` (an await is
  cancelled; a scorer busy in Python code is interrupted by the worker's watchdog, which raises
  a TimeoutError in that sample's task);
- `Score.unscored` or a NaN value is `unscored` with the scorer's own reason; a value nobody can
  read as a number is `unscored`, `unconvertible_value` (warehouse.score_values);
- a sample stored before the warehouse kept what a TaskState needs is `unscored`,
  `state_not_stored`; one whose choice marks the scorer read but the log does not keep,
  `choice_marks_unknown`.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from scorers.grade import Grade, SampleView
from scorers.inspect_scorers.judges import (
    GRADER_FAILED,
    VERDICT_UNPARSEABLE,
    JudgeCalls,
    bind_roles,
    build_judges,
    recording,
)

__all__ = ["Bound", "CannotGrade", "InspectGrade", "grade_row", "run_here"]

# (status, value, answer, explanation, reason, metadata JSON, seconds): scorers.workers.pool's
ResultRow = tuple[str, float | None, str | None, str, str, str, float]

_SCORERS: dict[str, Any] = {}  # spec JSON -> the created Inspect scorer (this process)


def _short_traceback(exc: BaseException, limit: int = 1500) -> str:
    text = "".join(traceback.format_exception(exc, limit=-4)).strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _unscored(reason: str, explanation: str, t0: float, **meta: Any) -> ResultRow:
    return ("unscored", None, None, explanation[:300], reason, json.dumps(meta),
            time.perf_counter() - t0)  # fmt: skip


class CannotGrade(Exception):
    """The scorer cannot grade in this process at all; `row` is what each sample gets."""

    def __init__(self, row: ResultRow) -> None:
        super().__init__(row[3])
        self.row = row


@dataclass(frozen=True)
class Bound:
    """An Inspect scorer ready to grade in this process: created, its judges built and bound.

    `context`: where a sample is graded, the judges bound there as Inspect's model roles. Run
    each sample in a copy of it (`asyncio.create_task(..., context=bound.context.copy())`): a
    sample sets context variables of its own (its store, its judge-call recording).
    """

    scorer: Any
    models: dict[str, Any]
    context: contextvars.Context

    def max_connections(self) -> int:
        """The most judge calls this process makes at once (0: the scorer has no judge)."""
        return max((m.config.max_connections or 0 for m in self.models.values()), default=0)

    async def aclose(self) -> None:
        """Close the judges' clients: they belong to the event loop that used them."""
        for model in self.models.values():
            await model.__aexit__(None, None, None)


@dataclass(frozen=True)
class InspectGrade:
    """Grade samples with the Inspect scorer a spec names (JSON of `ScorerSpec.to_json()`).

    `processes`: how many grading processes share the judge's connection limit (a judge
    scorer's `max_connections` is the stage's, not each process's).
    """

    spec: str
    processes: int = 1

    def for_processes(self, n: int) -> InspectGrade:
        """This grade, run by `n` processes at once."""
        return InspectGrade(self.spec, max(1, n))

    def roles(self) -> dict[str, Any]:
        """The model roles the scorer grades with (a judge's `grader`)."""
        return dict(json.loads(self.spec).get("roles") or {})

    def scorer(self) -> Any:
        """The Inspect scorer, created once per process."""
        found = _SCORERS.get(self.spec)
        if found is None:
            from scorers.inspect_scorers.factories import ScorerSpec, resolve_factory

            spec = ScorerSpec.from_json(json.loads(self.spec))
            factory, _, _ = resolve_factory(spec)
            found = _SCORERS[self.spec] = factory(**dict(spec.params))
        return found

    def bind(self) -> Bound:
        """The scorer and its judges, ready to grade here (call it within the event loop that
        will grade: the judges' clients belong to it).

        Raises:
            CannotGrade: the scorer cannot be created here (every sample `verifier_error`), or
                a judge cannot be built (every sample `grader_failed`).
        """
        t0 = time.perf_counter()
        try:
            scorer = self.scorer()
        except Exception as exc:  # noqa: BLE001 - every sample is unscored, with why
            why = f"scorer could not be created here: {type(exc).__name__}: {exc}"
            raise CannotGrade(
                _unscored("verifier_error", why, t0, traceback=_short_traceback(exc))
            ) from exc
        try:
            models = build_judges(self.roles(), self.processes)
        except Exception as exc:  # noqa: BLE001 - a judge that cannot be created: each sample says so
            why = f"the judge could not be created: {type(exc).__name__}: {str(exc)[:200]}"
            raise CannotGrade(_unscored(GRADER_FAILED, why, t0)) from exc
        context = contextvars.copy_context()
        context.run(bind_roles, models)
        return Bound(scorer, models, context)

    def __call__(self, view: SampleView) -> Grade:
        """One sample, in an event loop of its own (a caller outside the scoring stage). The
        limit of a scorer busy in Python code is the caller's to enforce here."""
        row = (view.completion, view.targets, json.dumps(view.metadata), view.sample_id,
               view.state)  # fmt: skip
        status, value, answer, explanation, reason, meta, _ = run_here(_grade_one(self, row))
        return Grade(status, value, answer, explanation, reason, json.loads(meta))  # type: ignore[arg-type]


async def _grade_one(grade: InspectGrade, row: Sequence[Any]) -> ResultRow:
    try:
        bound = grade.bind()
    except CannotGrade as exc:
        return exc.row
    try:
        task = asyncio.get_running_loop().create_task(
            grade_row(bound, row, 0.0), context=bound.context.copy()
        )
        return await task
    finally:
        await bound.aclose()


def run_here(coro: Any) -> Any:
    """Run a coroutine to its end from synchronous code: in an event loop of its own, on a
    thread of its own when the caller is inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # called from inside an event loop (an async caller): grade on a thread of our own
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(coro)))
    thread.start()
    thread.join()
    return result[0]


async def grade_row(
    bound: Bound,
    row: Sequence[Any],
    timeout_s: float,
    watch: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> ResultRow:
    """Grade one sample (scorers.workers.pool's SampleRow) in a task running in a copy of
    `bound.context`; never raises.

    `timeout_s`: the scorer's limit (0: none); an await past it is cancelled. `watch`: a
    context manager around the scorer's call within which the caller may raise a TimeoutError
    in this task (a scorer busy in Python code never reaches an await to be cancelled at).
    """
    from inspect_ai.util._store import init_subtask_store

    from scorers.inspect_scorers.task_state import StateNotStored, rebuild_state

    values = _conversion()

    completion, targets, metadata, sample_id, *rest = row
    t0 = time.perf_counter()
    try:
        meta = json.loads(metadata) if metadata else {}
        state, target, reads = rebuild_state(
            rest[0] if rest else None, completion, targets,
            meta if isinstance(meta, dict) else {}, sample_id,
        )  # fmt: skip
    except StateNotStored:
        return _unscored(
            "state_not_stored",
            "stored before the warehouse kept choices and messages (migration 10): "
            "ingest its log into a new warehouse to grade it with an Inspect scorer",
            t0,
        )
    except Exception as exc:  # noqa: BLE001 - a sample the rebuild cannot read
        return _unscored(
            "verifier_error", f"cannot rebuild the TaskState: {type(exc).__name__}: {exc}",
            t0, traceback=_short_traceback(exc),
        )  # fmt: skip
    init_subtask_store(state.store)
    with recording() as calls:
        try:
            with watch():
                async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
                    score = await bound.scorer(state, target)
        except TimeoutError:
            if calls.failed():
                return _judge_failed(calls, f"no reply within {timeout_s:g}s", t0)
            return _unscored("timeout", f"scorer did not finish within {timeout_s:g}s", t0)
        except Exception as exc:  # noqa: BLE001 - per-sample fault isolation
            if calls.failed():
                return _judge_failed(calls, calls.last_error() or str(exc)[:200], t0)
            return _unscored(
                "verifier_error",
                f"scorer raised {type(exc).__name__}: {str(exc)[:200]}",
                t0,
                traceback=_short_traceback(exc),
                **_judge_meta(calls),
            )
    if reads:
        return _unscored(
            "choice_marks_unknown",
            "the scorer reads which choices the model picked, and the log does not keep "
            "them (its solver plan has no multiple_choice step to rebuild them from)",
            t0,
        )
    if score is None:
        return _unscored("no_score", "the scorer returned no score", t0)
    row_fields = values.score_fields(score)[0]
    value = row_fields.value
    if value is not None and math.isnan(value):
        value = None
    reason = row_fields.reason
    if row_fields.status == "unscored" and reason == GRADER_FAILED and calls.answered():
        # the judge answered; its reply holds no verdict the scorer can read
        reason = VERDICT_UNPARSEABLE
    return (
        row_fields.status,
        value,
        row_fields.answer,
        row_fields.explanation,
        reason,
        values.metadata_json({**row_fields.metadata, **_judge_meta(calls)}),
        time.perf_counter() - t0,
    )


def _judge_meta(calls: JudgeCalls) -> dict[str, Any]:
    """The judge calls' evidence, under `judge` in the row's metadata (none: nothing)."""
    return {"judge": calls.evidence()} if calls.events else {}


def _judge_failed(calls: JudgeCalls, why: str, t0: float) -> ResultRow:
    return _unscored(
        GRADER_FAILED,
        f"judge call failed after {len(calls.events)} attempt(s): {why}",
        t0,
        **_judge_meta(calls),
    )


def _conversion() -> Any:
    """warehouse.score_values, imported by name: it is one of the verifier's fingerprinted code
    roots (`Verifier.code`) on its own, where an import statement would add the whole warehouse
    package (its __init__ imports every warehouse module) to every Inspect scorer's fingerprint.
    """
    import importlib

    return importlib.import_module("warehouse.score_values")
