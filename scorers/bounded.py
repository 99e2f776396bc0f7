"""A small pool of killable worker processes for work that has no time bound of its own.

Python signals and threads cannot interrupt a long big-integer or sympy operation; killing a
process can. Each call goes to an idle worker over a pipe; when the answer does not arrive by
the deadline the worker is killed and a replacement is launched at once. Workers are forked
from a multiprocessing 'forkserver' that has already imported the heavy modules, so a
replacement is ready in tens of milliseconds rather than the seconds a cold sympy import takes.
As with any non-fork multiprocessing start method, a script that calls into the pool at import
time needs the usual `if __name__ == "__main__":` guard.

The pool is created lazily, is per process (a forked child gets its own), survives across
calls and is shut down at interpreter exit.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

# Memory cap per worker: a runaway expansion fails with MemoryError instead of swapping the host.
WORKER_MEMORY_BYTES = 2 * 1024**3
# Waiting for a worker to start is not charged to the call's deadline, but is bounded.
STARTUP_TIMEOUT_S = 60.0


class WorkerTimeout(TimeoutError):
    """The call did not finish within its deadline; its worker was killed and replaced."""


class WorkerFailed(RuntimeError):
    """The worker raised or died while running the call."""


class _Worker:
    def __init__(self, preload: Sequence[str]) -> None:
        ctx = mp.get_context("forkserver")
        # Only effective before the forkserver starts: it imports these once, and every worker
        # forked from it starts with them already loaded (tens of ms instead of seconds).
        # "__main__" too: otherwise every forked worker re-imports the caller's main module
        # (for an Inspect or Prefect process, seconds of imports) before it can serve.
        ctx.set_forkserver_preload(["__main__", *preload])
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_pipe, args=(child, tuple(preload)), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise WorkerFailed("verification worker did not start")
        status, payload = self.conn.recv()
        if status != "ready":
            raise WorkerFailed(f"verification worker failed to start: {payload}")
        self.ready = True

    def send(self, obj: Any) -> None:
        self.conn.send(obj)

    def recv(self) -> Any:
        return self.conn.recv()

    def readable(self, timeout: float) -> bool:
        return self.conn.poll(max(0.0, timeout))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class BoundedPool:
    """Run module-level functions in worker processes with a hard wall-clock deadline.

    Args:
        size: most workers alive at once; calls beyond that wait for an idle worker.
        preload: modules each worker imports before serving (so calls do not pay for them).
    """

    def __init__(self, size: int = 2, preload: Sequence[str] = ()) -> None:
        self.size = max(1, size)
        self.preload = tuple(preload)
        self._idle: list[_Worker] = []
        self._alive = 0
        self._cond = threading.Condition()
        self._closed = False
        self.kills = 0

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise WorkerFailed("pool is shut down")
                if self._idle:
                    worker = self._idle.pop()
                    break
                if self._alive < self.size:
                    self._alive += 1
                    worker = None
                    break
                self._cond.wait()
        try:
            worker = worker or _Worker(self.preload)
            worker.wait_ready()
            return worker
        except BaseException:
            self._release(None)
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None or self._closed:
                self._alive -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def warm(self) -> None:
        """Start one worker now so the first call does not wait for it."""
        self._release(self._acquire())

    def call(self, func: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """Run `func(*args)` in a worker; raise WorkerTimeout after `timeout_s` seconds."""
        worker = self._acquire()
        deadline = time.monotonic() + timeout_s
        try:
            worker.send((func.__module__, func.__qualname__, args))
            if not worker.readable(deadline - time.monotonic()):
                raise WorkerTimeout(f"no result within {timeout_s:g} s")
            status, payload = worker.recv()
        except WorkerTimeout:
            self._replace(worker)
            raise
        except (EOFError, OSError) as exc:
            self._replace(worker)
            raise WorkerFailed(f"worker died: {exc}") from exc
        self._release(worker)
        if status == "error":
            raise WorkerFailed(payload)
        return payload

    def _replace(self, worker: _Worker) -> None:
        self.kills += 1
        worker.kill()
        with self._cond:
            if self._closed:
                self._alive -= 1
                return
            # Launch the successor now; it finishes importing while the caller moves on.
            self._idle.append(_Worker(self.preload))
            self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            workers, self._idle = self._idle, []
            self._cond.notify_all()
        for w in workers:
            w.kill()


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


def _serve_pipe(conn: Connection, preload: Sequence[str]) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    try:
        for name in preload:
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            module, qualname, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            fn = getattr(importlib.import_module(module), qualname)
            conn.send(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the caller
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
