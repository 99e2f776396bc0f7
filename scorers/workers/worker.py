"""What runs in a grading worker: `grade_chunk` (one chunk, per-sample fault isolation and
time limit) and the worker's main loop (preload, then grade the chunks the stage sends until
the channel closes). The stage's side, which starts these processes and hands them chunks, is
scorers.workers.pool.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any

from scorers.grade import Grade, SampleView, unscored
from scorers.workers.async_grading import Job, grade_now, is_async, serve
from scorers.workers.phases import WorkerTimes

__all__ = ["ResultRow", "SampleRow", "failed_rows", "grade_chunk", "short_traceback"]

# (completion, targets, metadata JSON, sample_id[, state JSON]): what a verifier may read of
# one sample; the state (what an Inspect TaskState is rebuilt from) only for verifiers that
# read it (`Verifier.reads_state`), else None or absent.
SampleRow = tuple[str | None, list[str] | None, str | None, str | None, str | None]
# (status, value, answer, explanation, reason, metadata JSON, seconds)
ResultRow = tuple[str, float | None, str | None, str, str, str, float]


class _SampleTimeout(Exception):
    pass


def short_traceback(exc: BaseException, limit: int = 1500) -> str:
    """The last frames of `exc`'s traceback, at most `limit` characters."""
    text = "".join(traceback.format_exception(exc, limit=-4)).strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def grade_chunk(
    grade: Callable[[SampleView], Grade],
    rows: Sequence[SampleRow],
    timeout_s: float,
    may_defer: bool = False,
    times: WorkerTimes | None = None,
) -> list[ResultRow]:
    """Grade rows in this process (main thread: the per-sample limit uses SIGALRM).

    Returns one result tuple per row, in order; the caller adds the key columns back. With
    `may_defer`, a row the verifier defers (status "deferred") must be graded again later.
    `times`: add each sample's seconds there, under how it was decided (`WorkerTimes`).

    An async grade (an Inspect scorer: scorers.workers.async_grading) grades the chunk's samples
    concurrently within one event loop.
    """
    if is_async(grade):
        return grade_now(grade, rows, timeout_s)
    out: list[ResultRow] = []
    clock = time.perf_counter
    with _ChunkLimit(timeout_s) as limit:
        for row in rows:
            t0 = clock()
            completion, target, metadata, sample_id = row[0], row[1], row[2], row[3]
            view = SampleView(
                completion or "",
                list(target) if target else [],
                _loads(metadata),
                sample_id,
                may_defer,
                None,
                row[4] if len(row) > 4 else None,
            )
            g = limit.grade(grade, view)
            status = g.status
            if status == "deferred" and not may_defer:
                g = unscored("verifier_error", "verifier deferred a sample it was told to grade")
                status = g.status
            value = g.value if status == "scored" else None
            if value is not None and math.isnan(value):
                value = None
            out.append(
                (status, value, g.answer, g.explanation, g.reason, _metadata_json(g.metadata),
                 clock() - t0)
            )  # fmt: skip
            if times is not None:
                path = g.metadata.get("path") if g.metadata else None
                times.add(path if isinstance(path, str) else "other", out[-1][6])
    return out


