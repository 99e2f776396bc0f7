"""Async (Inspect) scorers in a grading worker: one event loop for the worker's life, its chunks
graded side by side.

A grade with a `bind()` method (scorers.inspect_scorers.grading.InspectGrade) is async: its
samples wait on I/O (a judge's reply), so many are graded at once in one event loop. The worker
binds it once (the scorer created, its judges built with their HTTP clients) and keeps the loop
running between chunks.

Why chunks overlap: a chunk is done when its slowest sample is, and with a judge failing now and
then that is a retry's backoff (Inspect waits 3 to 6 s before it calls again). A worker that
took one chunk at a time sat out every chunk's tail; here it grades the next chunk meanwhile,
and the pool hands an async grade's worker more chunks at once (`ASYNC_DEPTH`) so it has one
to go on with.

How many samples are in flight: at least `IN_FLIGHT` per worker, shared by its chunks, and
twice the judge's connections in this process when that is more. A sample waiting out a
retry's backoff holds its place, so the limit is well above the connections: with judge calls
failing, the waiting samples would otherwise take every place.

Per-sample limit: `grade_row` cancels an await past the limit; for a scorer busy in Python code
(it never reaches an await), a periodic SIGALRM on the main thread raises `SampleTimeout` (a
TimeoutError) in the task of the sample past its limit, and no other.

Sandboxes: a scorer that calls Inspect's `sandbox()` gets the sample's own, restored from its
workspace archive on first use and removed when the sample is graded (workspaces.restore); a
scorer known to use one (scorers.inspect_scorers.sandboxed) takes its place among the
containers before its time limit starts. What decides those verdicts is in the sandbox
scorers' fingerprint (the restore module), not here.

Nothing here decides a verdict: that is grading.py's, in every Inspect scorer's fingerprint.
Changing this module grades nothing again.

The restore module is imported by the name the sandbox scorers' spec gives it
(`sandboxed.RESTORE_MODULE`, which their `Verifier.code` lists), not by an import statement: the
workspaces package sits above the engine (it runs its containers on `scorers.sandbox`), and a
worker of a sandbox scorer has imported it already with the scorer's code.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["ASYNC_DEPTH", "IN_FLIGHT", "SampleTimeout", "grade_now", "is_async", "serve"]

IN_FLIGHT = 128  # samples in flight per worker, at least
ASYNC_DEPTH = 4  # chunks a worker holds at once for an async grade (one graded, the rest queued)

# (status, value, answer, explanation, reason, metadata JSON, seconds): scorers.workers.pool's
ResultRow = tuple[str, float | None, str | None, str, str, str, float]


class SampleTimeout(TimeoutError):
    """Raised by the watchdog in the task of a sample past its limit."""


def is_async(grade: Any) -> bool:
    """Whether `grade` is an async grade (it binds once per process, grades per row)."""
    return callable(getattr(grade, "bind", None))


class _Watchdog:
    """Per-sample limits for samples busy in Python code: a periodic SIGALRM (the main thread
    only: elsewhere it is off, and only the awaits' limit holds) raises SampleTimeout in the
    task running when the alarm comes, if that task's sample is past its limit."""

    def __init__(self) -> None:
        self.deadlines: dict[asyncio.Task[Any], float] = {}
        self.tick = 0.0
        self._old: Any = None

    def arm(self, timeout_s: float) -> None:
        """Tick for samples of this limit (a tick of a quarter of it, between 50 ms and 1 s)."""
        if timeout_s <= 0 or threading.current_thread() is not threading.main_thread():
            return
        tick = max(0.05, min(1.0, timeout_s / 4))
        if self.tick and self.tick <= tick:
            return
        if not self.tick:
            self._old = signal.signal(signal.SIGALRM, self._on_alarm)
        self.tick = tick
        signal.setitimer(signal.ITIMER_REAL, tick, tick)

    def disarm(self) -> None:
        if self.tick:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old or signal.SIG_DFL)
            self.tick = 0.0

    def watching(self, timeout_s: float) -> Callable[[], Any]:
        """What `grade_row` takes as `watch`: the limit runs for the scorer's call."""

        @contextmanager
        def watch() -> Iterator[None]:
            task = asyncio.current_task()
            if task is None or timeout_s <= 0 or not self.tick:
                yield
                return
            self.deadlines[task] = time.monotonic() + timeout_s
            try:
                yield
            finally:
                self.deadlines.pop(task, None)

        return watch

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if not self.deadlines:
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no loop running in this thread right now
            return
        deadline = self.deadlines.get(task) if task is not None else None
        if deadline is not None and time.monotonic() > deadline:
            del self.deadlines[task]  # type: ignore[arg-type]
            raise SampleTimeout


