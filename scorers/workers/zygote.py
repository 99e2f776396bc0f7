"""Zygotes: fresh interpreters that import heavy modules once, then fork ready workers on request.

A zygote makes a new worker cost a fork instead of an interpreter start plus imports (sympy:
seconds of CPU). `scorers.workers.bounded` forks its killable workers from one.

Several processes can share one zygote. The scoring stage runs a few grading processes; if each
booted its own sympy zygote, a 2-core machine would spend seconds of CPU importing sympy once per
process. Instead the stage's parent runs a `ZygoteBroker`: it hands each child a channel (a
socket passed at spawn); the child's pools ask the broker for a zygote, the broker boots at most
one per set of preload modules and passes back a private channel to it (file descriptors over
SCM_RIGHTS), and from then on the child forks its workers straight from the shared zygote and
talks to them directly, without the broker in the path.

A zygote can also fork a process that runs an entry point of its own (`Zygote.fork(entry=...)`):
the scoring stage forks its Inspect-scorer grading workers from one zygote that has imported
Inspect and run its start-up hooks, so that cost is paid once per stage, not once per worker. A
preload entry (module, function, args) is a warm-up: the function is called once there. Such a fork is refused
unless the zygote is still single-threaded (a child forked from a threaded process can inherit a
lock held by a thread that does not exist in it); zygotes start with the native thread pools that
imports would start (OpenBLAS, pyarrow's jemalloc) turned off.

Lifetimes: a zygote exits when its owner's control channel closes (the broker closing, or the
owner process dying), and its workers are SIGKILLed with it (PR_SET_PDEATHSIG). A worker whose
client goes away reads EOF on its pipe and exits. A child whose broker is gone falls back to
booting its own zygote (`scorers.workers.bounded`), so sharing is an optimisation, never a dependency.
"""

from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from pathlib import Path
from typing import Any

from scorers.identity import loaded_code

__all__ = [
    "STARTUP_TIMEOUT_S",
    "ForkedProcess",
    "WORKER_MEMORY_BYTES",
    "RemoteZygote",
    "Zygote",
    "ZygoteBroker",
    "ZygoteFailed",
    "broker_zygote",
    "reap_later",
    "use_broker",
]

# Memory cap per worker: a runaway expansion fails with MemoryError instead of swapping the host.
WORKER_MEMORY_BYTES = 2 * 1024**3
# A zygote boot (its imports) and a fork are bounded by this, not by any call's deadline.
STARTUP_TIMEOUT_S = 60.0
_ROOT = str(Path(__file__).resolve().parents[2])
# Native thread pools that numpy and pyarrow (imported by Inspect's start-up hooks, through
# installed packages' registries) would start at import: a zygote must stay single-threaded.
_SINGLE_THREADED_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}


class ZygoteFailed(RuntimeError):
    """A zygote could not be started, reached or asked to fork."""


class _Channel:
    """One end of a Unix socket used both for pickled messages and for passing descriptors."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = Connection(os.dup(sock.fileno()))

    def close(self) -> None:
        self.conn.close()
        self.sock.close()

    def hang_up(self) -> None:
        """End the conversation from another thread: the reader there sees EOF and closes."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _ask_fork(
    chan: _Channel, lock: threading.Lock, entry: str | None = None
) -> tuple[int, Connection]:
    """Ask a zygote for a worker over `chan`: its pid and the parent end of its pipe.
    `entry` ("module:function"): the worker runs that with its end of the pipe."""
    with lock:
        try:
            chan.conn.send("fork" if entry is None else ("fork", entry))
            if not chan.conn.poll(STARTUP_TIMEOUT_S):
                raise ZygoteFailed("verification zygote stopped answering")
            status, payload = chan.conn.recv()
            if status != "forked":
                raise ZygoteFailed(f"verification zygote could not fork: {payload}")
            fd = recv_handle(chan.sock)
        except (EOFError, OSError) as exc:
            raise ZygoteFailed(f"verification zygote is gone: {exc or 'EOF'}") from exc
    return payload, Connection(fd)


