"""The math verifier: extract a final answer, decide whether it equals the reference.

Extraction (`extract_answer`) and verification (`verify` / `is_correct`) are separate pure
functions; `grade_math` joins them into the `Grade` that the Inspect scorer, the scoring stage
and the RL reward (`scorers.rewards.math_reward`) all use.

Verification parses both strings with a non-evaluating parser (scorers.math._parse). Answers
made of rational numbers are compared exactly as fractions in-process, without sympy. Anything
symbolic is compared with sympy in a killable worker process (scorers.workers.bounded) under a hard
deadline, so no input can hold a caller longer than `timeout_s`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Literal

from scorers.grade import Grade, SampleView, deferred, scored, unscored
from scorers.math._compare import ExactComparator, NeedSymbolic
from scorers.math._extract import DEFAULT_PATTERNS, extract_answer
from scorers.math._parse import LimitExceeded, ParseError, parse_answer
from scorers.registry import Verifier, register
from scorers.workers.bounded import WorkerFailed, WorkerTimeout, shared_pool

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_TIMEOUT_S",
    "Verdict",
    "extract_answer",
    "grade_math",
    "is_correct",
    "verify",
    "warm_up",
]

DEFAULT_TIMEOUT_S = 2.0
_SYMBOLIC_MODULES = ("scorers.math._symbolic",)
# Named, not imported: only the workers load sympy (seconds of import, charged to no caller).
_COMPARE_SYMBOLIC = "scorers.math._symbolic:compare_symbolic"

Reason = Literal[
    "verified_equal",
    "deferred",
    "mismatch",
    "no_answer",
    "unparseable_answer",
    "limit_exceeded",
    "invalid_target",
    "timeout",
    "verifier_error",
]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one comparison.

    Attributes:
        equal: True only when the candidate denotes the same object as the reference.
        reason: a machine code (see `Reason`).
        detail: one human line saying why.
        path: "exact" (in-process fractions), "symbolic" (worker) or "none".
    """

    equal: bool
    reason: Reason
    detail: str = ""
    path: str = "none"


