"""A per-sample progress bar for Inspect generation, fed by Inspect's hooks.

Inspect's own display is a full-screen UI that fights with anything else on the terminal, so
generation runs with `display="none"` and this hook advances a rich bar as each sample ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from inspect_ai.hooks import Hooks, SampleEnd, TaskStart, hooks
from rich.progress import Progress, TaskID

from flows.runtime.console import progress_bar

__all__ = ["generation_progress", "quiet_hook_banner"]

_active: _Tracker | None = None


class _Tracker:
    def __init__(self, progress: Progress, title: str) -> None:
        self.progress = progress
        self.title = title
        self.bar: TaskID | None = None
        self.errored = 0

    def start(self, label: str, limit: int | None, epochs: int) -> None:
        total = limit * epochs if limit else None
        self.bar = self.progress.add_task(f"{self.title} · {label}", total=total)

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.progress.update(self.bar, total=total)

    def advance(self, errored: bool) -> None:
        if self.bar is not None:
            self.errored += errored
            self.progress.advance(self.bar)


@hooks(name="gradebook_progress", description="gradebook: advance the generation progress bar")
class _ProgressHooks(Hooks):
    def enabled(self) -> bool:
        return _active is not None

    async def on_task_start(self, data: TaskStart) -> None:
        if _active is None:
            return
        spec: Any = data.spec
        n = spec.dataset.samples or 0
        limit = spec.config.limit
        if isinstance(limit, int):
            n = min(n, limit)
        elif isinstance(limit, tuple | list):
            n = min(n, limit[1] - limit[0])
        _active.set_total(n * (spec.config.epochs or 1))

    async def on_sample_end(self, data: SampleEnd) -> None:
        if _active is not None:
            _active.advance(data.sample.error is not None)


def quiet_hook_banner() -> None:
    # Inspect prints an "inspect_ai vX - hooks enabled: N" banner the first time it loads
    # registry hooks; ours is an implementation detail, so load them once with stdout captured.
    try:
        from inspect_ai.hooks._startup import init_hooks
    except ImportError:  # a future Inspect moved it: the banner is cosmetic
        return
    import rich

    shared = rich.get_console()
    was_quiet, shared.quiet = shared.quiet, True
    try:
        init_hooks()
    finally:
        shared.quiet = was_quiet


@contextmanager
def generation_progress(title: str) -> Iterator[_Tracker]:
    """Show a bar per task while Inspect generates; one tracker at a time per process."""
    global _active
    with progress_bar() as progress:
        tracker = _Tracker(progress, title)
        _active = tracker
        try:
            yield tracker
        finally:
            _active = None