class Zygote:
    """A zygote this process started and owns (closing it ends the zygote and its workers)."""

    def __init__(self, preload: Sequence[str], *, wait: bool = True) -> None:
        """Start the zygote and (unless `wait` is False: then call `wait_ready()`) wait until
        it has imported `preload`."""
        ours, theirs = socket.socketpair()
        # recording what it compiles from its first import: its workers run part of a
        # verifier, and the verifier's fingerprint must be of that code (scorers.identity.loaded_code).
        # SIGINT ignored from the first statement: a Ctrl-C reaches the whole terminal process
        # group, and it is the owner's to handle (closing the channel ends the zygote)
        code = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" \
            f"import sys; sys.path.insert(0, {_ROOT!r})\n{loaded_code.boot_code()}" \
            f"import scorers.workers.zygote as z; z.zygote_main({theirs.fileno()})"  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env={**os.environ, **_SINGLE_THREADED_ENV},
        )
        theirs.close()
        self._chan = _Channel(ours)
        self._lock = threading.Lock()
        self.ready = False
        # what the zygote compiled (`loaded_code.own_sources()`), known once it is ready
        self.sources: dict[str, Any] = {}
        self._chan.conn.send((list(sys.path), tuple(preload), WORKER_MEMORY_BYTES))
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the zygote has imported its preload modules.

        Raises:
            ZygoteFailed: it did not start in time, died, or an import failed.
        """
        if not self._chan.conn.poll(STARTUP_TIMEOUT_S):
            self.close()
            raise ZygoteFailed(f"verification zygote did not start within {STARTUP_TIMEOUT_S:g} s")
        try:
            status, payload = self._chan.conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise ZygoteFailed(f"verification zygote died while starting: {exc}") from exc
        if status != "ready":
            self.close()
            raise ZygoteFailed(f"verification worker failed to start: {payload}")
        self.sources = payload or {}
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, entry: str | None = None) -> tuple[int, Connection]:
        """A new worker: its pid and the parent end of its pipe. By default the worker serves
        function calls (`scorers.workers.bounded`); with `entry` ("module:function"), it calls
        that function with its end of the pipe instead, and exits when it returns.

        Raises:
            ZygoteFailed: the zygote is gone, or (with `entry`) no longer single-threaded.
        """
        return _ask_fork(self._chan, self._lock, entry)

    def client_channel(self, wait_s: float | None = None) -> socket.socket:
        """A private channel to this zygote for another process (see `RemoteZygote`).

        Args:
            wait_s: longest wait for a fork request in progress on the owner channel (None:
                no limit); ZygoteFailed when it is still busy then.
        """
        if not self._lock.acquire(timeout=-1 if wait_s is None else wait_s):
            raise ZygoteFailed("verification zygote is busy")
        ours, theirs = socket.socketpair()
        try:
            self._chan.conn.send("client")
            send_handle(self._chan.sock, theirs.fileno(), self.proc.pid)
        except OSError as exc:
            ours.close()
            raise ZygoteFailed(f"verification zygote is gone: {exc}") from exc
        finally:
            theirs.close()
            self._lock.release()
        return ours

    def drop_in_child(self) -> None:
        """In a forked child: close this process's copy of the owner channel, and nothing else
        (the zygote belongs to the parent; a copy left open would keep it alive after the
        parent is gone)."""
        self._chan.close()

    def close(self) -> None:
        """Closing its channel makes the zygote exit, and its workers die with it."""
        self._chan.close()
        reap_later(self.proc, grace_s=5)


class ForkedProcess:
    """A process a zygote forked: the zygote's child, not ours (the zygote reaps it). It is
    handled through a pidfd, which names this very process, so a signal never reaches a
    recycled pid; where there is none, through its pid. Has what `reap_later` needs of a
    `subprocess.Popen`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._gone = False
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            self._fd, self._gone = None, True
        except (AttributeError, OSError):  # no pidfd here
            self._fd = None

    def poll(self) -> int | None:
        """None while it runs; its exit code is the zygote's to know, so -1 once it exited
        (or when there is no pidfd to tell)."""
        if self._fd is None:
            return -1
        ready, _, _ = select.select([self._fd], [], [], 0)
        return -1 if ready else None

    def wait(self, timeout: float | None = None) -> int:
        if self._fd is not None:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            self.close()
        return -1

    def kill(self) -> None:
        """SIGKILL now; the zygote reaps it, so the caller never waits."""
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            elif not self._gone:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass  # already gone

    def close(self) -> None:
        """Let go of the pidfd (the process is not signalled)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def reap_later(proc: subprocess.Popen, grace_s: float) -> None:
    """Wait for `proc` in a background thread, killing it after `grace_s`: a child told to
    exit (its channel closed) is never left a zombie, and the caller never waits for it."""

    def reap() -> None:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    threading.Thread(target=reap, daemon=True, name=f"reap-{proc.pid}").start()


class RemoteZygote:
    """A zygote owned by another process, reached over a channel it handed out."""

    def __init__(self, sock: socket.socket, sources: dict[str, Any] | None = None) -> None:
        self.sources = sources or {}  # what the zygote compiled (see Zygote.sources)
        self._chan = _Channel(sock)
        self._lock = threading.Lock()
        self._dead = False

    def alive(self) -> bool:
        return not self._dead

    def fork(self) -> tuple[int, Connection]:
        try:
            return _ask_fork(self._chan, self._lock)
        except ZygoteFailed:
            self._dead = True
            raise

    def close(self) -> None:
        self._dead = True
        self._chan.close()

    def drop_in_child(self) -> None:
        """In a forked child: close this process's copy of the channel (it is the parent's)."""
        self._dead = True
        self._chan.close()


# -- the zygote process --------------------------------------------------------------------------


def zygote_main(fd: int) -> None:
    """The zygote's loop: import the preload modules once, then fork a worker per request.

    Requests come on the owner's channel and on client channels the owner passes in.
    Single-threaded on purpose, so os.fork() is safe. Exits when the owner's channel closes.
    """
    owner = _Channel(socket.socket(fileno=fd))
    try:
        sys_path, preload, memory_bytes = owner.conn.recv()
        sys.path[:] = sys_path
        try:
            for name in preload:
                if isinstance(name, str):
                    importlib.import_module(name)
                else:  # (module, function, args): a warm-up
                    module, function, args = name
                    getattr(importlib.import_module(module), function)(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the owner, who reports it on
            owner.conn.send(("error", f"{type(exc).__name__}: {exc}"))
            return
        # What the preload built lives as long as the zygote and every worker it forks: their
        # collections need not walk it, and walking it would copy the pages the fork shares.
        gc.collect()
        gc.freeze()
        owner.conn.send(("ready", loaded_code.own_sources()))
    except (EOFError, OSError):
        return  # the owner went away while this zygote was starting: nobody to serve
    zygote_pid = os.getpid()
    clients: dict[Connection, _Channel] = {}
    # Workers forked for each client: they die with it. A client process that is SIGKILLed
    # mid-comparison closes its channel, and its worker, maybe stuck in hours of big-integer
    # work, must not outlive it (the owner's workers die with the zygote instead).
    forked: dict[_Channel, set[int]] = {}
    while True:
        for pid in _reap():
            for pids in forked.values():
                pids.discard(pid)
        ready = wait([owner.conn, *clients], timeout=0.5)
        for conn in ready:
            chan = owner if conn is owner.conn else clients[conn]  # type: ignore[index]
            try:
                request = chan.conn.recv()
                if request == "client" and chan is owner:
                    client = _Channel(socket.socket(fileno=recv_handle(owner.sock)))
                    clients[client.conn] = client
                elif request == "fork" or (isinstance(request, tuple) and request[0] == "fork"):
                    entry = request[1] if isinstance(request, tuple) else None
                    if entry is not None and (threads := _thread_count()) > 1:
                        chan.conn.send(("error", f"the zygote runs {threads} threads"))
                        continue
                    channels = [owner, *clients.values()]
                    pid = _fork_worker(chan, channels, zygote_pid, memory_bytes, entry)
                    if chan is not owner:
                        forked.setdefault(chan, set()).add(pid)
            except (EOFError, OSError):
                if chan is owner:
                    return
                clients.pop(chan.conn, None)
                for pid in forked.pop(chan, ()):
                    # not reaped yet, so the pid is still this zygote's child: never a stranger
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                chan.close()


def _thread_count() -> int:
    """This process's threads, native ones included (Linux); elsewhere Python's own."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _fork_worker(
    chan: _Channel,
    channels: list[_Channel],
    zygote_pid: int,
    memory_bytes: int,
    entry: str | None = None,
) -> int:
    parent_end, child_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            _die_with_parent(zygote_pid)
            for c in channels:
                c.close()
            parent_end.close()
            conn = Connection(child_end.detach())
            if entry is None:
                _serve_pipe(conn, memory_bytes)
            else:
                module, _, function = entry.partition(":")
                getattr(importlib.import_module(module), function)(conn)
        finally:
            os._exit(0)
    child_end.close()
    try:
        chan.conn.send(("forked", pid))
        send_handle(chan.sock, parent_end.fileno(), 0)
    finally:
        parent_end.close()
    return pid


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this worker when the zygote exits, even mid-computation."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere a worker still exits at its next read, when its pipe closes
    if os.getppid() != parent:  # the zygote died before prctl took effect
        os._exit(0)


