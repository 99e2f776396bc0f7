"""Grading with an Inspect scorer in a scoring worker: rebuild, score, convert; per sample.

`InspectGrade` is what a `Verifier` for an Inspect scorer calls: a small picklable object that
names the scorer spec, so a grading worker (flows.grading_pool) resolves the scorer itself, once
per process (an installed scorer by registry name, a file the parent was given through the
recording loader). A chunk is graded in one event loop with up to CONCURRENCY samples in flight
(an async scorer that waits, e.g. on a judge, does not hold the others up).

Per-sample isolation, as for gradebook's own verifiers:
- a scorer that raises leaves the sample `unscored`, reason `verifier_error`, with a short
  traceback in the row's metadata; one that runs past the limit, `timeout` (an await is
  cancelled; a scorer busy in Python code is interrupted by a SIGALRM watchdog that raises in
  that sample's own frames);
- `Score.unscored` or a NaN value is `unscored` with the scorer's own reason; a value nobody can
  read as a number is `unscored`, `unconvertible_value` (warehouse.score_values);
- a sample stored before the warehouse kept what a TaskState needs is `unscored`,
  `state_not_stored`; one whose choice marks the scorer read but the log does not keep,
  `choice_marks_unknown`.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scorers.grade import Grade, SampleView
from scorers.inspect_scorers.judges import (
    GRADER_FAILED,
    VERDICT_UNPARSEABLE,
    JudgeCalls,
    bound_roles,
    build_judges,
    recording,
)

__all__ = ["CONCURRENCY", "InspectGrade"]

CONCURRENCY = 32  # samples of one chunk in flight at once in a worker's event loop

# (status, value, answer, explanation, reason, metadata JSON, seconds): flows.grading_pool's
ResultRow = tuple[str, float | None, str | None, str, str, str, float]

_SCORERS: dict[str, Any] = {}  # spec JSON -> the created Inspect scorer (this process)


class _SampleTimeout(Exception):
    pass


def _short_traceback(exc: BaseException, limit: int = 1500) -> str:
    text = "".join(traceback.format_exception(exc, limit=-4)).strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _unscored(reason: str, explanation: str, t0: float, **meta: Any) -> ResultRow:
    return ("unscored", None, None, explanation[:300], reason, json.dumps(meta),
            time.perf_counter() - t0)  # fmt: skip


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

    def __call__(self, view: SampleView) -> Grade:
        row = (view.completion, view.targets, json.dumps(view.metadata), view.sample_id,
               view.state)  # fmt: skip
        status, value, answer, explanation, reason, meta, _ = self.grade_rows([row], 0.0)[0]
        return Grade(status, value, answer, explanation, reason, json.loads(meta))  # type: ignore[arg-type]

    def grade_rows(self, rows: Sequence[Sequence[Any]], timeout_s: float) -> list[ResultRow]:
        """One result per row (flows.grading_pool's SampleRow), in order; never raises."""
        try:
            scorer = self.scorer()
        except Exception as exc:  # noqa: BLE001 - the whole chunk is unscored, with why
            t0 = time.perf_counter()
            why = f"scorer could not be created here: {type(exc).__name__}: {exc}"
            return [_unscored("verifier_error", why, t0, traceback=_short_traceback(exc))] * len(
                rows
            )
        return _run(_grade_all(scorer, rows, timeout_s, self.roles(), self.processes))


def _run(coro: Any) -> Any:
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


async def _grade_all(
    scorer: Any,
    rows: Sequence[Sequence[Any]],
    timeout_s: float,
    roles: dict[str, Any],
    processes: int,
) -> list[Any]:
    try:
        models = build_judges(roles, processes)
    except Exception as exc:  # noqa: BLE001 - a judge that cannot be created: every sample says so
        t0 = time.perf_counter()
        why = f"the judge could not be created: {type(exc).__name__}: {str(exc)[:200]}"
        return [_unscored(GRADER_FAILED, why, t0)] * len(rows)
    # enough samples in flight to keep every judge connection busy
    share = max((m.config.max_connections or 0 for m in models.values()), default=0)
    limit = asyncio.Semaphore(max(CONCURRENCY, share))
    watchdog = _Watchdog(timeout_s)
    async with bound_roles(models):
        with watchdog:
            return list(
                await asyncio.gather(
                    *(
                        _one(scorer, i, row, timeout_s, limit, watchdog)
                        for i, row in enumerate(rows)
                    )  # fmt: skip
                )
            )


async def _one(
    scorer: Any,
    index: int,
    row: Sequence[Any],
    timeout_s: float,
    limit: asyncio.Semaphore,
    watchdog: _Watchdog,
) -> ResultRow:
    from inspect_ai.util._store import init_subtask_store

    from scorers.inspect_scorers.task_state import StateNotStored, rebuild_state

    values = _conversion()

    completion, targets, metadata, sample_id, *rest = row
    async with limit:
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
        watchdog.start(index)
        with recording() as calls:
            try:
                # asyncio.timeout, not wait_for: the scorer runs in this task, so its frames are
                # under this one's on the stack, where the watchdog looks
                async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
                    score = await scorer(state, target)
            except (_SampleTimeout, TimeoutError):
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
            finally:
                watchdog.stop(index)
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


class _Watchdog:
    """Per-sample time limits for scorers that never await: a periodic SIGALRM (main thread
    only) raises `_SampleTimeout` when the sample running on the stack is past its limit; the
    exception unwinds that sample's own frames and no other's."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.started: dict[int, float] = {}
        self.active = (
            timeout_s > 0
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
        )
        self._old: Any = None

    def __enter__(self) -> _Watchdog:
        if self.active:
            tick = max(0.05, min(1.0, self.timeout_s / 4))
            self._old = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, tick, tick)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old or signal.SIG_DFL)

    def start(self, index: int) -> None:
        self.started[index] = time.monotonic()

    def stop(self, index: int) -> None:
        self.started.pop(index, None)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        while frame is not None:
            if frame.f_code is _one.__code__:
                index = frame.f_locals.get("index")
                began = self.started.get(index) if index is not None else None
                if began is not None and now - began > self.timeout_s:
                    self.started.pop(index, None)
                    raise _SampleTimeout
                return
            frame = frame.f_back
