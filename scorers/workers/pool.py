"""Grading worker processes for the scoring stage, and the light entry point they run.

A worker is a fresh interpreter started with `python -c` (not multiprocessing's spawn, which
re-imports the caller's `__main__` -- for the `gradebook` CLI that is Prefect and Inspect, seconds
per worker). It imports only this module, `scorers.grade` and the verifier modules it is told to
preload, so it is ready in a fraction of a second, and it imports them from disk as they are now
(an edited verifier is what gets run). Chunks go over a socket pair: a list of compact tuples
in, a list of compact result tuples out. A worker grades one chunk at a time, except an async
grade's (an Inspect scorer's): those it grades side by side in one event loop
(scorers.workers.async_grading).

Warm workers: a pool started with `fork_from` (an Inspect scorer's modules and warm-ups)
boots one zygote (`scorers.workers.zygote`) that imports them once, and forks its workers from
it instead of starting interpreters: importing Inspect and running its start-up hooks is paid
once per stage, not once per worker, and while the stage ingests. A forked worker serves the
same loop as a started one; when the zygote cannot fork (it failed to boot, or is not
single-threaded) the pool starts interpreters as before.

Fault isolation: a verifier that raises or overruns the per-sample limit makes that sample
`unscored` (inside the worker); a worker that dies (segfault, OOM kill) makes the chunks it held
`unscored` and is replaced.

Which code graded: a worker records the exact source of every project module it compiles
(`scorers.identity.loaded_code`, installed first in each worker), and with each chunk of a `Verifier` it reports
the fingerprint of the code it actually ran (`scorers.identity.fingerprint.fingerprint_as_loaded`). `map`
never hands the caller a chunk graded by code other than the fingerprint it expects.

Nothing here imports Prefect, Inspect or the warehouse: this module is the workers' whole world.
"""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import send_handle
from pathlib import Path
from typing import Any

from scorers.grade import Grade, SampleView
from scorers.identity import loaded_code
from scorers.workers.async_grading import ASYNC_DEPTH, is_async
from scorers.workers.phases import STAGE
from scorers.workers.stop import stop_fd, stop_signal
from scorers.workers.worker import (
    ResultRow,
    SampleRow,
    _quietly,
    failed_rows,
    grade_chunk,
)
from scorers.workers.zygote import (
    ForkedProcess,
    Zygote,
    ZygoteBroker,
    ZygoteFailed,
    reap_later,
)

__all__ = [
    "DEFAULT_CHUNK",
    "STOP_GRACE_S",
    "GradingPool",
    "PreloadEntry",
    "SampleRow",
    "ResultRow",
    "grade_chunk",
    "prewarm",
]


_ROOT = str(Path(__file__).resolve().parents[2])
DEFAULT_CHUNK = 250  # samples per worker call: large enough to amortise pickling
# A stop (Ctrl-C, SIGTERM) hands out no more chunks and waits this long for the chunks in
# flight: a fast verifier's come back and are written; a slow one's (a judge's) are dropped,
# left ungraded for the next stage, so the stop does not wait on them.
STOP_GRACE_S = 2.0


class _Jobs:
    """The work of one `GradingPool.map`: the caller's chunks (jobs 0..n-1), then, per chunk
    that deferred rows, one more job of just those rows (graded without deferral)."""

    def __init__(
        self,
        chunks: Sequence[Sequence[SampleRow]],
        may_defer: bool,
        done: Callable[[int, list[ResultRow]], None],
    ) -> None:
        self.chunks = chunks
        self.defer = may_defer
        self.done = done
        self.todo = list(range(len(chunks)))[::-1]  # popped from the end
        # extra job -> (its chunk, positions in the chunk, the chunk's results so far)
        self.extra: dict[int, tuple[int, list[int], list[ResultRow]]] = {}
        self.next_id = len(chunks)
        self.stale: list[int] = []  # chunks graded (in part) by other code than expected

    def rows(self, job: int) -> list[SampleRow]:
        if job < len(self.chunks):
            return list(self.chunks[job])
        chunk, positions, _ = self.extra[job]
        rows = self.chunks[chunk]  # may be built on each access (flows.score: per chunk)
        return [rows[i] for i in positions]

    def may_defer(self, job: int) -> bool:
        return self.defer and job < len(self.chunks)

    def discard(self, job: int) -> None:
        """The job was graded by other code than expected: its chunk is never handed over."""
        chunk = job if job < len(self.chunks) else self.extra.pop(job)[0]
        self.stale.append(chunk)

    def finish(self, job: int, results: list[ResultRow]) -> None:
        if job >= len(self.chunks):
            chunk, positions, merged = self.extra.pop(job)
            for i, result in zip(positions, results, strict=True):
                merged[i] = result
            self.done(chunk, merged)
            return
        deferred = [i for i, r in enumerate(results) if r[0] == "deferred"]
        if not deferred:
            self.done(job, results)
            return
        self.extra[self.next_id] = (job, deferred, list(results))
        self.todo.append(self.next_id)  # the front of the queue
        self.next_id += 1