def _reap() -> list[int]:
    """Reap every exited worker; the pids reaped."""
    reaped = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)


def _serve_pipe(conn: Connection, memory_bytes: int) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):
        pass
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


# -- sharing across processes --------------------------------------------------------------------


class ZygoteBroker:
    """Boots zygotes on behalf of child processes, at most one per set of preload modules.

    The owner calls `channel()` once per child and passes the socket to it (e.g. `pass_fds`);
    the child calls `use_broker(fd)`. `close()` ends every zygote the broker started.
    """

    def __init__(self) -> None:
        self._zygotes: dict[tuple[str, ...], Zygote] = {}
        self._boot_lock = threading.Lock()  # held through a boot: one zygote per preload
        self._state_lock = threading.Lock()  # never held long: close() must not wait a boot
        self._channels: list[_Channel] = []
        self._closed = False

    def channel(self) -> socket.socket:
        """A new channel for one child process; the caller sends it there and closes its copy."""
        ours, theirs = socket.socketpair()
        chan = _Channel(ours)
        self._channels.append(chan)
        threading.Thread(
            target=self._serve, args=(chan,), daemon=True, name="zygote-broker"
        ).start()
        return theirs

    def zygote(self, preload: Sequence[str]) -> Zygote:
        """The broker's zygote for `preload`, booted now if needed."""
        key = tuple(preload)
        with self._boot_lock:
            with self._state_lock:
                if self._closed:
                    raise ZygoteFailed("zygote broker is closed")
                zygote = self._zygotes.get(key)
                if zygote is not None and zygote.alive():
                    return zygote
                zygote = self._zygotes[key] = Zygote(key, wait=False)
            # outside the state lock: close() meanwhile kills it, and wait_ready raises
            zygote.wait_ready()
            return zygote

    def _serve(self, chan: _Channel) -> None:
        try:
            self._serve_requests(chan)
        finally:
            chan.close()

    def _serve_requests(self, chan: _Channel) -> None:
        while True:
            try:
                kind, preload = chan.conn.recv()
            except (EOFError, OSError):
                return
            try:
                zygote = self.zygote(preload)
                client = zygote.client_channel()
            except Exception as exc:  # noqa: BLE001 - the child falls back to its own zygote
                reply: tuple[str, Any] = ("error", f"{type(exc).__name__}: {exc}")
                client = None
            else:
                reply = ("ok", zygote.sources)
            try:
                chan.conn.send(reply)
                if client is not None:
                    send_handle(chan.sock, client.fileno(), 0)
            except OSError:
                return
            finally:
                if client is not None:
                    client.close()

    def close(self) -> None:
        """End every zygote this broker started, killing any still booting (never waits)."""
        with self._state_lock:
            self._closed = True
            zygotes, self._zygotes = list(self._zygotes.values()), {}
        for chan in self._channels:
            chan.hang_up()  # its serving thread closes it
        self._channels = []
        for zygote in zygotes:
            if zygote.ready:
                zygote.close()
            else:  # still importing: its boot thread sees it die, and closes it
                zygote.proc.kill()


