"""Processes on this machine: is one still the process we knew, and what does it run.

A pid alone does not name a process: the kernel reuses pids, so a pid recorded by a command that
was killed may belong to an unrelated process later. A pid with its start time (clock ticks since
boot, field 22 of /proc/<pid>/stat) does. Linux only: where /proc is missing, liveness falls back
to `kill(pid, 0)` and start times are unknown (None).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "ProcessId",
    "alive",
    "die_with_parent",
    "environ_of",
    "group_members",
    "kill_group",
    "parent_death_preexec",
    "start_ticks",
    "this_process",
    "wait_gone",
]

_PROC = Path("/proc")


class ProcessId:
    """A process as `host:pid:start_ticks` (the form stored in a flow run's label)."""

    __slots__ = ("host", "pid", "ticks")

    def __init__(self, host: str, pid: int, ticks: int | None) -> None:
        self.host, self.pid, self.ticks = host, pid, ticks

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.ticks if self.ticks is not None else ''}"

    @classmethod
    def parse(cls, text: str) -> ProcessId | None:
        host, _, rest = text.rpartition(":")
        host, _, pid = host.rpartition(":")
        try:
            return cls(host, int(pid), int(rest) if rest else None)
        except ValueError:
            return None

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether this very process still runs (a reused pid does not count)."""
        return alive(self.pid, self.ticks)


def this_process() -> ProcessId:
    return ProcessId(socket.gethostname(), os.getpid(), start_ticks(os.getpid()))


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if unknown or gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may itself contain spaces or ")"
    fields = stat[stat.rindex(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall; fields[0] here is field 3
    except (IndexError, ValueError):
        return None


def alive(pid: int, ticks: int | None = None) -> bool:
    """Whether `pid` runs (and, if `ticks` is given, is the process that started then).

    A zombie (exited, not yet reaped) does not count as running.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    try:
        state = (_PROC / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return not _PROC.is_dir()  # no /proc on this system: kill(0) is all we know
    except OSError:
        return True
    if state[state.rindex(")") + 2 :].startswith("Z"):
        return False
    return ticks is None or start_ticks(pid) == ticks


def environ_of(pid: int) -> dict[str, str] | None:
    """The environment `pid` started with (None: gone, or not ours to read)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def group_members(pgid: int) -> list[int]:
    """The pids of the live processes in process group `pgid` (Linux; [] elsewhere)."""
    members = []
    for stat in _PROC.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal every process of group `pgid`; a group already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(pid: int, timeout_s: float, ticks: int | None = None) -> bool:
    """Wait until `pid` has exited (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while alive(pid, ticks):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """Linux: have the kernel send `sig` to this process when its parent exits.

    The kernel ties this to the parent *thread* that started us: use it only where the parent
    started this process from a thread that lives as long as the parent (its main thread). If
    `parent` is given and is no longer our parent (it exited before this call), the signal is
    sent now.

    Returns:
        Whether the request took effect (False off Linux).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(1, int(sig)) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return ok


def parent_death_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `subprocess.Popen(preexec_fn=...)` that makes the child get `sig` when its parent
    exits, or None where that is not possible (not Linux, or not the main thread: the kernel
    sends the signal when the thread that started the child ends).

    Everything it calls is resolved here, in the parent: between fork and exec the child must
    not import (another thread may hold the import lock).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    number = int(sig)

    def preexec() -> None:
        prctl(1, number)  # PR_SET_PDEATHSIG

    return preexec