class _ChunkLimit:
    """The per-sample limit for a whole chunk: one periodic SIGALRM for the chunk (two timer
    syscalls per sample add up over hundreds of thousands), whose handler raises in the
    verifier only while a sample is past its limit. A sample is stopped within a tick of it.
    Off when `timeout_s` is 0 or off the main thread (SIGALRM reaches the main thread only:
    there the verifier's own bounds are what hold, and the math verifier's are hard)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.active = (
            timeout_s > 0
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
        )
        self.started: float | None = None  # the sample being graded's start, if any
        self._old: Any = None

    def __enter__(self) -> _ChunkLimit:
        if self.active:
            tick = max(0.01, min(1.0, self.timeout_s / 10))
            self._old = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, tick, tick)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old or signal.SIG_DFL)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        started = self.started
        if started is not None and time.perf_counter() - started > self.timeout_s:
            self.started = None
            raise _SampleTimeout

    def grade(self, grade: Callable[[SampleView], Grade], view: SampleView) -> Grade:
        """`grade(view)`; never raises (a failure or overrun becomes an unscored Grade)."""
        try:
            self.started = time.perf_counter()
            result = grade(view)
            self.started = None
            if not isinstance(result, Grade):
                return unscored(
                    "verifier_error", f"verifier returned {type(result).__name__}, not a Grade"
                )
            return result
        except _SampleTimeout:
            return unscored("timeout", f"verifier did not finish within {self.timeout_s:g}s")
        except Exception as exc:
            return unscored(
                "verifier_error",
                f"verifier raised {type(exc).__name__}: {str(exc)[:200]}",
                traceback=short_traceback(exc),
            )
        finally:
            self.started = None


_JSON_MEMO: dict[tuple, str] = {}
_JSON_MEMO_MAX = 256
_PLAIN = frozenset((str, int, float, bool, type(None)))


def _metadata_json(meta: dict[str, Any]) -> str:
    """`meta` as JSON. A verifier's metadata is mostly one of a few small dicts of plain
    values (math: {"path": "exact"}): each of those is encoded once per worker. The values'
    types are part of the key: 1, 1.0 and True are equal but encode differently."""
    if not meta:
        return "{}"
    values = tuple(meta.values())
    types = tuple(map(type, values))
    key = (tuple(meta), types, values)
    try:
        text = _JSON_MEMO.get(key)
    except TypeError:  # an unhashable value (a list, a dict): not one of the common few
        return json.dumps(meta, default=str)
    if text is None:
        text = json.dumps(meta, default=str)
        if len(_JSON_MEMO) < _JSON_MEMO_MAX and len(text) <= 200 and _PLAIN.issuperset(types):
            _JSON_MEMO[key] = text
    return text


def _loads(text: str | None) -> dict[str, Any]:
    if not text or text == "{}":  # most samples: skip the parser
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def failed_rows(n: int, why: str, exc: BaseException | None = None) -> list[ResultRow]:
    """`n` unscored results (reason "verifier_error") for a chunk that could not be graded."""
    meta = json.dumps({"traceback": short_traceback(exc)}) if exc is not None else "{}"
    return [("unscored", None, None, why[:300], "verifier_error", meta, 0.0)] * n


# -- worker process --------------------------------------------------------------------------


def _worker_main(fd: int, broker_fd: int | None = None) -> None:
    """A grading worker's loop: preload, then grade chunks until the channel closes.

    The channel closing -- the stage is done, or its process died (SIGKILL included) -- ends
    the worker at once, even mid-chunk: nobody is left to want the results. Ctrl-C is the
    stage's business: it closes the channel.
    """
    conn = Connection(fd)
    sys_path, preload = conn.recv()
    sys.path[:] = sys_path
    # Jobs are read by a thread into a queue, so the parent can hand over the next chunk while
    # this one is graded (no idle gap between chunks) without either side blocking on a full
    # socket. Grading stays on the main thread: the per-sample limit is a SIGALRM.
    jobs: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
    # set while the channel closing must end the process at once: during the preload (imports
    # can take seconds) and while a chunk is graded
    busy = threading.Event()
    busy.set()
    threading.Thread(target=_read_jobs, args=(conn, jobs, busy), daemon=True).start()
    if broker_fd is not None:
        # before any verifier import: their pools then fork from the stage's shared zygotes
        from scorers.workers.zygote import use_broker

        use_broker(broker_fd)
    for name in preload:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: S112 - a hint only; the grade call reports the real error
            continue
        # A verifier may offer warm_up() (math boots its sympy zygote). Run in the background:
        # grading the many samples that need no sympy starts at once, and the boot (another
        # process) overlaps it instead of stalling the first chunk.
        warm_up = getattr(module, "warm_up", None)
        if callable(warm_up):
            threading.Thread(target=_quietly, args=(warm_up,), daemon=True).start()
    busy.clear()

    # this worker's own seconds, sent back with each chunk's results (scorers.workers.phases)
    times = WorkerTimes()
    clock = time.monotonic

    def next_job() -> Job | None:
        """The next job, decoded (one that cannot be is answered with why, here)."""
        while True:
            t0 = clock()
            item = jobs.get()
            t1 = clock()
            times.add("wait for a chunk", t1 - t0)
            if item is None:
                return None
            job, payload = item
            try:
                decoded = pickle.loads(payload)
                times.add("decode the chunk", clock() - t1)
                _import_module_of(decoded[4] if len(decoded) > 4 else None)
                return job, decoded
            except Exception as exc:  # e.g. the verifier cannot be unpickled here
                if not send((job, "error", f"{type(exc).__name__}: {exc}", short_traceback(exc))):
                    return None

    def send(reply: tuple) -> bool:
        try:
            conn.send(reply)
        except OSError:  # the parent went away
            return False
        return True

    def sync_job(item: Job) -> bool:
        job, (grade, rows, timeout_s, may_defer, verifier) = item
        busy.set()
        t0 = clock()
        try:
            results = grade_chunk(grade, rows, timeout_s, may_defer, times)
            t1 = clock()
            times.add("grade calls, in all", t1 - t0)
            # after grading: a module the verifier imported while grading counts too
            digest = _digest_as_loaded(verifier)
            times.add("check the code it ran", clock() - t1)
            reply: tuple = (job, "ok", results, digest, times.take(graded_by="grade "))
        except Exception as exc:
            reply = (job, "error", f"{type(exc).__name__}: {exc}", short_traceback(exc))
        busy.clear()
        t0 = clock()
        sent = send(reply)
        times.add("send the results", clock() - t0)
        return sent

    while (item := next_job()) is not None:
        if is_async(item[1][0]):
            # from now on, chunks are graded side by side in one event loop

            def reply(job: int, results: list[ResultRow] | Exception, verifier: Any) -> bool:
                # as a synchronous job's: whatever failed is the job's answer, never a reply
                # left unsent (the stage would wait for it for ever)
                try:
                    if isinstance(results, Exception):
                        raise results
                    answer: tuple = (job, "ok", results, _digest_as_loaded(verifier))
                except Exception as exc:
                    answer = (job, "error", f"{type(exc).__name__}: {exc}", short_traceback(exc))
                return send(answer)

            asyncio.run(serve(item, next_job, sync_job, reply, busy))
            return
        if not sync_job(item):
            return


def _forked_worker_main(conn: Connection) -> None:
    """`_worker_main` in a worker forked from a warm zygote: the stage first passes it its
    broker channel (a started worker gets it at spawn)."""
    broker_fd = recv_handle(conn)
    _worker_main(conn.fileno(), broker_fd)


_TRIED: set[str] = set()


def _import_module_of(verifier: Any) -> None:
    """Import the verifier's module at its first job, as the preload would have. A worker
    started before the stage resolved its verifiers (started early, with the command line's
    preload) has not imported it. An Inspect scorer's factory is then missing from the
    registry that importing the module fills, and every sample was left `verifier_error`."""
    module = getattr(verifier, "module", None)
    if not isinstance(module, str) or not module or module in sys.modules or module in _TRIED:
        return
    _TRIED.add(module)
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001, S110 - a hint only; the grade call reports the real error
        pass


def _digest_as_loaded(verifier: Any) -> str | None:
    """The fingerprint of the code this process graded `verifier` with (None: no verifier
    given, or nothing can vouch for what ran)."""
    if verifier is None:
        return None
    from scorers.identity.fingerprint import fingerprint_as_loaded

    fp = fingerprint_as_loaded(verifier)
    return fp.digest if fp is not None else None


def _read_jobs(conn: Connection, jobs: queue.SimpleQueue, busy: threading.Event) -> None:
    try:
        while True:
            jobs.put(conn.recv())
    except (EOFError, OSError):
        # The stage closed the channel (idle: finish normally) or died. Mid-chunk, nobody
        # will read the results: stop now rather than grade on (a chunk of sandboxed tests
        # can take minutes). The sandbox containers this process owns end with it (their
        # lifeline closes) and the helpers forked from the stage's zygotes end with theirs.
        if busy.is_set():
            os._exit(0)
        jobs.put(None)


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # noqa: S110 - a failed warm-up shows up, per sample, when it matters
        pass
