"""A small pool of killable worker processes for work that has no time bound of its own.

Python signals and threads cannot interrupt a long big-integer or sympy operation; killing a
process can. Each call goes to an idle worker over a pipe; when the answer does not arrive by
the deadline the worker is killed.

Workers are forked from a "zygote" (scorers.workers.zygote): a fresh interpreter that imports the heavy
modules once and then only forks; one per pool, or one shared by the processes of a stage when
their parent runs a broker. A new worker is therefore ready in tens of milliseconds, and
what it costs does not depend on the caller: multiprocessing's forkserver/spawn re-import the
caller's `__main__` in every child (for an Inspect or Prefect process, seconds of imports), and
plain fork copies a multi-threaded caller, which is unsafe.

The deadline covers the whole call: waiting for a free worker counts against it, and when none
is free in time the call times out like a slow one. So that a kill does not leave the next call
waiting for a replacement, the pool keeps a spare worker started ahead of need: whenever a call
takes an idle worker, a new one is launched in the background, so it has a whole call's
duration to become ready. Only the very first start of a pool in a process (the zygote
importing sympy, about a second, once) is outside any deadline; `warm()` does it ahead of time.

The pool is created lazily, is per process, survives across calls and is shut down at exit.
A forked child (multiprocessing's "fork", a ProcessPoolExecutor) gets its own pool, whose
workers come from the parent's zygote over a private channel handed over at the fork: the
child's first call waits a fork, not a zygote boot. Nothing of the parent's pool is used in
the child (its pipes are the parent's), and locks a parent thread held at the fork are fresh.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scorers.identity.loaded_code import note_helper_sources
from scorers.workers.zygote import (
    STARTUP_TIMEOUT_S,
    ForkedProcess,
    RemoteZygote,
    Zygote,
    ZygoteFailed,
    broker_zygote,
)

__all__ = [
    "STARTUP_TIMEOUT_S",
    "BoundedPool",
    "PoolStats",
    "WorkerFailed",
    "WorkerTimeout",
    "shared_pool",
]


class WorkerTimeout(TimeoutError):
    """The call did not finish within its deadline (its worker, if it had one, was killed)."""


class WorkerFailed(RuntimeError):
    """The worker raised or died while running the call, or workers cannot be started."""


class _Worker:
    def __init__(self, zygote: Zygote | RemoteZygote) -> None:
        self.pid, self.conn = zygote.fork()
        self.proc = ForkedProcess(self.pid)

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise WorkerFailed(f"verification worker did not start within {timeout:g} s")
        status, payload = self.conn.recv()
        if status != "ready":
            raise WorkerFailed(f"verification worker failed to start: {payload}")

    def kill(self) -> None:
        """SIGKILL now; the zygote (its parent) reaps it, so the caller never waits."""
        try:
            self.proc.kill()
        finally:
            self.proc.close()
            self.conn.close()


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool: workers idle and ready, busy with a call, and still starting."""

    idle: int
    busy: int
    starting: int
    kills: int
    idle_pids: tuple[int, ...]


