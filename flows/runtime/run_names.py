"""What a gradebook run is called in the Prefect UI: a name that says what it ran, and tags.

Prefect names a flow run after an adjective and an animal ("musical-mayfly"), which says nothing
of the model, task or verifier it was about. gradebook's flows name their runs with
`flow_run_name` callables (from their parameters, when the run starts) and, once a flow knows
more (the runs a score ingested, the samples a re-score graded), rename the run and add tags.
Tags are `kind:value` (`model:demo-v2`, `task:math_verified`, `verifier:math`, `sweep:nightly`)
so the UI's tag filter finds every run of a model, a task or a verifier.

Naming is best effort: a run that cannot be renamed or tagged (no API, a server error) runs
all the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["count", "label_run", "listed", "parameter", "tag"]

# Prefect stores tags as strings; a tag this long is a path, not a filter anyone types
_TAG_MAX = 100


def count(n: int, word: str) -> str:
    """`1 model`, `2 models`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def listed(values: Iterable[str], limit: int = 3) -> str:
    """Up to `limit` distinct values in order, then `+N`: `arith, algebra +2`."""
    seen = list(dict.fromkeys(values))
    head = ", ".join(seen[:limit])
    return head + (f" +{len(seen) - limit}" if len(seen) > limit else "")


def parameter(name: str) -> Any:
    """A parameter of the flow run being named (for `flow_run_name` callables)."""
    from prefect.runtime import flow_run

    return flow_run.parameters.get(name)


def tag(kind: str, value: str) -> str:
    """A `kind:value` tag for the UI's filters."""
    return f"{kind}:{value}"[:_TAG_MAX]


def label_run(name: str | None = None, tags: Iterable[str] = ()) -> None:
    """Rename the flow run this code runs in, and add `tags` to it (no-op outside a run)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx is not None else None
    if run is None:
        return
    new_tags = sorted(set(run.tags or []) | set(tags))
    if name == run.name and new_tags == sorted(run.tags or []):
        return
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, name=name, tags=new_tags)
    except Exception:  # noqa: S110 - a run that cannot be renamed still does its work
        return
    run.tags = new_tags
    if name:
        run.name = name
