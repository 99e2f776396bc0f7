"""Peak resident memory of the processes a block of code starts, with this process, from /proc.

    with TreeRss() as rss:
        run_the_stage()
    rss.peak_bytes, rss.peak_sum_bytes, rss.processes, rss.peaks_by_label()

The tree is this process and every descendant that appears while the block runs (found by
parent pid, polled a few times a second; processes that were already descendants when the block
began, such as a server started earlier, are not counted). Two readings:

- `peak_bytes`: this process's own high-water mark (reset at the start through
  /proc/self/clear_refs, so what it held before does not count beyond what it still holds) plus
  each other process's own high-water mark (VmHWM) as last read. No spike of a process alive at
  a poll is missed, but peaks that did not coincide are added up: an upper bound.
- `peak_sum_bytes`: the largest sum of the tree's current RSS seen at one poll.

Pages shared copy-on-write (a zygote's forked workers) count once per process in both, so both
err high. `peak_pss_bytes`, the largest sum of proportional set sizes at one poll, splits shared
pages between their processes: what the tree held at once, as far as the polls saw. PSS is read
at every `pss_every`-th poll only: reading it walks each process's page tables (milliseconds for
a process of a few hundred MB), and the polling thread runs in the measured process, on the
cores the measured work needs. Linux only.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_PROC = Path("/proc")


def _status_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in KiB, or None for a process gone (or a kernel thread)."""
    try:
        text = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    rss = hwm = None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return None if rss is None or hwm is None else (rss, hwm)


def _pss_kb(pid: int) -> int:
    try:
        text = (_PROC / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _label(pid: int) -> str:
    """What a process runs, in a few words: the last statement of a `python -c` program (a
    grading worker's `_worker_main(...)`, a zygote's `zygote_main(...)`), else its command."""
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    text = words[words.index("-c") + 1] if "-c" in words[:-1] else " ".join(words)
    last = [part.strip() for part in text.replace("\n", ";").split(";") if part.strip()]
    return (last[-1] if last else text).split("(")[0][-40:]


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process, in clock ticks (None: gone)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _parent(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


class TreeRss:
    """Polls the tree every `interval_s` seconds on a daemon thread while the block runs."""

    def __init__(self, interval_s: float = 0.1, pss_every: int = 10) -> None:
        self.interval_s = interval_s
        self.pss_every = max(1, pss_every)
        self._polls = 0
        self.root = os.getpid()
        self.peak_sum_bytes = 0
        self.peak_pss_bytes = 0
        self.processes = 0  # how many processes the tree held, this one included
        self._parents: dict[int, int | None] = {}
        self._before: set[int] = set()
        self._hwm_kb: dict[int, int] = {}
        self._labels: dict[int, str] = {}
        self._cpu: dict[int, int] = {}  # each process's CPU ticks as last read
        self._cpu_start = 0  # this process's, when the block began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def peak_bytes(self) -> int:
        return 1024 * sum(self._hwm_kb.values())

    def peaks_by_label(self) -> dict[str, list[int]]:
        """Each process's high-water mark in MB, grouped by what it runs (largest first)."""
        out: dict[str, list[int]] = {}
        for pid, kb in sorted(self._hwm_kb.items(), key=lambda item: -item[1]):
            out.setdefault(self._labels.get(pid, "?"), []).append(round(kb * 1024 / 1e6))
        return out

    def cpu_by_label(self) -> dict[str, float]:
        """CPU seconds each kind of process used while the block ran (as last read: a process
        that exited between two polls loses its last tenth of a second), by what it runs."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for pid, ticks in self._cpu.items():
            used = ticks - (self._cpu_start if pid == self.root else 0)
            label = self._labels.get(pid, "?")
            out[label] = out.get(label, 0.0) + used / tick
        return dict(sorted(out.items(), key=lambda item: -item[1]))

    def _descendants(self) -> set[int]:
        pids = {int(p) for p in os.listdir(_PROC) if p.isdigit()}
        for gone in set(self._parents) - pids:
            del self._parents[gone]
        for pid in pids - set(self._parents):  # a pid's parent read once: cheap polls
            self._parents[pid] = _parent(pid)
        children: dict[int, list[int]] = {}
        for pid, ppid in self._parents.items():
            if ppid is not None:
                children.setdefault(ppid, []).append(pid)
        tree, todo = set(), [self.root]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in tree:
                    tree.add(child)
                    todo.append(child)
        return tree

    def poll(self, *, pss: bool | None = None) -> None:
        """One reading; `pss`: read PSS too (default: at every `pss_every`-th poll)."""
        if pss is None:
            pss = self._polls % self.pss_every == 0
        self._polls += 1
        total = pss_kb = 0
        for pid in [self.root, *(self._descendants() - self._before)]:
            got = _status_kb(pid)
            if got is None:
                continue
            rss, hwm = got
            total += rss
            ticks = _cpu_ticks(pid)
            if ticks is not None:
                self._cpu[pid] = ticks
            if pss:
                pss_kb += _pss_kb(pid)
            self._hwm_kb[pid] = max(self._hwm_kb.get(pid, 0), hwm)
            if pid not in self._labels:
                self._labels[pid] = "this process" if pid == self.root else _label(pid)
        self.peak_sum_bytes = max(self.peak_sum_bytes, 1024 * total)
        self.peak_pss_bytes = max(self.peak_pss_bytes, 1024 * pss_kb)
        self.processes = len(self._hwm_kb)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def __enter__(self) -> TreeRss:
        self._before = self._descendants()
        try:
            (_PROC / "self" / "clear_refs").write_text("5")  # reset this process's VmHWM
        except OSError:
            pass  # not allowed here: the high-water mark then includes what came before
        self._cpu_start = _cpu_ticks(self.root) or 0
        self.poll()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tree-rss")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll(pss=True)