class BoundedPool:
    """Run module-level functions in worker processes with a hard wall-clock deadline.

    Args:
        size: most calls running at once; further calls wait (charged to their deadline).
        preload: modules each worker imports before serving (so calls do not pay for them).
        spares: idle workers kept started ahead of need, so a kill is replaced at once.
    """

    def __init__(self, size: int = 2, preload: Sequence[str] = (), spares: int = 1) -> None:
        self.size = max(1, size)
        self.spares = max(0, spares)
        self.preload = tuple(preload)
        self._idle: list[_Worker] = []
        self._busy = 0
        self._starting = 0
        self._booted = False
        self._start_error: str | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._zygote: Zygote | RemoteZygote | None = None
        self._zygote_lock = threading.Lock()
        self._fork_offer: socket.socket | None = None  # a zygote channel for a child being forked
        self.kills = 0

    # -- worker supply ----------------------------------------------------------------------
    def _top_up_locked(self) -> None:
        """Launch workers until `spares` are idle or starting, within size + spares in total."""
        if self._closed:
            return
        cap = self.size + self.spares
        want = max(self.spares, 1) - len(self._idle) - self._starting
        room = cap - len(self._idle) - self._starting - self._busy
        for _ in range(max(0, min(want, room))):
            self._starting += 1
            threading.Thread(target=self._launch, daemon=True, name="bounded-pool-launch").start()

    def _get_zygote(self) -> Zygote | RemoteZygote:
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive():
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = None
                if self._closed:
                    raise WorkerFailed("pool is shut down")
                # A zygote shared by the processes of one stage when its parent offers one
                # (scorers.workers.zygote); otherwise this pool boots its own.
                self._zygote = broker_zygote(self.preload) or Zygote(self.preload)
                # its workers run part of the caller's code: what it compiled counts in the
                # caller's fingerprint of that code (scorers.identity.loaded_code)
                note_helper_sources(self._zygote.sources)
            return self._zygote

    def _launch(self) -> None:
        worker: _Worker | None = None
        try:
            worker = _Worker(self._get_zygote())
            worker.wait_ready(STARTUP_TIMEOUT_S)
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting caller
            if worker is not None:
                worker.kill()
            with self._cond:
                self._starting -= 1
                self._start_error = str(exc) or type(exc).__name__
                self._cond.notify_all()
            return
        with self._cond:
            self._starting -= 1
            if self._closed:
                worker.kill()
                return
            self._start_error = None
            self._booted = True
            self._idle.append(worker)
            self._cond.notify_all()

    def _acquire(self, deadline: float) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise WorkerFailed("pool is shut down")
                if self._idle and self._busy < self.size:
                    worker = self._idle.pop()
                    if worker.conn.poll(0):
                        # An idle worker never has anything to say: this one's pipe reads EOF,
                        # it died (its zygote was killed, the OOM killer...). Skip it.
                        worker.kill()
                        self._top_up_locked()
                        continue
                    self._busy += 1
                    # The spare that replaces this one starts now, while the call runs.
                    self._top_up_locked()
                    return worker
                if self._start_error is not None and not self._starting and not self._idle:
                    # Report a broken start once instead of relaunching in a loop; the next
                    # call tries again.
                    error, self._start_error = self._start_error, None
                    raise WorkerFailed(error)
                self._top_up_locked()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerTimeout("no verification worker became free before the deadline")
                self._cond.wait(remaining)

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            self._busy -= 1
            if self._closed:
                worker.kill()
            else:
                self._idle.append(worker)
            self._cond.notify_all()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            self.kills += 1
            self._busy -= 1
            self._top_up_locked()
            self._cond.notify_all()

    # -- public -----------------------------------------------------------------------------
    @property
    def booted(self) -> bool:
        """Whether a worker has started (a call no longer waits for the first boot)."""
        return self._booted

    def boot_in_background(self) -> None:
        """Start booting the pool if it has not started yet; returns at once."""
        with self._cond:
            self._top_up_locked()

    def warm(self) -> None:
        """Boot the pool now: start its workers and wait until the first is ready.

        Once the pool has booted this only tops up the spare and returns at once.

        Raises:
            WorkerFailed: a worker could not be started within STARTUP_TIMEOUT_S.
        """
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with self._cond:
            self._top_up_locked()
            while not self._booted:
                if self._closed:
                    raise WorkerFailed("pool is shut down")
                if self._start_error is not None and not self._starting:
                    error, self._start_error = self._start_error, None
                    raise WorkerFailed(error)
                self._top_up_locked()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerFailed("verification worker did not start")
                self._cond.wait(remaining)

    def call(self, func: Callable[..., Any] | str, *args: Any, timeout_s: float) -> Any:
        """Run `func(*args)` in a worker; raise WorkerTimeout once `timeout_s` has passed.

        The time spent waiting for a free worker is part of `timeout_s`. The first call in a
        process boots the pool first (see the module docstring), outside the deadline.

        Args:
            func: a module-level function, or its "module:qualname" (then the caller never
                imports the module itself, which for sympy saves seconds and memory).
            args: picklable arguments.
            timeout_s: wall-clock limit for waiting for a worker plus running the call.
        """
        if isinstance(func, str):
            module, _, qualname = func.partition(":")
        else:
            module, qualname = func.__module__, func.__qualname__
        if not self._booted:
            self.warm()
        deadline = time.monotonic() + timeout_s
        worker = self._acquire(deadline)
        try:
            worker.conn.send((module, qualname, args))
            if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                raise WorkerTimeout(f"no result within {timeout_s:g} s")
            status, payload = worker.conn.recv()
        except WorkerTimeout:
            self._discard(worker)
            raise
        except (EOFError, OSError) as exc:
            self._discard(worker)
            raise WorkerFailed(f"worker died: {exc}") from exc
        except BaseException:
            # Interrupted mid-call (KeyboardInterrupt...): the worker's state is unknown.
            self._discard(worker)
            raise
        self._release(worker)
        if status == "error":
            raise WorkerFailed(payload)
        return payload

    # -- fork ---------------------------------------------------------------------------------
    def _offer_to_child(self) -> None:
        """Before a fork (in the forking thread): a private channel to this pool's zygote for
        the child. Never waits long: a zygote still booting or busy is simply not offered."""
        self._fork_offer = None
        if self._closed or not self._zygote_lock.acquire(blocking=False):
            return
        try:
            zygote = self._zygote
        finally:
            self._zygote_lock.release()
        if isinstance(zygote, Zygote) and zygote.ready and zygote.alive():
            try:
                self._fork_offer = zygote.client_channel(wait_s=1.0)
            except ZygoteFailed:
                pass

    def _withdraw_offer(self) -> None:
        """After a fork, in the parent: the child holds its copy of the channel now."""
        if self._fork_offer is not None:
            self._fork_offer.close()
            self._fork_offer = None

    def _inherit_in_child(self) -> BoundedPool:
        """After a fork, in the child: retire this copy of the parent's pool and return the
        child's own, forking its workers from the parent's zygote when one was offered.

        Only descriptors are closed here, never a process signalled: the workers and the zygote
        belong to the parent."""
        self._closed = True
        for worker in self._idle:
            worker.conn.close()
            worker.proc.close()
        self._idle = []
        if self._zygote is not None:
            self._zygote.drop_in_child()
            self._zygote = None
        child = BoundedPool(self.size, self.preload, self.spares)
        offer, self._fork_offer = self._fork_offer, None
        if offer is not None:
            child._zygote = RemoteZygote(offer)
        return child

    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(
                idle=len(self._idle),
                busy=self._busy,
                starting=self._starting,
                kills=self.kills,
                idle_pids=tuple(w.pid or 0 for w in self._idle),
            )

    def wait_spares(self, timeout: float = STARTUP_TIMEOUT_S) -> bool:
        """Block until no worker is still starting and one is idle (or `timeout`); True if so."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._starting or not self._idle:
                self._top_up_locked()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._cond.wait(remaining)
            return True

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            workers, self._idle = self._idle, []
            self._cond.notify_all()
        for w in workers:
            w.kill()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


_POOLS: dict[tuple[int, tuple[str, ...]], BoundedPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(preload: Sequence[str], size: int | None = None) -> BoundedPool:
    """The process-wide pool for these preload modules (one per PID, so forks get their own)."""
    key = (os.getpid(), tuple(preload))
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = BoundedPool(size or min(2, os.cpu_count() or 1), preload)
            _POOLS[key] = pool
            if len(_POOLS) == 1:
                atexit.register(_shutdown_all)
        return pool


def _shutdown_all() -> None:
    for key, pool in list(_POOLS.items()):
        if key[0] == os.getpid():
            pool.shutdown()


_FORKING_PID = 0  # the pid that called fork(): the child's parent, even if it dies meanwhile


def _before_fork() -> None:
    global _FORKING_PID
    _POOLS_LOCK.acquire()  # released after the fork on both sides: no half-registered pool
    _FORKING_PID = os.getpid()
    for (pid, _), pool in _POOLS.items():
        if pid == os.getpid():
            pool._offer_to_child()


def _after_fork_in_parent() -> None:
    for (pid, _), pool in _POOLS.items():
        if pid == os.getpid():
            pool._withdraw_offer()
    _POOLS_LOCK.release()


def _after_fork_in_child() -> None:
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    for (pid, preload), pool in list(_POOLS.items()):
        if pid == _FORKING_PID and not pool._closed:
            _POOLS[(os.getpid(), preload)] = pool._inherit_in_child()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
