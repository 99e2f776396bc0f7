"""What every RL reward adapter shares: one reward spec, one way to grade, one fingerprint.

A reward is a registered verifier (`math`, `unit_tests`, ...) called through its own grade
function, the one the scorers and the scoring stage call, on a `SampleView` built from what the
trainer passes: the completion's text, the reference (target) and the per-sample columns as
metadata. So a reward and a measured score can never disagree (principle 2).

Time: every item gets a `deadline` (`SampleView.deadline`) of its `timeout_s`, counted from the
moment grading that item starts. A call with one item starts it at once, so its limit runs from
the call, in whatever thread, event loop or forked process it is made (the limit is enforced by
killing a worker process, never by a signal). A batch grades as many items at once as the
verifier has helper workers, each with its own limit; items of other callers competing for the
same workers count against the limit, so a reward answers in time under any load, and an item
that could not be graded in time is unscored ("timeout"), never wrong.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scorers.grade import Grade, SampleView
from scorers.registry import Verifier, get_verifier

__all__ = [
    "Item",
    "RewardSpec",
    "completion_text",
    "grade_all",
    "grade_now",
    "no_completion",
    "plain",
    "reward_value",
    "target_of",
    "tests_of",
]

DEFAULT_TIMEOUT_S = 2.0
# The metadata keys each built-in verifier's grade function reads as parameters; any other
# verifier takes the parameters it was registered with.
_PARAMS: dict[str, tuple[str, ...]] = {
    "math": ("answer_patterns", "timeout_s"),
    "unit_tests": (),
}


@dataclass(frozen=True, slots=True)
class Item:
    """One completion to grade: its text, the reference, the per-sample metadata."""

    completion: str
    target: str | list[str]
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardSpec:
    """Which verifier a reward grades with, and the parameters it passes to it.

    Plain data (a verifier name and JSON parameters), so a reward pickles into a spawned process
    and grades there with that process's own workers.
    """

    verifier: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def make(cls, verifier: str, params: Mapping[str, Any], *, who: str) -> RewardSpec:
        """A validated spec; `who` names the caller in the one-line error.

        Raises:
            ValueError: unknown verifier, unknown parameter, or a value the verifier rejects.
        """
        try:
            registered = get_verifier(verifier)
        except KeyError as exc:
            raise ValueError(f"{who}: {exc.args[0]}") from None
        accepted = _PARAMS.get(verifier, tuple(registered.params))
        clean: dict[str, Any] = {}
        for key, value in params.items():
            if key not in accepted:
                known = ", ".join(accepted) or "none"
                raise ValueError(
                    f"{who}: verifier {verifier!r} takes no parameter {key!r} (known: {known})"
                )
            clean[key] = _normalise(registered, key, value, who)
        return cls(verifier, clean)

    @property
    def grader(self) -> Verifier:
        return _verifier(self.verifier)

    @property
    def fingerprint(self) -> str:
        """The digest of the verifier this spec grades with (its code, parameters, versions):
        the `fingerprint` column of the warehouse's `verifiers` view for the same verifier."""
        return _fingerprint(self.verifier, json.dumps(dict(self.params), sort_keys=True))

    def metadata(self, per_sample: Mapping[str, Any] | None) -> dict[str, Any]:
        """The spec's parameters overridden by the sample's own values (a dataset column or an
        `extra_info` key of the same name is more specific than the run's setting)."""
        return {**self.params, **(per_sample or {})}

    def timeout_s(self, metadata: Mapping[str, Any]) -> float:
        default = self.grader.params.get("timeout_s", DEFAULT_TIMEOUT_S)
        try:
            return float(metadata.get("timeout_s") or default)
        except (TypeError, ValueError):
            return float(default)

    def concurrency(self) -> int:
        """Items of one batch graded at once: as many as the verifier has helper workers (more
        would only wait for a worker, charged to their limits), else one per core."""
        helpers = self.grader.helpers
        if helpers:
            from scorers.workers.bounded import shared_pool

            return shared_pool(helpers[0]).size
        return os.cpu_count() or 1