# -- parent side -----------------------------------------------------------------------------


_FORKED_ENTRY = "scorers.workers.worker:_forked_worker_main"


class _Worker:
    def __init__(
        self, preload: Sequence[str], broker: ZygoteBroker, zygote: Zygote | None = None
    ) -> None:
        to_broker = broker.channel()
        self.proc: subprocess.Popen | ForkedProcess
        try:
            self.conn = self._fork(zygote, to_broker) if zygote is not None else None
            if self.conn is None:
                self.conn = self._start(to_broker)
        finally:
            to_broker.close()
        self.conn.send((list(sys.path), tuple(preload)))
        self.jobs: list[int] = []  # handed over, not yet answered (oldest first)

    def _fork(self, zygote: Zygote, to_broker: socket.socket) -> Connection | None:
        """A worker forked from the warm zygote (None: it cannot fork; start one instead)."""
        try:
            pid, conn = zygote.fork(entry=_FORKED_ENTRY)
        except ZygoteFailed:
            return None
        self.proc = ForkedProcess(pid)
        try:
            send_handle(conn, to_broker.fileno(), pid)
        except OSError:
            conn.close()
            self.proc.kill()
            return None
        return conn

    def _start(self, to_broker: socket.socket) -> Connection:
        ours, theirs = socket.socketpair()
        fds = (theirs.fileno(), to_broker.fileno())
        # SIGINT ignored from the first statement: a Ctrl-C reaches the whole terminal process
        # group, and it is the stage's to handle (it closes the channel, which ends the worker)
        code = (
            "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            f"import sys; sys.path.insert(0, {_ROOT!r})\n{loaded_code.boot_code()}"
            f"from scorers.workers.worker import _worker_main; _worker_main(*{fds})"
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code], pass_fds=fds, stdin=subprocess.DEVNULL
            )
        finally:
            theirs.close()
        return Connection(ours.detach())

    def close(self, kill: bool = False) -> None:
        if not self.conn.closed:
            self.conn.close()
        if kill:
            self.proc.kill()
        # Reaped in the background: a worker still booting its verifier's helpers (sympy)
        # finishes that and exits on its own; the stage need not wait for it.
        reap_later(self.proc, grace_s=30)


# a warm zygote's preload: module names, and (module, function, args) warm-ups run once there
PreloadEntry = str | tuple[str, str, tuple]
Preload = tuple[PreloadEntry, ...]
# warm zygotes booted before any pool asked (`prewarm`), each with the broker that owns it:
# the first pool started with that preload adopts both
_PREWARMED: dict[Preload, ZygoteBroker] = {}
_PREWARMED_LOCK = threading.Lock()


def prewarm(fork_from: Sequence[PreloadEntry]) -> None:
    """Boot the warm zygote for `fork_from` now, in the background, for a pool this process
    will start later with a preload it covers (see `covers`, `GradingPool.start`). One nobody
    adopts ends with this process (its channel closes)."""
    key = tuple(fork_from)
    with _PREWARMED_LOCK:
        if any(covers(early, key) for early in _PREWARMED):
            return
        superseded = list(_PREWARMED.values())  # booted from less: no pool will adopt them
        _PREWARMED.clear()
        broker = _PREWARMED[key] = ZygoteBroker()
    for old in superseded:
        old.close()
    threading.Thread(
        target=_quietly, args=(partial(broker.zygote, key),), daemon=True, name="warm-zygote"
    ).start()