_BROKER: tuple[int, _Channel] | None = None  # (pid, channel): a fork does not inherit it
_BROKER_LOCK = threading.Lock()


def _broker_after_fork_in_child() -> None:
    # The broker channel is the parent's (broker_zygote checks the pid); close this copy, and
    # replace a lock some parent thread may have held at the fork.
    global _BROKER, _BROKER_LOCK
    _BROKER_LOCK = threading.Lock()
    if _BROKER is not None:
        _BROKER[1].close()
        _BROKER = None


os.register_at_fork(after_in_child=_broker_after_fork_in_child)


def use_broker(fd: int) -> None:
    """Make this process's pools get their zygotes from the broker at the other end of `fd`."""
    global _BROKER
    with _BROKER_LOCK:
        _BROKER = (os.getpid(), _Channel(socket.socket(fileno=fd)))


def broker_zygote(preload: Sequence[str]) -> RemoteZygote | None:
    """A channel to the broker's zygote for `preload`, or None (no broker, or it failed)."""
    global _BROKER
    with _BROKER_LOCK:
        if _BROKER is None or _BROKER[0] != os.getpid():
            return None
        chan = _BROKER[1]
        try:
            chan.conn.send(("zygote", tuple(preload)))
            if not chan.conn.poll(STARTUP_TIMEOUT_S):
                return None
            status, sources = chan.conn.recv()
            if status != "ok":
                return None
            return RemoteZygote(socket.socket(fileno=recv_handle(chan.sock)), sources)
        except (EOFError, OSError):
            chan.close()
            _BROKER = None
            return None