def _normalise(verifier: Verifier, key: str, value: Any, who: str) -> Any:
    """A parameter in the type of the registered default, so that equal settings give equal
    fingerprints (`timeout_s=2` and `2.0`, a tuple and a list of patterns)."""
    default = verifier.params.get(key)
    try:
        if isinstance(default, float):
            value = float(value)
            if not value > 0:
                raise ValueError("must be positive")
        elif isinstance(default, list):
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError("must be a list of strings")
            value = list(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{who}: parameter {key}={value!r} is invalid: {exc}") from None
    if key == "answer_patterns":
        from scorers.math import extract_answer

        try:
            extract_answer("", value)  # compiles every regex strategy once
        except Exception as exc:  # noqa: BLE001 - re.error and friends: one line to the user
            raise ValueError(f"{who}: answer_patterns {value!r}: {exc}") from None
    return value


_VERIFIERS: dict[str, Verifier] = {}
_FINGERPRINTS: dict[tuple[str, str], str] = {}
_FP_LOCK = threading.Lock()


def _verifier(name: str) -> Verifier:
    found = _VERIFIERS.get(name)
    if found is None:
        found = _VERIFIERS[name] = get_verifier(name)
    return found


def _fingerprint(name: str, params_json: str) -> str:
    # Once per process: the digest of the code this process loaded and grades with, even if
    # the files are edited while a training run goes on.
    key = (name, params_json)
    with _FP_LOCK:
        if key not in _FINGERPRINTS:
            from scorers.identity.fingerprint import fingerprint

            verifier = _verifier(name)
            params = {**verifier.params, **json.loads(params_json)}
            _FINGERPRINTS[key] = fingerprint(replace(verifier, params=params)).digest
        return _FINGERPRINTS[key]


def completion_text(completion: Any) -> str | None:
    """The text to grade in a trainer's completion, or None when it has none.

    A string is itself. A list of chat messages (TRL's conversational format, tool calls and
    tool results included) gives the content of the last assistant message, the model's final
    word; content given as parts joins their text parts.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        if not messages:
            return None
        said = [m for m in messages if m.get("role") == "assistant"]
        return _content((said or messages)[-1].get("content"))
    return None


def _content(content: Any) -> str | None:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [
            p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        ]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def plain(value: Any) -> Any:
    """`value` as plain Python data: numpy arrays and scalars (what a parquet list column turns
    into in a trainer's batch) become lists and numbers, inside dicts and lists too."""
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)
    return plain(tolist()) if callable(tolist) else value


def target_of(value: Any) -> str | list[str]:
    """A reference as the verifiers take it: a string, or several (any may match)."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return [v if isinstance(v, str) else str(v) for v in value if v is not None]
    return str(value)


def tests_of(spec: Any) -> dict[str, Any]:
    """The unit-test metadata a code sample's reference gives: a dict (or its JSON) with `test` +
    `entry_point` or `test_list` (+ `test_imports`), a list of assert lines, or the test source
    itself."""
    spec = plain(spec)
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            decoded = json.loads(spec)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            spec = decoded
    if isinstance(spec, dict):
        return spec
    if isinstance(spec, list):
        return {"test_list": [str(t) for t in spec]}
    return {"test": str(spec)} if spec else {}


def grade_now(spec: RewardSpec, item: Item) -> Grade:
    """Grade one item, its limit starting now. Never raises: a verifier that raises gives an
    "error" grade (per-sample fault isolation, as in the scoring stage)."""
    metadata = spec.metadata(item.metadata)
    try:
        view = SampleView(
            completion=item.completion,
            target=item.target,
            metadata=metadata,
            deadline=time.monotonic() + spec.timeout_s(metadata),
        )
        return spec.grader.grade(view)
    except Exception as exc:  # noqa: BLE001 - one sample's failure is that sample's, not the batch's
        return Grade("error", None, None, f"{type(exc).__name__}: {exc}"[:500], "verifier_error")


def grade_all(spec: RewardSpec, items: Sequence[Item]) -> list[Grade]:
    """Grade a batch: `spec.concurrency()` items at once (the calling thread is one of the
    graders), each with its own limit from the moment its grading starts."""
    n = len(items)
    if n == 0:
        return []
    workers = min(n, max(1, spec.concurrency()))
    if workers == 1:
        return [grade_now(spec, item) for item in items]
    grades: list[Grade | None] = [None] * n
    cursor = iter(range(n))
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            grades[i] = grade_now(spec, items[i])

    helpers = [threading.Thread(target=run, daemon=True) for _ in range(workers - 1)]
    for t in helpers:
        t.start()
    run()
    for t in helpers:
        t.join()
    done = [g for g in grades if g is not None]
    assert len(done) == n  # every index was taken by exactly one grader
    return done


def reward_value(grade: Grade) -> float | None:
    """The verdict as a reward: the score when the verifier decided, None when it could not."""
    return grade.value if grade.status == "scored" else None


def no_completion(why: str) -> Grade:
    """The grade of a completion that holds no text at all (a malformed message list)."""
    return Grade("unscored", None, None, why, "invalid_completion")