def covers(early: Sequence[PreloadEntry], wanted: Sequence[PreloadEntry]) -> bool:
    """Whether workers forked from a zygote booted with `early` serve a pool that asks for
    `wanted`: every warm-up `early` ran is one `wanted` asks for (a judge built with other
    roles would be the wrong warm-up), and what `wanted` adds are module names, which the
    workers import themselves (cheap once the zygote imported Inspect)."""
    early_set, wanted_set = set(early), set(wanted)
    return all(isinstance(e, str) or e in wanted_set for e in early_set) and all(
        isinstance(e, str) for e in wanted_set - early_set
    )


def _adopt(key: Preload) -> tuple[Preload, ZygoteBroker] | None:
    """The warm zygote booted early that serves `key` (its preload, and the broker that owns
    it); early ones that do not are closed, so their boots stop taking CPU from the stage."""
    with _PREWARMED_LOCK:
        found = next((early for early in _PREWARMED if covers(early, key)), None)
        adopted = (found, _PREWARMED.pop(found)) if found is not None else None
        others = list(_PREWARMED.values())
        _PREWARMED.clear()
    for broker in others:
        broker.close()
    return adopted


class GradingPool:
    """Grading worker processes, started on first use (or early with `start()`).

    Args:
        workers: number of worker processes.
        depth: chunks handed to a worker at once (the next one waits in its queue, so the
            worker never idles between chunks; a dead worker loses at most this many).
    """

    def __init__(self, workers: int, depth: int = 2) -> None:
        self.workers = max(1, workers)
        self.depth = max(1, depth)
        self._preload: tuple[str, ...] = ()
        self._procs: list[_Worker] = []
        # Verifier helpers the workers need (math: a sympy zygote) are booted once here and
        # shared, not once per worker: each sympy boot costs seconds of CPU.
        self._broker = ZygoteBroker()
        # the warm zygote's preload, its boot (a thread that forks the workers once it is
        # ready), and the zygote (None until then, or when it failed: workers are started)
        self._warm: Preload = ()
        self._warm_boot: threading.Thread | None = None
        self._warm_zygote: Zygote | None = None
        self._lock = threading.Lock()  # the boot thread adds workers while the caller goes on

    def start(
        self,
        modules: Iterable[str] = (),
        helpers: Iterable[Sequence[str]] = (),
        fork_from: Sequence[PreloadEntry] = (),
    ) -> None:
        """Launch the workers now (not awaited) and have them import `modules`, so their
        start-up overlaps whatever the caller does next (ingest, reading samples); boot the
        shared zygotes for `helpers` (`Verifier.helpers`) in the background too.

        `fork_from`: the preload of a warm zygote to fork the workers from (module names, and
        (module, function, args) warm-ups run once there), booted in the background; the
        workers are forked as soon as it is ready.
        """
        if fork_from and not self._warm:
            self._warm = tuple(fork_from)
            adopted = _adopt(self._warm) if not self._procs else None
            if adopted is not None:  # booting since before this pool existed: take it over
                self._warm, broker = adopted
                with self._lock:
                    self._broker.close()
                    self._broker = broker
        for preload in helpers:
            threading.Thread(
                target=_quietly, args=(partial(self._broker.zygote, tuple(preload)),),
                daemon=True, name="zygote-boot",
            ).start()  # fmt: skip
        self._preload = tuple(dict.fromkeys([*self._preload, *modules]))
        with self._lock:
            if self._warm and self._warm_boot is None:
                self._warm_boot = threading.Thread(
                    target=self._boot_warm, args=(self._broker,), daemon=True, name="warm-zygote"
                )
                self._warm_boot.start()
            if self._warm_boot is None:
                while len(self._procs) < self.workers:
                    self._procs.append(_Worker(self._preload, self._broker))

    @property
    def forks_warm(self) -> bool:
        """Whether the workers fork from a warm process (booted or booting: `start`)."""
        return bool(self._warm)

    def _boot_warm(self, broker: ZygoteBroker) -> None:
        try:
            zygote: Zygote | None = broker.zygote(self._warm)
        except Exception:  # noqa: BLE001 - the workers are started instead, and report errors
            zygote = None
        with self._lock:
            if broker is not self._broker:  # closed meanwhile
                return
            self._warm_zygote = zygote
            while len(self._procs) < self.workers:
                self._procs.append(_Worker(self._preload, broker, zygote))

    def _await_workers(self) -> None:
        """Wait for the warm zygote's boot (its thread forks the workers), then top up; a stop
        meanwhile raises KeyboardInterrupt (the boot takes seconds: nothing waits for it)."""
        boot = self._warm_boot
        while boot is not None and boot.is_alive():
            if stop_signal() is not None:
                raise KeyboardInterrupt
            boot.join(0.1)
        with self._lock:
            while len(self._procs) < self.workers:
                self._procs.append(_Worker(self._preload, self._broker, self._warm_zygote))

    def map(
        self,
        grade: Callable[[SampleView], Grade],
        chunks: Sequence[Sequence[SampleRow]],
        timeout_s: float,
        done: Callable[[int, list[ResultRow]], None],
        *,
        may_defer: bool = False,
        verifier: Any = None,
        expect: str | None = None,
    ) -> list[int]:
        """Grade every chunk; call `done(index, results)` as each finishes (in any order).

        `verifier` (a `scorers.registry.Verifier` whose `grade` this is) and `expect` (its
        fingerprint as the caller computed it from the files): a worker reports the fingerprint
        of the code it graded a chunk with, and a chunk graded by any other code (imported
        before an edit, or after one) is not handed to `done`; its index is returned instead.
        The caller grades those again in fresh workers, or not at all.

        `may_defer`: the verifier may defer samples (see `SampleView.may_defer`: math defers
        what needs sympy while its zygote still boots). The rows a chunk deferred go back to
        the front of the queue as a job of their own, graded without deferral, and `done` gets
        the chunk once they are in: it never sees a "deferred" result. Re-queued at the front,
        not at the end: deferred rows are the expensive ones, and a stage that kept them for
        last would end with one worker grinding through them while the others idle.

        `done` runs in this thread while the workers go on with the chunks they hold, so it
        may do slow things (write a batch) without stalling them.

        A chunk whose worker died, or that the worker could not run (the verifier does not
        unpickle there), gets `failed_rows`; the pool replaces a dead worker and goes on.

        A stop (`scorers.workers.stop`, noted by the command's Ctrl-C or SIGTERM handler) hands out no more chunks, waits up
        to STOP_GRACE_S for the chunks in flight (each goes to `done` as it comes), stops the
        workers and raises KeyboardInterrupt: the chunks not handed to `done` were not graded
        (a chunk whose worker died after the stop, killed with it, is one of them).

        Returns:
            The indices of the chunks graded by other code than `expect` (empty without it).
        """
        if stop_signal() is not None:
            raise KeyboardInterrupt
        module = getattr(grade, "__module__", None)
        self.start([module] if module else [])
        with STAGE.timed("await the workers' start"):
            self._await_workers()
        jobs = _Jobs(chunks, may_defer, done)
        job_verifier = verifier if expect is not None else None
        # an async grade's worker grades its chunks side by side: it needs more in hand
        depth = max(self.depth, ASYNC_DEPTH) if is_async(grade) else self.depth
        stopping = stop_fd()
        until: float | None = None  # once a stop came: how long the chunks in flight may take
        try:
            if stop_signal() is None:
                for w in list(self._procs):
                    self._fill(w, (grade, job_verifier), timeout_s, jobs, depth)
            while busy := {w.conn: w for w in self._procs if w.jobs}:
                if until is None and stop_signal() is not None:
                    until = time.monotonic() + STOP_GRACE_S
                waited = time.monotonic()
                if until is None:
                    ready = wait([*busy, stopping])
                else:
                    ready = wait(list(busy), timeout=max(0.0, until - time.monotonic()))
                    if not ready:
                        break  # the grace is over: the chunks still out are dropped
                STAGE.add("wait for results", time.monotonic() - waited)
                for conn in ready:
                    w = busy.get(conn)  # type: ignore[call-overload]
                    if w is None:  # the stop's descriptor
                        continue
                    received = time.monotonic()
                    try:
                        msg = w.conn.recv()
                        STAGE.add("receive results", time.monotonic() - received)
                    except (EOFError, OSError) as exc:
                        lost, w.jobs = w.jobs, []
                        if stop_signal() is not None:
                            # killed with the stage (a signal to the whole group): not the
                            # verifier's failure; its chunks are left for the next stage
                            continue
                        why = f"scoring worker died (exit code {w.proc.poll()}): {exc or 'EOF'}"
                        for job in lost:
                            jobs.finish(job, failed_rows(len(jobs.rows(job)), why))
                        w = self._replace(w)
                    else:
                        job = msg[0]
                        w.jobs.remove(job)
                        if len(msg) > 4:  # the worker's own seconds (scorers.workers.phases)
                            STAGE.add_all(msg[4], prefix="worker: ")
                        STAGE.mark_last("last result in")
                        if msg[1] == "ok" and expect is not None and msg[3] != expect:
                            jobs.discard(job)
                            # it holds other code than the files: a fresh worker imports
                            # them as they are now (what it held queued is graded there)
                            jobs.todo.extend(reversed(w.jobs))
                            w.jobs = []
                            w = self._replace(w, warm=False)
                        elif msg[1] == "ok":
                            with STAGE.timed("hand results to the caller"):
                                jobs.finish(job, msg[2])
                        else:
                            why = f"scoring worker failed: {msg[2]}"
                            meta = json.dumps({"traceback": msg[3]})
                            row = ("unscored", None, None, why[:300], "verifier_error", meta, 0.0)
                            jobs.finish(job, [row] * len(jobs.rows(job)))
                    if stop_signal() is None:
                        self._fill(w, (grade, job_verifier), timeout_s, jobs, depth)
            if stop_signal() is not None:
                raise KeyboardInterrupt
        except BaseException:
            # interrupted mid-map: the workers' state is unknown; start over next time
            self.close(kill=True)
            raise
        return sorted(jobs.stale)

    def _fill(
        self,
        w: _Worker,
        grader: tuple[Callable[[SampleView], Grade], Any],
        timeout_s: float,
        jobs: _Jobs,
        depth: int,
    ) -> None:
        grade, verifier = grader
        clock = time.monotonic
        while jobs.todo and len(w.jobs) < depth:
            job = jobs.todo.pop()
            t0 = clock()
            rows, may_defer = jobs.rows(job), jobs.may_defer(job)
            t1 = clock()
            STAGE.add("build a chunk's rows", t1 - t0)
            try:
                payload = pickle.dumps((grade, rows, timeout_s, may_defer, verifier), protocol=5)
            except Exception as exc:  # a verifier that cannot be pickled cannot go to a worker
                jobs.finish(job, failed_rows(len(rows), f"scoring worker failed: {exc}", exc))
                continue
            t2 = clock()
            STAGE.add("pickle a chunk", t2 - t1)
            try:
                w.conn.send((job, payload))
                STAGE.add("send a chunk", clock() - t2)
                STAGE.mark("first chunk out")
            except OSError:
                jobs.todo.append(job)
                if w.jobs:  # it died mid-job: that surfaces, and is handled, on its next read
                    return
                w = self._replace(w)  # it died while idle
                continue
            w.jobs.append(job)

    def _replace(self, w: _Worker, warm: bool = True) -> _Worker:
        """A new worker for `w`; `warm=False`: a started one, which imports the files as they
        are now (the warm zygote holds the code it imported when it booted)."""
        w.close(kill=True)
        self._procs.remove(w)
        fresh = _Worker(self._preload, self._broker, self._warm_zygote if warm else None)
        self._procs.append(fresh)
        return fresh

    def close(self, kill: bool = False) -> None:
        """Stop the workers (closing a worker's channel ends its loop); returns at once."""
        with self._lock:
            procs, self._procs = self._procs, []
            broker, self._broker = self._broker, ZygoteBroker()
            # the next start boots a fresh warm zygote: it imports the files as they are then
            self._warm_boot, self._warm_zygote = None, None
        for w in procs:
            w.close(kill=kill)
        # ends the shared zygotes and so every helper forked from them (the workers' pools
        # see their zygote gone and would boot their own, but they are exiting too), and the
        # warm zygote, whose workers die with it
        broker.close()

    def pids(self) -> list[int]:
        """The workers' process ids (for tests and diagnostics)."""
        return [w.proc.pid for w in self._procs]
