"""Which commands use a local Prefect server now, and which checkouts used it lately.

A command that runs flows against gradebook's local server holds a *lease* in the server's home
for as long as it uses it (a flow-running command for its run, `gradebook serve` for its whole
life, `gradebook server start` only while it starts one): `users/<pid>-<start ticks>.json`,
naming the checkout, virtualenv and command, with an exclusive `flock` on it. The kernel drops
the lock when the process ends, however it ends, so a lease whose lock another process can take
is stale (its holder is gone, kill -9 included) and whoever finds it removes it. A server with a
live lease is never stopped by another command (flows.runtime.background_server).

The lease's descriptor is close-on-exec (a process the command execs, such as the detached
server's launcher, never holds it) and is closed in forked children (`os.register_at_fork`), so
a grading worker that outlives its command for a moment does not keep the lease alive. Closing,
not unlocking: an flock belongs to the open file, which the parent still holds.

Each checkout's latest use is kept in `users/recent/`, so `gradebook server status` can say who
used a server lately.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flows.runtime.procs import alive, this_process
from flows.runtime.server import PrefectServerError

__all__ = ["Lease", "checkout_root", "holding", "live_leases", "recent_users"]

_USERS = "users"
_RECENT = "recent"
_STALE_TMP_S = 60.0  # a half-written lease older than this lost its writer
RECENT_LIMIT = 5


def checkout_root() -> Path:
    """The directory the running `flows` package comes from (a clone, or site-packages)."""
    return Path(__file__).resolve().parents[2]


def _command() -> str:
    # argv[0] is the console script, `-m`'s module path or `-c`: the words after it are the
    # command a user typed
    return shlex.join(["gradebook", *sys.argv[1:]])


@dataclass(frozen=True)
class Lease:
    """A process that uses a local server: who, from where, since when.

    Attributes:
        pid: its process id; ticks: when it started (`flows.runtime.procs.start_ticks`).
        host: the machine it runs on.
        checkout: the directory its `flows` package comes from.
        venv: its `sys.prefix`.
        command: the gradebook command it runs.
        started_at: when it took the lease (seconds since the epoch).
    """

    pid: int
    ticks: int | None
    host: str
    checkout: str
    venv: str
    command: str
    started_at: float

    @classmethod
    def of_this_process(cls) -> Lease:
        me = this_process()
        return cls(
            pid=me.pid,
            ticks=me.ticks,
            host=me.host,
            checkout=str(checkout_root()),
            venv=sys.prefix,
            command=_command(),
            started_at=time.time(),
        )

    @property
    def file_name(self) -> str:
        return f"{self.pid}-{self.ticks if self.ticks is not None else 0}.json"

    def describe(self) -> dict[str, Any]:
        return asdict(self)


# -- holding one -----------------------------------------------------------------------------


@dataclass
class _Held:
    lease: Lease
    path: Path
    fd: int
    count: int = 0


_held: dict[Path, _Held] = {}
_mutex = threading.Lock()


@contextmanager
def holding(home: Path) -> Iterator[Lease]:
    """Hold this process's lease on `home`'s server inside the block (nested blocks share it)."""
    with _mutex:
        held = _held.get(home)
        if held is None:
            try:
                held = _held[home] = _take(home)
            except OSError as exc:
                raise PrefectServerError(
                    f"cannot record this command's use of the local Prefect server in "
                    f"{home / _USERS}: {exc.strerror or exc}; make that directory writable, or "
                    "set GRADEBOOK_PREFECT_HOME to a directory of your own"
                ) from None
        held.count += 1
    try:
        yield held.lease
    finally:
        with _mutex:
            held.count -= 1
            if held.count == 0 and _held.get(home) is held:
                del _held[home]
                _release(held)


def _take(home: Path) -> _Held:
    users = home / _USERS
    users.mkdir(parents=True, exist_ok=True)
    lease = Lease.of_this_process()
    path = users / lease.file_name
    tmp = users / f".{lease.file_name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        # locked and complete before it has its name: a reader never sees an unlocked lease
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(lease.describe()).encode())
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    _note_recent(home, lease)
    return _Held(lease, path, fd)


def _release(held: _Held) -> None:
    held.path.unlink(missing_ok=True)
    os.close(held.fd)  # the kernel drops the lock with the last descriptor of the open file


def _forget_in_child() -> None:
    # A forked child has the parent's descriptors: close them (never LOCK_UN, which would
    # drop the parent's lock too). The mutex may have been held by another thread at the fork.
    global _mutex
    for held in list(_held.values()):
        try:
            os.close(held.fd)
        except OSError:
            pass
    _held.clear()
    _mutex = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


# -- reading them ----------------------------------------------------------------------------


def live_leases(home: Path, *, include_own: bool = False) -> list[Lease]:
    """The leases on `home`'s server whose holders run now, oldest first; stale ones are removed.

    Args:
        include_own: also this process's own lease (by default, the others': a command asks
            whether anyone else uses the server).
    """
    users = home / _USERS
    try:
        entries = list(os.scandir(users))
    except OSError:
        return []
    held = _held.get(home)
    own = held.path.name if held is not None and not include_own else None
    found = []
    for entry in entries:
        if entry.name.startswith(".") and entry.name.endswith(".tmp"):
            _remove_stale_tmp(Path(entry.path))
            continue
        if not entry.name.endswith(".json") or entry.name == own:
            continue
        lease = _live(Path(entry.path))
        if lease is not None:
            found.append(lease)
    return sorted(found, key=lambda lease: lease.started_at)


def _live(path: Path) -> Lease | None:
    """The lease at `path` if its holder runs; else None, and a stale file is removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = False  # we got it: nobody holds it
        except BlockingIOError:
            locked = True
        lease = _parse(_read_fd(fd))
        # A lock without its process: another reader holds it for a moment, or a child forked
        # past os.register_at_fork (C code) outlived the holder. The pid says which.
        gone = lease is not None and lease.host == socket.gethostname()
        gone = gone and not alive(lease.pid, lease.ticks)
        if not locked or gone or lease is None:
            if not locked or gone:
                path.unlink(missing_ok=True)
            return None
        return lease
    finally:
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> Lease | None:
    try:
        data = json.loads(raw)
        return Lease(
            pid=int(data["pid"]),
            ticks=data.get("ticks"),
            host=str(data.get("host", "")),
            checkout=str(data.get("checkout", "?")),
            venv=str(data.get("venv", "?")),
            command=str(data.get("command", "?")),
            started_at=float(data.get("started_at", 0.0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _remove_stale_tmp(path: Path) -> None:
    try:
        if time.time() - path.stat().st_mtime > _STALE_TMP_S:
            path.unlink(missing_ok=True)
    except OSError:
        pass


# -- who used it lately ----------------------------------------------------------------------


def _note_recent(home: Path, lease: Lease) -> None:
    recent = home / _USERS / _RECENT
    try:
        recent.mkdir(exist_ok=True)
        name = hashlib.sha256(f"{lease.checkout}\0{lease.venv}".encode()).hexdigest()[:16]
        tmp = recent / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(lease.describe()))
        os.replace(tmp, recent / f"{name}.json")
    except OSError:
        pass  # who used it lately is a courtesy of `server status`: never fail a command for it


def recent_users(home: Path, limit: int = RECENT_LIMIT) -> list[Lease]:
    """The last use of each checkout (and virtualenv) that used `home`'s server, newest first."""
    found = []
    for path in (home / _USERS / _RECENT).glob("*.json"):
        try:
            lease = _parse(path.read_bytes())
        except OSError:
            continue
        if lease is not None:
            found.append(lease)
    return sorted(found, key=lambda lease: lease.started_at, reverse=True)[:limit]
