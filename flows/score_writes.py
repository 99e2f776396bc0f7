"""The score flow's writes: graded chunks collected and written to the warehouse in batches,
each one Prefect task run and one transaction, on a thread of its own while the workers grade.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NONE as NO_CACHE

from scorers.workers.phases import STAGE
from scorers.workers.pool import ResultRow
from warehouse.connection import WarehouseLocked
from warehouse.score_batches import RunScore, Samples, scores_table

__all__ = [
    "BATCH_INTERVAL_S",
    "BATCH_MAX_ROWS",
    "LOCK_TRY_S",
    "WRITE_PACE",
    "BatchWriter",
    "Bulk",
    "GaveUp",
    "GradedWorkNotWritten",
    "write_batch",
]

# A warehouse write (one Prefect task run, one transaction: CPU of the stage's own, which the
# workers would otherwise have) happens at most about once a second, or sooner when
# BATCH_MAX_ROWS are waiting: a crash loses the chunks graded since the last write (a few
# seconds of a fast verifier's work; for a slow one, the chunk or two that came back since).
# A write's fixed cost (the task run, here and in the Prefect server; opening the file; the
# commit) is about as large as its cost for 30,000 rows, so small batches would spend the
# stage's CPU on writing.
BATCH_INTERVAL_S = 1.0
BATCH_MAX_ROWS = 64_000
# ... and at least this many times as long after a write as that write took: a write costs
# more as the warehouse grows, so paced to a fixed second the writes would take an ever larger
# share of a big stage's CPU (0 turns this off).
WRITE_PACE = 10.0


class Bulk:
    """Hands a bulk value to or from a Prefect task without Prefect walking it.

    Prefect visits every item of list and dict parameters looking for futures, which is slow
    for a batch of thousands of sample dicts. An object it does not know is passed through untouched.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Bulk({len(self.value)} items)"


@task(name="write-scores", cache_policy=NO_CACHE, task_run_name="write {scorer} ({n} rows)")
def write_batch(
    warehouse_path: str,
    scorer: str,
    digest: str,
    keys: Bulk,
    results: Bulk,
    n: int,
    lock_timeout_s: float | None = None,
) -> int:
    """Prefect task: write one batch of graded samples (one transaction).

    Args:
        lock_timeout_s: how long to wait for another process's lock (default: the
            warehouse's, env GRADEBOOK_LOCK_TIMEOUT or 5 s).

    Returns:
        The number of rows written (fewer than `n` when a concurrent stage wrote some first).

    Raises:
        WarehouseLocked: another process held the file all along; nothing was written.
    """
    from warehouse import Warehouse

    with STAGE.timed("write: build the score rows"):
        table = scores_table(keys.value, results.value, scorer, digest)
    with STAGE.timed("write: the transaction"):
        return Warehouse(warehouse_path, lock_timeout_s=lock_timeout_s).write_scores(table)


# While the workers grade, a write that finds the file locked (a reader elsewhere) waits only
# this long, keeps its results and tries again at the next batch, so grading never stalls.
LOCK_TRY_S = 0.1


class GradedWorkNotWritten(WarehouseLocked):
    """The warehouse stayed locked past the lock timeout; says what was kept and what lost."""

    def __init__(self, locked: WarehouseLocked, kept: int, lost: int) -> None:
        RuntimeError.__init__(
            self,
            f"{locked}; gave up with {kept} graded result(s) written and {lost} graded but "
            "not written (run the command again: only those are graded again)",
        )
        self.path, self.pid, self.kept, self.lost = locked.path, locked.pid, kept, lost


