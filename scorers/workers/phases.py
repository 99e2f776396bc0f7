"""Where a scoring stage's seconds go: wall-clock seconds summed per phase, and a few moments.

The stage's process adds to the process-wide `STAGE` clock around each step it takes (reading
the samples, handing a chunk to a worker, taking results back, a write), once per chunk or per
batch, never per sample: a `time.monotonic()` pair and a dict update under a lock, about a
microsecond against a chunk's milliseconds. The grading workers time their own side (waiting
for a chunk, decoding it, grading it, split by how each sample was decided) and send it back
with each chunk's results (`WorkerTimes`), and the pool adds those up under `worker ...`.

Phases run side by side (the writer thread writes while the feeding thread hands out chunks;
two workers grade at once), so the seconds are not meant to add up to the wall time: each says
how long that step took in all, and the marks (`mark`, the first time of a name is kept) say
when the stage passed a point, so a caller can tell what ran before the first chunk, during the
grading, and after it. `benchmarks/scoring_stage.py` resets the clock before a flow run and
prints it after.

Nothing here changes what is graded or written; the math verifier's fingerprint does not cover
this module (a timing change grades nothing again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["STAGE", "PhaseClock", "WorkerTimes"]


class PhaseClock:
    """Seconds and counts per phase, and the first moment (monotonic) of each mark."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._marks: dict[str, float] = {}

    def add(self, phase: str, seconds: float, count: int = 1) -> None:
        with self._lock:
            self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds
            self._counts[phase] = self._counts.get(phase, 0) + count

    def add_all(self, seconds: Mapping[str, float], prefix: str = "") -> None:
        """Add each phase of `seconds` (one count each), under `prefix` + its name."""
        with self._lock:
            for phase, s in seconds.items():
                key = prefix + phase
                self._seconds[key] = self._seconds.get(key, 0.0) + s
                self._counts[key] = self._counts.get(key, 0) + 1

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, time.monotonic() - start)

    def mark(self, name: str, at: float | None = None) -> None:
        """The stage passed `name` now (or at `at`); only the first time counts."""
        when = time.monotonic() if at is None else at
        with self._lock:
            self._marks.setdefault(name, when)

    def mark_last(self, name: str) -> None:
        """The stage passed `name` now; the last time counts (the last result in...)."""
        now = time.monotonic()
        with self._lock:
            self._marks[name] = now

    def reset(self) -> None:
        with self._lock:
            self._seconds.clear()
            self._counts.clear()
            self._marks.clear()

    def snapshot(self) -> dict[str, dict[str, float]]:
        """{"seconds": {phase: s}, "counts": {phase: n}, "marks": {name: monotonic}}."""
        with self._lock:
            return {
                "seconds": dict(self._seconds),
                "counts": {k: float(v) for k, v in self._counts.items()},
                "marks": dict(self._marks),
            }


STAGE = PhaseClock()


# a worker's own phases (the rest of its WorkerTimes are grading paths)
_OWN = frozenset(
    {"wait for a chunk", "decode the chunk", "grade calls, in all", "check the code it ran",
     "send the results"}
)  # fmt: skip


class WorkerTimes:
    """A grading worker's own seconds since it last reported: waiting for a chunk, decoding
    one, grading (split by how each sample was decided: its Grade's metadata `path`, e.g. the
    math verifier's `exact` or `symbolic`, else `other`), and sending results."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def take(self, graded_by: str = "") -> dict[str, float]:
        """What was timed since the last take (and start afresh); the grading paths (added
        per sample under the path's bare name, so nothing is formatted per sample) are named
        `graded_by` + path."""
        out, self.seconds = self.seconds, {}
        return {k if k in _OWN else graded_by + k: v for k, v in out.items()}