class _Grading:
    """The async grades this event loop grades with: each bound once, with its own limit of
    samples in flight."""

    def __init__(self) -> None:
        self.watchdog = _Watchdog()
        self._bound: dict[Any, tuple[Any, asyncio.Semaphore, bool]] = {}

    def _bind(self, grade: Any) -> tuple[Any, asyncio.Semaphore, bool]:
        found = self._bound.get(grade)
        if found is None:
            from scorers.inspect_scorers.sandboxed import uses_sandbox

            bound = grade.bind()  # CannotGrade is not kept: the next chunk tries again
            limit = asyncio.Semaphore(max(IN_FLIGHT, 2 * bound.max_connections()))
            boxed = uses_sandbox(getattr(bound.scorer, "__module__", "") or "")
            found = self._bound[grade] = (bound, limit, boxed)
        return found

    async def chunk(self, grade: Any, rows: Sequence[Any], timeout_s: float) -> list[ResultRow]:
        """One result per row, in order; never raises."""
        from scorers.inspect_scorers.grading import CannotGrade, grade_row

        Sandboxes = _restorer()  # noqa: N806 - a class

        try:
            bound, limit, boxed = self._bind(grade)
        except CannotGrade as exc:
            return [exc.row] * len(rows)
        self.watchdog.arm(timeout_s)
        watch = self.watchdog.watching(timeout_s)

        async def one(row: Any) -> ResultRow:
            async with limit:
                sandboxes = Sandboxes(row[4] if len(row) > 4 else None)
                try:
                    if boxed and sandboxes.replay is None:
                        await sandboxes.reserve()
                    with sandboxes.provided():
                        graded = await grade_row(bound, row, timeout_s, watch)
                finally:
                    await sandboxes.aclose()
                return sandboxes.settle(graded)  # type: ignore[return-value]

        loop = asyncio.get_running_loop()
        # each sample in a copy of the bound context: it sets its own store and recording
        tasks = [loop.create_task(one(row), context=bound.context.copy()) for row in rows]
        return list(await asyncio.gather(*tasks))

    async def aclose(self) -> None:
        self.watchdog.disarm()
        for bound, _, _ in self._bound.values():
            await bound.aclose()
        self._bound.clear()


def grade_now(grade: Any, rows: Sequence[Any], timeout_s: float) -> list[ResultRow]:
    """Grade one chunk of an async grade in this process, in an event loop of its own (on a
    thread of its own when one runs here already)."""
    from scorers.inspect_scorers.grading import run_here

    async def main() -> list[ResultRow]:
        grading = _Grading()
        try:
            return await grading.chunk(grade, rows, timeout_s)
        finally:
            await grading.aclose()

    return run_here(main())


# (job, (grade, rows, timeout_s, may_defer, verifier)): a job handed to a worker, decoded
Job = tuple[int, tuple[Any, ...]]


async def serve(
    first: Job,
    next_job: Callable[[], Job | None],
    sync_job: Callable[[Job], bool],
    reply: Callable[[int, list[ResultRow] | Exception, Any], bool],
    busy: threading.Event,
) -> None:
    """A grading worker's loop once an async grade has come: chunks graded side by side in one
    event loop (`asyncio.run(serve(...))`) until the channel closes.

    `first`: the job that came. `next_job()` blocks for the next one (None: the channel
    closed). `reply(job, results, verifier)` sends a job's results, or the exception that
    ended its chunk, as the job's failure (False: the parent is gone, stop): a job is always
    answered, or the stage would wait for it for ever. A job of a synchronous grade (a later verifier of the same stage) goes to
    `sync_job` in this thread once the async chunks in hand are done (False: stop). `busy` is
    set while any chunk is in hand.
    """
    loop = asyncio.get_running_loop()
    grading = _Grading()
    in_hand: set[asyncio.Task[None]] = set()
    gone = asyncio.Event()  # a reply found the parent gone: nobody wants more results

    async def graded(job: int, grade: Any, rows: Any, timeout_s: float, verifier: Any) -> None:
        try:
            results: list[ResultRow] | Exception = await grading.chunk(grade, rows, timeout_s)
        except Exception as exc:  # noqa: BLE001 - answered as the job's failure, never dropped
            results = exc
        if not reply(job, results, verifier):
            gone.set()

    def finished(task: asyncio.Task[None]) -> None:
        in_hand.discard(task)
        if not in_hand:
            busy.clear()

    async def drain() -> bool:
        """Wait for the chunks in hand; False: the parent is gone."""
        if in_hand:
            await asyncio.wait(set(in_hand))
        return not gone.is_set()

    item: Job | None = first
    try:
        while item is not None:
            job, (grade, rows, timeout_s, _, verifier) = item
            busy.set()
            if is_async(grade):
                task = loop.create_task(graded(job, grade, rows, timeout_s, verifier))
                in_hand.add(task)
                task.add_done_callback(finished)
            else:
                if not await drain():
                    return
                grading.watchdog.disarm()  # a synchronous grade sets its own alarm
                if not sync_job(item):  # it sets and clears `busy` itself
                    return
            if gone.is_set():
                return
            item = await loop.run_in_executor(None, next_job)
        await drain()
    finally:
        await grading.aclose()


def _restorer() -> Any:
    """`Sandboxes` of the restore module the sandbox scorers name (scorers.inspect_scorers.sandboxed)."""
    import importlib

    from scorers.inspect_scorers.sandboxed import RESTORE_MODULE

    return importlib.import_module(RESTORE_MODULE).Sandboxes