class BatchWriter:
    """Collects graded chunks (the `emit` of `stream_grades`) and writes them in batches.

    A batch is written on a thread of its own while this thread goes on feeding the workers:
    a write (a Prefect task run, one transaction, opening the file) takes longer than the
    chunks each worker holds, so written from the feeding thread it would leave the workers
    idle. One write is in flight at a time; what comes back meanwhile goes with the next.
    A write that finds the warehouse locked by another process keeps its rows in hand and is
    tried again with the next batch while grading goes on; once the file has stayed locked for
    the lock timeout (counted from the first refused write; the last write, when grading is
    done, waits out the rest), the stage gives up with `GradedWorkNotWritten`, which says how
    many results were kept and lost.
    """

    def __init__(
        self,
        warehouse_path: str,
        scorer: str,
        digest: str,
        samples: Samples,
        summaries: dict[tuple[str, str], RunScore],
        advance: Callable[[int], None],
        register: Callable[[float], object],
        lock_timeout_s: float,
    ) -> None:
        self.warehouse_path, self.scorer, self.digest = warehouse_path, scorer, digest
        # Recording the fingerprint (a write transaction) waits until the workers
        # have their first chunks, off the path to the first grade; it is done before any
        # score is written, and also when there is nothing to score.
        self.register: Callable[[float], object] | None = register
        self.samples = samples
        self.summaries = summaries
        self.advance = advance
        self.indices: list[int] = []  # in hand, not written (guarded by _hand)
        self.results: list[ResultRow] = []
        self._hand = threading.Lock()
        self.last = time.monotonic()
        self.write_s = 0.0  # how long the last write took
        self.lock_timeout_s = lock_timeout_s
        self.locked_since: float | None = None
        self._writing: threading.Thread | None = None
        self._failed: BaseException | None = None  # what the last background write raised
        self.written = 0  # rows this writer wrote

    def in_hand(self) -> int:
        """Results handed over and not written yet (a write in flight holds its own)."""
        with self._hand:
            return len(self.indices)

    def __call__(self, part: list[int], graded: list[ResultRow]) -> None:
        self._raise_failure()
        with self._hand:
            self.indices.extend(part)
            self.results.extend(graded)
            waiting = len(self.indices)
        self.advance(len(part))
        if self._writing is not None and self._writing.is_alive():
            if waiting < BATCH_MAX_ROWS:
                return  # these go with the next write
            # a full batch waits for the write in flight: what a crash can lose stays bounded
            self.settle()
            self._raise_failure()
        # a full batch goes at once, but a locked file is tried again only once a second
        full = waiting >= BATCH_MAX_ROWS and self.locked_since is None
        wait_s = max(BATCH_INTERVAL_S, WRITE_PACE * self.write_s)
        if full or time.monotonic() - self.last >= wait_s:
            self.last = time.monotonic()
            self._in_background(scores=True)
        elif self.register is not None:
            self._in_background(scores=False)

    def flush(self) -> None:
        """Grading is over: wait for the write in flight, then write what is in hand, waiting
        out the lock timeout."""
        self.settle()
        self._raise_failure()
        try:
            self._write(final=True, scores=True)
        except GaveUp as exc:
            self._failed = exc
            self._raise_failure()

    def settle(self) -> None:
        """Wait for the write in flight, if any (what it raised is raised by the next call or
        `flush`). A stage interrupted mid-grading calls this before it unwinds: no write is
        left running once the flow run ends."""
        if self._writing is not None:
            self._writing.join()
            self._writing = None

    def _in_background(self, *, scores: bool) -> None:
        # the task run it starts belongs to this flow run: Prefect's context is a contextvar.
        # A daemon: a second Ctrl-C, which exits at once, is not held up by it.
        ctx = contextvars.copy_context()
        self._writing = threading.Thread(
            target=ctx.run, args=(self._background, scores), name="score-writer", daemon=True
        )
        self._writing.start()

    def _background(self, scores: bool) -> None:
        try:
            self._write(final=False, scores=scores)
        except BaseException as exc:  # noqa: BLE001 - raised in the feeding thread next
            self._failed = exc

    def _raise_failure(self) -> None:
        exc, self._failed = self._failed, None
        if isinstance(exc, GaveUp):
            kept = sum(s.written for s in self.summaries.values())
            with self._hand:
                lost = len(self.indices)
            raise GradedWorkNotWritten(exc.locked, kept, lost) from None
        if exc is not None:
            raise exc

    def _registered(self, wait_s: float) -> None:
        if self.register is not None:
            with STAGE.timed("record the fingerprint"):
                self.register(wait_s)
            self.register = None

    def _attempt(self, write: Callable[[float], object], *, final: bool) -> bool:
        """Run `write(seconds to wait for the lock)`; False when the file stayed locked."""
        start = time.monotonic()
        since = self.locked_since if self.locked_since is not None else start
        remaining = max(0.0, self.lock_timeout_s - (start - since))
        try:
            write(remaining if final else min(LOCK_TRY_S, remaining))
        except WarehouseLocked as exc:
            self.locked_since = since
            if final or time.monotonic() - since >= self.lock_timeout_s:
                raise GaveUp(exc) from None
            return False
        self.locked_since = None
        return True

    def _write(self, *, final: bool, scores: bool) -> None:
        """Record the fingerprint if not yet done, then (`scores`) write what is in hand."""
        if not self._attempt(self._registered, final=final) or not scores:
            return
        with self._hand:
            indices, results, self.indices, self.results = self.indices, self.results, [], []
        if not indices:
            return
        with STAGE.timed("last write" if final else "write (on the writer thread)"):
            self._write_rows(indices, results, final=final)

    def _write_rows(self, indices: list[int], results: list[ResultRow], *, final: bool) -> None:
        """Write these rows (a task run, one transaction); locked: they stay in hand."""
        keys = self.samples.keys(indices)
        written: list[int] = []
        start = time.monotonic()
        wrote = False
        try:
            wrote = self._attempt(
                lambda wait_s: written.append(
                    write_batch(
                        self.warehouse_path,
                        self.scorer,
                        self.digest,
                        Bulk(keys),
                        Bulk(results),
                        len(keys),
                        wait_s,
                    )  # fmt: skip
                ),
                final=final,
            )
        finally:
            if not wrote:  # locked, or failed: the rows stay in hand, ahead of newer ones
                with self._hand:
                    self.indices[:0], self.results[:0] = indices, results
        if not wrote:
            return
        self.write_s = time.monotonic() - start
        self.written += written[0]
        # the summary counts what was written; a duplicate written by a concurrent stage is
        # not ours
        run_ids = keys.column("run_id").to_pylist()[: written[0]]
        attempts = keys.column("attempt").to_pylist()[: written[0]]
        for run_id, attempt, (status, value, _, _, reason, _, _) in zip(
            run_ids, attempts, results[: written[0]], strict=True
        ):
            self.summaries[(run_id, self.scorer)].count(status, value, reason, attempt)


class GaveUp(Exception):
    """The file stayed locked for the lock timeout (turned into `GradedWorkNotWritten` by the
    feeding thread, which knows how much is in hand)."""

    def __init__(self, locked: WarehouseLocked) -> None:
        super().__init__(str(locked))
        self.locked = locked
