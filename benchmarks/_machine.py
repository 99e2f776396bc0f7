"""How busy the machine is, read from /proc: the load average and the busiest processes that
are not this benchmark's.

    state = machine_state()   # {"load": [1, 5, 15 min], "busy": [{pid, cpu_pct, command}...]}

A figure measured beside a test suite or a second benchmark is not a quiet machine's figure:
each round of a benchmark records this at its start, and a row taken on a busy machine says so
(`load_note`). Before the benchmark has run anything, the 1-minute load tells (at or above
QUIET_LOAD: busy); between its rounds, that load still holds the benchmark's own work of the
seconds before, so there only other processes' CPU tells (BUSY_OTHERS_PCT of a core or more).

"This benchmark's" processes are this process's descendants, and processes whose environment
names this benchmark's PREFECT_HOME (the local Prefect server it starts detaches from it).
Linux only; elsewhere the state is empty.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

_PROC = Path("/proc")
QUIET_LOAD = 0.5  # a 1-minute load average at or above this at the start: not a quiet machine
TOP = 5  # how many busy processes a state lists
MIN_CPU_PCT = 5.0  # processes below this share of one core over the sample are left out
BUSY_OTHERS_PCT = 20.0  # other processes using this much of one core in all: not quiet


def _stat(pid: str) -> tuple[int, int, str] | None:
    """(parent pid, utime + stime in clock ticks, command name), None for a process gone."""
    try:
        raw = (_PROC / pid / "stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    name = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode(errors="replace")
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), name


def _snapshot() -> dict[str, tuple[int, int, str]]:
    out = {}
    for pid in os.listdir(_PROC):
        if pid.isdigit() and (st := _stat(pid)) is not None:
            out[pid] = st
    return out


def _ours(snap: dict[str, tuple[int, int, str]]) -> set[str]:
    """This process, its descendants, and processes started with this run's PREFECT_HOME."""
    me = str(os.getpid())
    children: dict[int, list[str]] = {}
    for pid, (ppid, _, _) in snap.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = {me}, [me]
    while todo:
        for child in children.get(int(todo.pop()), ()):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    home = os.environ.get("PREFECT_HOME")
    if home:
        marker = f"PREFECT_HOME={home}".encode()
        for pid in snap:
            try:
                if marker in (_PROC / pid / "environ").read_bytes().split(b"\0"):
                    ours.add(pid)
            except OSError:  # another user's process, or gone
                continue
    return ours


def _command(pid: str, name: str) -> str:
    try:
        argv = (_PROC / pid / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return name
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return " ".join((text or name).split())[:100]  # one line: a `python -c` program has several


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages (empty where /proc has none)."""
    try:
        return [float(x) for x in (_PROC / "loadavg").read_text().split()[:3]]
    except OSError:
        return []


def machine_state(sample_s: float = 1.0) -> dict[str, Any]:
    """The load average now, and the busiest other processes over the next `sample_s`."""
    load = load_average()
    if not load:
        return {"load": [], "busy": []}
    before = _snapshot()
    time.sleep(sample_s)
    after = _snapshot()
    ours = _ours(after)
    tick = os.sysconf("SC_CLK_TCK")
    busy = []
    for pid, (_, cpu, name) in after.items():
        if pid in ours or pid not in before:
            continue
        pct = 100.0 * (cpu - before[pid][1]) / tick / sample_s
        if pct >= MIN_CPU_PCT:
            busy.append({"pid": int(pid), "cpu_pct": round(pct, 1), "command": _command(pid, name)})
    busy.sort(key=lambda p: -p["cpu_pct"])
    return {"load": load, "busy": busy[:TOP]}


def load_note(states: list[dict[str, Any]], *, by_load: bool = True) -> str | None:
    """What a row measured over these rounds' starts must say when the machine was not quiet
    (None when it was). `by_load`: the 1-minute load judges too (a state taken before the
    benchmark ran anything); else only other processes' CPU does (between its own rounds)."""
    loads = [s["load"][0] for s in states if s.get("load")]
    others = [sum(p["cpu_pct"] for p in s.get("busy", ())) for s in states]
    loaded = by_load and bool(loads) and max(loads) >= QUIET_LOAD
    if not loaded and (not others or max(others) < BUSY_OTHERS_PCT):
        return None
    busiest = next((s["busy"][0] for s in states if s.get("busy")), None)
    beside = f"; busiest other process: {busiest['command'][:60]}" if busiest else ""
    why = (
        f"load {', '.join(f'{x:.2f}' for x in loads)} at the rounds' start (quiet: < {QUIET_LOAD})"
        if loaded
        else f"other processes used {', '.join(f'{x:.0f}' for x in others)} % of a core at the "
        f"rounds' start (quiet: < {BUSY_OTHERS_PCT:.0f} %)"
    )
    return f"not a quiet machine: {why}{beside}"