def verify(
    candidate: str | None, reference: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Verdict:
    """Decide whether `candidate` and `reference` denote the same mathematical object.

    Pure and deterministic: no model calls, no I/O besides the bounded worker.

    Args:
        candidate: the extracted answer (None when extraction found nothing).
        reference: the task's target answer (trusted, but checked: unparseable is a defect).
        timeout_s: hard wall-clock limit for the whole call: parsing, the exact comparison and
            any wait for a symbolic worker count against it. (Only the one-time start of the
            worker pool in a fresh process does not; `warm_up()` does it ahead of time.)
    """
    return _verify(candidate, reference, timeout_s=timeout_s, may_defer=False)


def _verify(
    candidate: str | None,
    reference: str,
    *,
    timeout_s: float,
    may_defer: bool,
    take_turn: bool = False,
) -> Verdict:
    """`verify`; with `may_defer`, a comparison that needs the symbolic pool before it has
    booted returns reason "deferred" at once (and starts the boot) instead of waiting. With
    `take_turn`, a symbolic comparison first waits for one of this process's grading slots,
    and that wait is not charged to `timeout_s`."""
    started = time.monotonic()
    try:
        ref = parse_answer(reference)
    except ParseError as exc:
        return Verdict(False, "invalid_target", f"reference {reference!r} not parseable: {exc}")
    if candidate is None or not candidate.strip():
        return Verdict(False, "no_answer", "no parseable answer")
    try:
        cand = parse_answer(candidate)
    except LimitExceeded as exc:
        return Verdict(False, "limit_exceeded", f"answer exceeds a limit: {exc}")
    except ParseError as exc:
        return Verdict(False, "unparseable_answer", f"answer not parseable: {exc}")
    try:
        equal = ExactComparator().equal(cand, ref)
        return _verdict(equal, "exact")
    except LimitExceeded as exc:
        return Verdict(False, "limit_exceeded", f"answer exceeds a limit: {exc}", "exact")
    except NeedSymbolic:
        pass
    except RecursionError:
        return Verdict(False, "limit_exceeded", "answer too deeply nested", "exact")
    pool = shared_pool(_SYMBOLIC_MODULES)
    if may_defer and not pool.booted:
        pool.boot_in_background()
        return Verdict(False, "deferred", "symbolic worker still starting", "symbolic")
    turn = _grading_slots() if take_turn else None
    if turn is not None:
        waiting = time.monotonic()
        turn.acquire()
        started += time.monotonic() - waiting
    try:
        remaining = timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            raise WorkerTimeout("deadline spent before the symbolic comparison")
        equal = pool.call(_COMPARE_SYMBOLIC, cand, ref, timeout_s=remaining)
    except WorkerTimeout:
        return Verdict(
            False, "timeout", f"verification timed out after {timeout_s:g} s", "symbolic"
        )
    except WorkerFailed as exc:
        if "LimitExceeded" in str(exc) or "MemoryError" in str(exc):
            return Verdict(False, "limit_exceeded", str(exc), "symbolic")
        return Verdict(False, "verifier_error", str(exc), "symbolic")
    finally:
        if turn is not None:
            turn.release()
    return _verdict(equal, "symbolic")


def warm_up() -> None:
    """Start the symbolic worker now, so the first symbolic verification does not wait for it."""
    shared_pool(_SYMBOLIC_MODULES).warm()


def _verdict(equal: bool, path: str) -> Verdict:
    return (
        Verdict(True, "verified_equal", "verified equal", path)
        if equal
        else Verdict(False, "mismatch", "not equal", path)
    )


def is_correct(
    candidate: str | None, reference: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """True exactly when `verify` says the two answers are equal."""
    return verify(candidate, reference, timeout_s=timeout_s).equal


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _grading_slots() -> threading.BoundedSemaphore:
    # Per PID: a forked child must not inherit a semaphore held by its parent's threads.
    with _SLOTS_LOCK:
        slots = _SLOTS.get(os.getpid())
        if slots is None:
            slots = threading.BoundedSemaphore(shared_pool(_SYMBOLIC_MODULES).size)
            _SLOTS[os.getpid()] = slots
        return slots


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def grade_math(sample: SampleView) -> Grade:
    """THE math grading function (picklable): extraction + verification -> Grade.

    Sample metadata may override `answer_patterns` (list of extraction strategies) and
    `timeout_s`. Several targets: correct if any matches. A `sample.deadline` replaces
    `timeout_s` and bounds the whole call, waiting for a worker included (see SampleView).
    """
    patterns = sample.metadata.get("answer_patterns") or DEFAULT_PATTERNS
    timeout_s = float(sample.metadata.get("timeout_s") or DEFAULT_TIMEOUT_S)
    answer = extract_answer(sample.completion, patterns)
    targets = sample.targets
    if not targets or not any(t.strip() for t in targets):
        return unscored("invalid_target", "the sample has no target answer", answer=answer)
    if sample.deadline is not None:
        # The caller's deadline covers everything, the wait for a symbolic worker included (the
        # pool charges that wait to the call), so no turn is taken here: an exact comparison is
        # never held up behind other callers' symbolic ones.
        verdicts = [
            _verify(answer, t, timeout_s=sample.deadline - time.monotonic(), may_defer=False)
            for t in targets
        ]
    else:
        # At most as many symbolic comparisons at once as the pool has workers (Inspect scores
        # many samples concurrently): one waits for its turn, not charged to its deadline,
        # instead of timing out in the pool's queue. Exact comparisons take no turn.
        verdicts = [
            _verify(answer, t, timeout_s=timeout_s, may_defer=sample.may_defer, take_turn=True)
            for t in targets
        ]
    for v in verdicts:
        if v.equal:
            return scored(1.0, answer=answer, explanation="verified equal", reason=v.reason,
                          path=v.path)  # fmt: skip
    if any(v.reason == "deferred" for v in verdicts):
        return deferred("symbolic comparison deferred: its worker is still starting")
    if any(v.reason == "invalid_target" for v in verdicts):
        bad = next(v for v in verdicts if v.reason == "invalid_target")
        return unscored("invalid_target", bad.detail, answer=answer)
    first = verdicts[0]
    if first.reason == "no_answer":
        return scored(0.0, answer=None, explanation="no parseable answer", reason="no_answer")
    if first.reason == "unparseable_answer":
        return scored(0.0, answer=answer, explanation=f"no parseable answer: {first.detail}",
                      reason="unparseable_answer")  # fmt: skip
    if any(v.reason == "timeout" for v in verdicts):
        return unscored("timeout", "verification timed out", answer=answer)
    if first.reason == "verifier_error":
        return unscored("verifier_error", first.detail, answer=answer)
    return scored(
        0.0,
        answer=answer,
        explanation=f"mismatch: got {_short(answer or '')}, want {_short(targets[0])}",
        reason=first.reason,
        path=first.path,
    )


register(
    Verifier(
        name="math",
        grade=grade_math,
        module="scorers.math",
        params={"timeout_s": DEFAULT_TIMEOUT_S, "answer_patterns": list(DEFAULT_PATTERNS)},
        label="exact rational + sympy equivalence of the final answer (ANSWER:/boxed/####/last line)",
        helpers=(_SYMBOLIC_MODULES,),
    )
)
