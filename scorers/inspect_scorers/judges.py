"""Judge-graded scorers: the grader model role, its identity, its calls and its failures.

A judge scorer (Inspect's `model_graded_qa` / `model_graded_fact`, or any scorer that calls
`get_model(role="grader")`) grades with the model a config binds to the `grader` role, never
with the model under test: the spec carries the role (`ScorerSpec.roles`), a grading process
builds the judge from it and binds it as Inspect's model role for the sample.

What of the role is the verifier's identity (`identity`): the judge model and the generation
config that shapes its verdicts (temperature, max_tokens, system_message, ...). Not where it is
served (`base_url`), and not how it is called (connections, retries, timeouts): moving the
judge to another server or raising its rate limit is not a new verifier version. The prompt
template and the grading instructions are the scorer's params, and the default template is in
Inspect's code, both fingerprinted with the scorer already.

Each sample's judge calls are collected as Inspect records them (`ModelEvent`s, through
Inspect's model-event sink) and stored with the score (`evidence`): the prompt, the raw reply,
the token usage, the error. A sample whose scorer failed while a judge call failed, or was
still waiting on one, is `grader_failed` (retryable once the judge answers); one whose judge
answered but whose scorer could not read a verdict from the reply is `verdict_unparseable`
(never retried automatically: the same reply parses the same way).
"""

from __future__ import annotations

import ast
import math
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

__all__ = [
    "GRADER",
    "warm_up",
    "GRADER_FAILED",
    "VERDICT_UNPARSEABLE",
    "JudgeCalls",
    "bind_roles",
    "build_judges",
    "identity",
    "needs_grader",
    "recording",
]

GRADER = "grader"
GRADER_FAILED = "grader_failed"  # Inspect's ScoreReason for a failed grader
VERDICT_UNPARSEABLE = "verdict_unparseable"

# GenerateConfig fields that say how a model is called, not what it answers
_OPERATIONAL = frozenset(
    {
        "max_retries",
        "timeout",
        "attempt_timeout",
        "stream_idle_timeout",
        "max_connections",
        "adaptive_connections",
        "batch",
        "cache",
        "extra_headers",
        "fallback_models",
    }
)
_KNOWN_JUDGES = frozenset({"model_graded_qa", "model_graded_fact"})
_SECRET_ARG = ("key", "token", "secret", "password")
_OPERATIONAL_ARGS = frozenset({"max_retries", "timeout"})  # the provider client's own


def identity(roles: Mapping[str, Any]) -> dict[str, Any]:
    """The part of each bound role that decides verdicts: what the fingerprint covers."""
    out: dict[str, Any] = {}
    for name, role in sorted(roles.items()):
        config = {k: v for k, v in (role.get("config") or {}).items() if k not in _OPERATIONAL}
        args = {
            k: v
            for k, v in (role.get("args") or {}).items()
            if k not in _OPERATIONAL_ARGS and not any(s in k.lower() for s in _SECRET_ARG)
        }
        out[name] = {"model": role.get("model"), "args": args, "config": config}
    return out


def needs_grader(factory: Any, registry_name: str, params: Mapping[str, Any]) -> bool:
    """Whether a scorer grades with the `grader` role: a known judge, or one whose module
    names the role, and whose params give it no model of its own."""
    if params.get("model") is not None or params.get("model_role", GRADER) != GRADER:
        return False
    if registry_name.rsplit("/", 1)[-1] in _KNOWN_JUDGES:
        return True
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return bool(path) and _names_grader(str(path))


@lru_cache(maxsize=256)
def _names_grader(path: str) -> bool:
    """The module's source has the string constant "grader" (as in `role="grader"`); read,
    never run."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(n, ast.Constant) and n.value == GRADER for n in ast.walk(tree))


def warm_up() -> None:
    """What a process's first judge model costs before its first call: Inspect's start-up
    hooks (an installed package's hooks must see the judge's calls, and finding them loads
    every package's Inspect entry point). A grading worker runs it while the stage ingests."""
    from inspect_ai.hooks._startup import init_hooks

    init_hooks()


def _judge(role: str, spec: Mapping[str, Any], processes: int) -> Any:
    from inspect_ai.model import GenerateConfig, get_model

    config = dict(spec.get("config") or {})
    if config.get("max_connections"):
        # the role's limit is the stage's: each grading process takes its share
        config["max_connections"] = max(1, math.ceil(int(config["max_connections"]) / processes))
    model = get_model(
        str(spec["model"]),
        config=GenerateConfig(**config),
        base_url=spec.get("base_url"),
        memoize=False,
        **dict(spec.get("args") or {}),
    )
    model._set_role(role)  # noqa: SLF001 - as eval() binds a role: events and usage name it
    return model


def build_judges(roles: Mapping[str, Any], processes: int = 1) -> dict[str, Any]:
    """The models the roles bind (role name -> Inspect `Model`), built in this process.

    Raises:
        Exception: whatever Inspect raises for a model it cannot create.
    """
    return {name: _judge(name, spec, processes) for name, spec in roles.items()}


def bind_roles(models: Mapping[str, Any]) -> None:
    """Bind the models as Inspect's model roles in the current context (tasks started in it,
    or in a copy of it, see them). Close their clients when done with them: they belong to
    the event loop that used them.

    No model is active: a scorer that calls `get_model()` with no role and no model of its own
    fails ("No model specified"), it never reaches the model under test.
    """
    from inspect_ai.model._model import _model_roles

    _model_roles.set(dict(models))


class JudgeCalls:
    """One sample's model calls, as Inspect's model-event sink hands them over."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_pending(self, event: Any) -> None:
        self.events.append(event)

    def on_complete(self, event: Any) -> None:
        if not any(e is event for e in self.events):
            self.events.append(event)

    def failed(self) -> bool:
        """The last call (Inspect records one per attempt) failed or never finished: the
        scorer's failure is the judge's."""
        return bool(self.events) and bool(self.events[-1].pending or self.events[-1].error)

    def answered(self) -> bool:
        """The last call came back with a reply."""
        return bool(self.events) and not self.events[-1].pending and not self.events[-1].error

    def last_error(self) -> str | None:
        for e in reversed(self.events):
            if e.pending:
                return "no reply (the call was still waiting)"
            if e.error:
                return str(e.error).splitlines()[0][:300]
        return None

    def evidence(self) -> list[dict[str, Any]]:
        """Per call: the model, its role, the prompt, the raw reply, the usage, the error."""
        out = []
        for e in self.events:
            usage = e.output.usage if e.output is not None else None
            out.append(
                {
                    "model": e.model,
                    "role": e.role,
                    "prompt": [{"role": m.role, "content": m.text} for m in e.input],
                    "reply": e.output.completion if e.output is not None and not e.error else None,
                    "usage": {
                        "input_tokens": usage.input_tokens,
                        "output_tokens": usage.output_tokens,
                        "total_tokens": usage.total_tokens,
                    }
                    if usage is not None
                    else None,
                    "error": e.error.splitlines()[0][:300] if e.error else None,
                    "pending": bool(e.pending),
                }
            )
        return out


@contextmanager
def recording() -> Any:
    """Collect the model calls made in this task for the block (a `JudgeCalls`)."""
    from inspect_ai.model._model import _model_event_sink

    calls = JudgeCalls()
    token = _model_event_sink.set(calls)
    try:
        yield calls
    finally:
        _model_event_sink.reset(token)
