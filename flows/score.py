"""The scoring stage: saved logs in, score rows out; no model, no generation-time sandbox.

For each verifier registered for a run, the samples that have no score under the verifier's
current fingerprint (and, when asked, those whose latest attempt was unscored for a retryable
infrastructure reason) are read from the warehouse, cut into chunks, and graded in a pool of light
worker processes (`scorers.workers.pool`: fresh interpreters that import only the verifier, so an
edited verifier module is imported as it is on disk now, and a worker is ready in a fraction of
a second). The pool is started at the beginning of the flow, so its start-up overlaps ingest and
reading. Graded chunks are written in batches (one Prefect task run, one transaction each)
while the workers go on grading. The flow's process is the only DuckDB writer (principle 8).

Rows are written only under the fingerprint of the code that graded them: each grading process
reports the fingerprint of the source it actually compiled (`scorers.identity.loaded_code`), and a chunk
graded by other code than the verifier's files hold (a module imported before an edit, or after
one) is never written; the stage grades it again in fresh workers (CODE_PASSES in all).

Per-sample fault isolation: a verifier that raises on a sample, or overruns the per-sample time
limit, makes that sample `unscored` (reason "verifier_error" / "timeout", with a short
traceback in the row's metadata); the other samples are scored. A sample whose generation
errored gets a status "error" row without calling the verifier.

A stop (the first Ctrl-C or SIGTERM) hands out no more chunks, waits a moment for the chunks in
flight (`grading_pool.STOP_GRACE_S`), writes every result graded, says how many, and ends the
stage with `ScoringStopped`; a flow run it ends is Cancelled. What was not graded has no row, so
the next stage grades exactly that. A second signal exits at once: a write it cuts short rolls
back as a whole."""

from __future__ import annotations

import array
import contextvars
import gc
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from prefect import flow, task
from prefect.cache_policies import NONE as NO_CACHE
from prefect.states import Cancelled

from flows.runtime.console import progress_bar
from flows.runtime.interrupts import (
    finished_result,
    interruptible,
    say_stopping,
    signal_name,
    stop_on_signals,
    stop_signal,
    stop_softly,
)
from flows.runtime.run_names import count, label_run, listed, parameter, tag
from flows.runtime.run_owner import record_owner
from scorers.registry import Verifier, get_verifier
from scorers.workers.pool import (
    DEFAULT_CHUNK,
    GradingPool,
    ResultRow,
    SampleRow,
    grade_chunk,
)
from scorers.workers.prewarm import (
    starts_early,
    verifiers_for,
    warm_preload,
    worker_modules,
)
from warehouse.connection import WarehouseLocked
from warehouse.schema import RetryScope

if TYPE_CHECKING:
    from warehouse import Warehouse

__all__ = [
    "DEFAULT_CHUNK",
    "GradingPool",
    "RunScore",
    "Samples",
    "ScoreOptions",
    "CODE_PASSES",
    "CodeChanged",
    "ScoreSummaries",
    "ScoringStopped",
    "grade_batch",
    "grade_chunk",
    "run_score",
    "score_flow",
    "stop_line",
    "stopped_run",
    "stream_grades",
    "score_runs",
    "scores_table",
    "scoring_pool",
    "start_early",
    "verifiers_of_log",
]

CODE_PASSES = 3  # a verifier edited while it grades: grade what its old code did again, twice

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
SAMPLE_TIMEOUT_S = 60.0  # a verifier is bounded itself; this is the stage's backstop


@dataclass(frozen=True)
class ScoreOptions:
    """How the stage runs.

    Attributes:
        workers: worker processes (default: the CPU count).
        chunk_size: samples per worker call.
        sample_timeout_s: a grade call running longer is stopped and the sample is unscored
            with reason "timeout" (pure-Python loops; C-level work must be bounded by the
            verifier itself, as the math verifier does with killable workers).
        progress: show a progress bar.
    """

    workers: int | None = None
    chunk_size: int = DEFAULT_CHUNK
    sample_timeout_s: float = SAMPLE_TIMEOUT_S
    progress: bool = True


@dataclass
class RunScore:
    """What the stage wrote for one (run, scorer)."""

    run_id: str
    scorer: str
    fingerprint: str
    written: int = 0
    scored: int = 0
    correct: int = 0
    unscored: int = 0
    error: int = 0
    retried: int = 0  # rows written as a retry (attempt > 1) of an unscored sample
    reasons: dict[str, int] = field(default_factory=dict)
    # samples not written: the verifier's code kept changing while they were graded
    # (CODE_PASSES passes); the next stage grades them under the fingerprint current then
    stale: int = 0

    def add(self, row: dict[str, Any]) -> None:
        """Count one written row (a dict with status, value, reason and attempt)."""
        self.count(row["status"], row["value"], row["reason"], row.get("attempt"))

    def count(self, status: str, value: float | None, reason: str, attempt: int | None) -> None:
        """Count one written row."""
        self.written += 1
        self.retried += (attempt or 1) > 1
        if status == "scored":
            self.scored += 1
            self.correct += value == 1.0
        elif status == "unscored":
            self.unscored += 1
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        else:
            self.error += 1


# -- parent side ---------------------------------------------------------------------------------


def _error_row(error: str) -> ResultRow:
    first_line = error.strip().splitlines()[0:1] or ["generation failed"]
    return ("error", None, None, first_line[0][:300], "generation_error", "{}", 0.0)


_KEY_COLUMNS = ["run_id", "sample_id", "epoch", "attempt"]


def scores_table(keys: pa.Table, results: list[ResultRow], scorer: str, digest: str) -> pa.Table:
    """Score rows (SCORE_SCHEMA) from sample keys and their results, in the same order.

    Args:
        keys: run_id, sample_id, epoch and attempt columns (`Samples.keys`), one row per
            result; a null attempt is written as 1 (`samples_to_score` gives the attempt a
            grading must be written as).
        results: what the verifier gave, per key.
        scorer: the verifier's name.
        digest: its fingerprint.
    """
    from warehouse import SCORE_SCHEMA

    n = keys.num_rows
    cols = list(zip(*results, strict=True)) if results else [()] * 7

    def same(value: Any, name: str) -> pa.Array:
        # one scalar repeated: Arrow converts a list of tz-aware datetimes one by one, slowly
        return pa.repeat(pa.scalar(value, SCORE_SCHEMA.field(name).type), n)

    return pa.Table.from_pydict(
        {
            "run_id": keys.column("run_id"),
            "sample_id": keys.column("sample_id"),
            "epoch": keys.column("epoch").cast(pa.int32()),
            "scorer": same(scorer, "scorer"),
            "fingerprint": same(digest, "fingerprint"),
            "status": list(cols[0]),
            "value": list(cols[1]),
            "answer": list(cols[2]),
            "explanation": list(cols[3]),
            "reason": list(cols[4]),
            "metadata": list(cols[5]),
            "scored_at": same(datetime.now(UTC), "scored_at"),
            "duration_s": list(cols[6]),
            "attempt": pc.fill_null(keys.column("attempt").cast(pa.int32()), 1),
        },
        schema=SCORE_SCHEMA,
    )


class Samples:
    """Samples to grade: the `samples_to_score` columns, without a Python dict per row
    (building them would delay every worker's first chunk).

    The rows a verifier reads are built per chunk (`rows_at`), as the chunk goes to a worker:
    built all at once, up front, they held back the first chunk of a 200,000-sample stage by
    about half a second of one core while the workers waited.
    """

    def __init__(self, table: pa.Table) -> None:
        from warehouse import SAMPLES_TO_SCORE_SCHEMA

        for name in ("attempt", "state"):
            if name not in table.column_names:
                kind = SAMPLES_TO_SCORE_SCHEMA.field(name).type
                table = table.append_column(name, pa.nulls(table.num_rows, kind))
        self.table = table.select(SAMPLES_TO_SCORE_SCHEMA.names).cast(SAMPLES_TO_SCORE_SCHEMA)
        # what a verifier may read of each sample (SampleRow), as whole columns
        self._columns = self.table.select(list(_SAMPLE_COLUMNS)).combine_chunks()
        self.errors: list[str | None] = self.table.column("error").to_pylist()

    @classmethod
    def from_dicts(cls, rows: list[dict[str, Any]]) -> Samples:
        """From dicts with the samples_to_score columns (attempt may be missing)."""
        from warehouse import SAMPLES_TO_SCORE_SCHEMA

        return cls(pa.Table.from_pylist(rows, schema=SAMPLES_TO_SCORE_SCHEMA))

    def __len__(self) -> int:
        return self.table.num_rows

    def run_id(self, index: int) -> str:
        return self.table.column("run_id")[index].as_py()

    def rows_at(self, indices: Sequence[int]) -> list[SampleRow]:
        """What a verifier may read (SampleRow) of these samples, in order."""
        part = self._columns.take(_positions(indices))
        return list(zip(*(part.column(c).to_pylist() for c in _SAMPLE_COLUMNS), strict=True))

    def subset(self, indices: list[int]) -> Samples:
        """These samples (indices into this one), in order."""
        return Samples(self.table.take(_positions(indices)))

    def keys(self, indices: list[int]) -> pa.Table:
        """The key columns (run_id, sample_id, epoch, attempt) of these samples, in order."""
        return self.table.select(_KEY_COLUMNS).take(_positions(indices))


def _positions(indices: Sequence[int]) -> pa.Array:
    # Not pa.array(list): pyarrow imports pandas on its first conversion of a Python list
    # (0.2-0.3 s of CPU), which here would stand between the stage and its first chunk.
    buffer = pa.py_buffer(array.array("q", indices))
    return pa.Array.from_buffers(pa.int64(), len(indices), [None, buffer])


class _ChunkRows(Sequence[list[SampleRow]]):
    """The rows of each chunk, built when a chunk is asked for (`GradingPool.map` asks as it
    hands the chunk to a worker, so building overlaps the grading of the chunks before it)."""

    def __init__(self, samples: Samples, chunks: list[list[int]]) -> None:
        self.samples, self.chunks = samples, chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, k: int) -> list[SampleRow]:  # type: ignore[override]
        return self.samples.rows_at(self.chunks[k])


_SAMPLE_COLUMNS = ("completion", "target", "metadata", "sample_id", "state")


def stream_grades(
    pool: GradingPool,
    verifier: Verifier,
    samples: Samples,
    opts: ScoreOptions,
    emit: Callable[[list[int], list[ResultRow]], None],
    *,
    in_process: bool = True,
    expect: str | None = None,
) -> list[int]:
    """Grade samples, handing results over as they come.

    Args:
        pool: the worker processes (used when there is more than one chunk and one worker).
        verifier: what grades.
        samples: what to grade.
        opts: chunk size and per-sample limit.
        emit: called with (indices into `samples`, their results) per finished chunk, in no
            particular order.
        in_process: False to grade every chunk in a worker, never in this process.
        expect: the fingerprint the results will be written under (the verifier's files, as
            `scorers.identity.fingerprint.fingerprint` read them). A chunk graded by code that is not
            exactly that (`fingerprint_as_loaded` of the grading process) is not emitted.

    Returns:
        The indices of the samples not emitted because other code graded them (empty without
        `expect`).
    """
    failed = [i for i, e in enumerate(samples.errors) if e is not None]
    if failed:
        emit(failed, [_error_row(samples.errors[i] or "") for i in failed])
    todo = [i for i, e in enumerate(samples.errors) if e is None]
    chunks = _strided_chunks(todo, _chunk_size(verifier, opts))
    # one chunk or one worker: a round trip to a worker costs more than it saves -- unless
    # this process's copy of the verifier is not the code `expect` names, or the workers fork
    # from a warm process that has done (or is doing) the start-up this one has not
    if (
        chunks
        and in_process
        and (pool.workers <= 1 or len(chunks) == 1)
        and not pool.forks_warm
        and _runs_here(verifier, expect)
    ):
        stale: list[int] = []
        for chunk in chunks:
            # a stop cannot be polled while the verifier runs here: it ends the chunk
            with interruptible():
                graded = grade_chunk(verifier.grade, samples.rows_at(chunk), opts.sample_timeout_s)
            if _runs_here(verifier, expect):  # also what it imported while grading
                emit(chunk, graded)
            else:
                stale.append(chunk)
        if not stale:
            return []
        chunks = stale  # graded again by workers, which import the files as they are now
    # A verifier may defer what would wait on a helper still starting (math: its sympy
    # zygote), so the workers grade everything else meanwhile; the pool grades the deferred
    # rows again soon after, without deferral.
    for_processes = getattr(verifier.grade, "for_processes", None)  # a judge's limits are shared
    stale_chunks = pool.map(
        for_processes(pool.workers) if for_processes else verifier.grade,
        _ChunkRows(samples, chunks),
        opts.sample_timeout_s,
        lambda job, graded: emit(chunks[job], graded),
        may_defer=True,
        verifier=verifier,
        expect=expect,
    )
    return sorted(i for job in stale_chunks for i in chunks[job])


# A sandbox scorer's sample holds a container for seconds (restore, the scorer's commands), and
# each grading process runs as many containers at once as the sandbox pool does (one per
# core): small chunks spread its samples over every worker.
SANDBOX_CHUNK = 8


def _chunk_size(verifier: Verifier, opts: ScoreOptions) -> int:
    if "sandbox" in verifier.params:  # scorers.inspect_scorers.sandboxed
        return min(opts.chunk_size, SANDBOX_CHUNK)
    return opts.chunk_size


def _runs_here(verifier: Verifier, expect: str | None) -> bool:
    """Whether this process's copy of the verifier is the code `expect` names."""
    if expect is None:
        return True
    from scorers.identity.fingerprint import fingerprint_as_loaded

    fp = fingerprint_as_loaded(verifier)
    return fp is not None and fp.digest == expect


def _strided_chunks(indices: list[int], size: int) -> list[list[int]]:
    # Strided, not contiguous: rows come sorted by sample id, so the epochs and near-identical
    # items of one expensive problem would otherwise land in the same few chunks, and the stage
    # would end with one worker grinding through them while the others idle.
    n = -(-len(indices) // size)
    return [indices[i::n] for i in range(n)]


class CodeChanged(RuntimeError):
    """The verifier's code kept changing while it graded: no code could be vouched for."""


def grade_batch(
    pool: GradingPool,
    verifier: Verifier,
    samples: Samples | list[dict[str, Any]],
    opts: ScoreOptions,
    advance: Callable[[int], None] | None = None,
    *,
    in_process: bool = True,
    expect: str | None = None,
) -> list[ResultRow]:
    """`stream_grades`, collected: one result per sample, in order (dicts: the
    samples_to_score columns).

    With `expect`, samples graded by other code than that fingerprint are graded again in a
    fresh pool (CODE_PASSES in all).

    Raises:
        CodeChanged: with `expect`, some samples were still graded by other code at the end.
    """
    if not isinstance(samples, Samples):
        samples = Samples.from_dicts(samples)
    results: list[ResultRow | None] = [None] * len(samples)

    def put(part: list[int], graded: list[ResultRow]) -> None:
        for i, g in zip(part, graded, strict=True):
            results[i] = g
        if advance is not None:
            advance(len(part))

    todo = samples
    indices = list(range(len(samples)))
    for _ in range(CODE_PASSES):
        stale = stream_grades(
            pool,
            verifier,
            todo,
            opts,
            lambda part, graded, at=indices: put([at[i] for i in part], graded),
            in_process=in_process,
            expect=expect,
        )
        if not stale:
            return results  # type: ignore[return-value]
        pool.close()  # its processes hold other code than the files: start fresh ones
        indices = [indices[i] for i in stale]
        todo = samples.subset(indices)
    raise CodeChanged(
        f"verifier {verifier.name!r}: its code changed while {len(indices)} sample(s) were "
        f"graded, {CODE_PASSES} times; grade them again once it is no longer being edited"
    )


def start_early(names: Sequence[str], opts: ScoreOptions) -> GradingPool:
    """A scoring pool started now for these verifiers: workers import them and their helpers
    (math: sympy) boot while the caller does something else (a sweep: generation)."""
    pool = scoring_pool(opts)
    _start_for(pool, [get_verifier(n) for n in names])
    return pool


def _start_for(pool: GradingPool, verifiers: Sequence[Verifier]) -> None:
    # a judge scorer's workers warm up its judge (scorers.inspect_scorers.judges.warm_up);
    # Inspect scorers' workers fork from one warm process (scorers.workers.prewarm)
    pool.start(
        worker_modules(verifiers),
        [h for v in verifiers for h in v.helpers],
        warm_preload(verifiers),
    )


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

    table = scores_table(keys.value, results.value, scorer, digest)
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


class _BatchWriter:
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
        except _GaveUp as exc:
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
        if isinstance(exc, _GaveUp):
            kept = sum(s.written for s in self.summaries.values())
            with self._hand:
                lost = len(self.indices)
            raise GradedWorkNotWritten(exc.locked, kept, lost) from None
        if exc is not None:
            raise exc

    def _registered(self, wait_s: float) -> None:
        if self.register is not None:
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
                raise _GaveUp(exc) from None
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


class ScoringStopped(KeyboardInterrupt):
    """A stop (SIGINT, SIGTERM) ended the stage once it had written what was graded.

    A KeyboardInterrupt, so that code unaware of it unwinds as from Ctrl-C.

    Attributes:
        signum: the signal that stopped it.
        summaries: what the stage wrote, one RunScore per (run, verifier) (`score_runs`).
        left: samples left ungraded, for the next stage (None: not counted).
    """

    def __init__(self, signum: int, summaries: list[RunScore], left: int | None) -> None:
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum, self.summaries, self.left = signum, summaries, left

    @property
    def written(self) -> int:
        return sum(s.written for s in self.summaries)


class _GaveUp(Exception):
    """The file stayed locked for the lock timeout (turned into `GradedWorkNotWritten` by the
    feeding thread, which knows how much is in hand)."""

    def __init__(self, locked: WarehouseLocked) -> None:
        super().__init__(str(locked))
        self.locked = locked


def score_runs(
    warehouse_path: str | Path,
    plan: dict[str, list[str]],
    opts: ScoreOptions | None = None,
    pool: GradingPool | None = None,
    *,
    retry: RetryScope | None = None,
    max_attempt: int | None = None,
    skip_reasons: Sequence[str] = (),
) -> list[RunScore]:
    """Score every run with its verifiers; skip samples already scored by the same fingerprint.

    Args:
        warehouse_path: the DuckDB file (the runs must be ingested already).
        plan: run_id -> names of the verifiers that score it.
        opts: pool size, chunking and limits.
        pool: a worker pool already started by the caller, who closes it.
        retry: also grade again the samples whose latest attempt under the current fingerprint
            is unscored for a retryable reason ("all") or an infrastructure failure
            ("infrastructure"; `warehouse.schema.RetryScope`); each is written as a new row
            with the next attempt number.
        max_attempt: with `retry`, write no attempt above this (`Warehouse.samples_to_score`).
        skip_reasons: with `retry`, unscored reasons not to retry this time.

    Returns:
        One RunScore per (run, verifier) that had anything to do, and zero-count ones for the
        rest, so a caller can show that nothing was left to score.
    """
    from warehouse import Warehouse

    with _older_objects_frozen():
        return _score_runs(
            Warehouse(warehouse_path),
            plan,
            opts or ScoreOptions(),
            pool,
            retry,
            max_attempt,
            tuple(skip_reasons),
        )


_FROZEN_DEPTH = [0]


@contextmanager
def _older_objects_frozen() -> Iterator[None]:
    # A full garbage collection scans every object in the process: with Prefect and Inspect
    # loaded that is 0.12-0.15 s, and a 20,000-sample stage allocates enough to trigger one.
    # What existed before the stage (modules, Prefect's machinery) is not the stage's garbage,
    # so it is left out of collections until the stage ends (objects made meanwhile are
    # collected as usual).
    _FROZEN_DEPTH[0] += 1
    if _FROZEN_DEPTH[0] == 1:
        gc.freeze()
    try:
        yield
    finally:
        _FROZEN_DEPTH[0] -= 1
        if _FROZEN_DEPTH[0] == 0:
            gc.unfreeze()


def _score_runs(
    wh: Warehouse,
    plan: dict[str, list[str]],
    opts: ScoreOptions,
    pool: GradingPool | None,
    retry: RetryScope | None,
    max_attempt: int | None,
    skip_reasons: tuple[str, ...],
) -> list[RunScore]:
    from scorers.identity.fingerprint import fingerprint
    from warehouse import Warehouse

    warehouse_path = wh.path
    by_scorer: dict[str, list[str]] = {}
    for run_id, names in plan.items():
        for name in names:
            by_scorer.setdefault(name, []).append(run_id)
    summaries: dict[tuple[str, str], RunScore] = {}
    own_pool = pool is None
    pool = pool or GradingPool(_workers(opts))
    order = list(by_scorer.items())
    retries = _Retries(retry, max_attempt, skip_reasons)
    try:
        # a stop is polled, not raised: what is graded gets written first
        with stop_softly(), progress_bar() if opts.progress else _null_progress() as progress:
            for position, (name, run_ids) in enumerate(order):
                verifier = get_verifier(name)
                for code_pass in range(CODE_PASSES):
                    if stop_signal() is not None:
                        raise _stop(wh, summaries, None, order[position:], retries)
                    # the files as they are now: what rows are written under, and what every
                    # grading process must have run for its rows to be written
                    fp = fingerprint(verifier)
                    for run_id in run_ids:
                        summary = summaries.setdefault((run_id, name), RunScore(run_id, name, ""))
                        summary.fingerprint, summary.stale = fp.digest, 0
                    samples = Samples(
                        wh.samples_to_score(
                            name,
                            fp.digest,
                            run_ids=run_ids,
                            retry=retry,
                            max_attempt=max_attempt,
                            skip_reasons=skip_reasons,
                            state=verifier.reads_state,
                        )
                    )
                    label = f"score {name}" + (" (+ retries)" if retry else "")
                    if code_pass:
                        label += " (its code changed while grading: again)"
                    bar = progress.add_task(label, total=len(samples)) if progress else None
                    writer = _BatchWriter(
                        str(warehouse_path), name, fp.digest, samples, summaries,
                        lambda n, bar=bar: progress.advance(bar, n) if progress else None,
                        register=lambda wait_s, fp=fp: Warehouse(
                            warehouse_path, lock_timeout_s=wait_s
                        ).register_verifier(fp, current=True),
                        lock_timeout_s=wh.lock_timeout_s,
                    )  # fmt: skip
                    try:
                        stale = stream_grades(
                            pool, verifier, samples, opts, writer, expect=fp.digest
                        )
                    except KeyboardInterrupt:
                        if stop_signal() is None:
                            raise
                        raise _stop(wh, summaries, writer, order[position + 1 :], retries) from None
                    finally:
                        writer.settle()
                    writer.flush()
                    if not stale:
                        break
                    # its processes hold other code than the files: fresh ones import them
                    pool.close()
                    for i in stale:
                        summaries[(samples.run_id(i), name)].stale += 1
            if stop_signal() is not None:  # came while the last results were written
                raise _stop(wh, summaries, None, [], retries)
    finally:
        if own_pool:
            pool.close()
    return list(summaries.values())


@dataclass(frozen=True)
class _Retries:
    """What a stage grades again besides the samples with no row (`score_runs`' arguments)."""

    retry: RetryScope | None
    max_attempt: int | None
    skip_reasons: tuple[str, ...]


def _stop(
    wh: Warehouse,
    summaries: dict[tuple[str, str], RunScore],
    writer: _BatchWriter | None,
    later: list[tuple[str, list[str]]],
    retries: _Retries,
) -> ScoringStopped:
    """A stop came: write what `writer` holds (the grading of the verifier in hand, cut short)
    and say so, then count what is left (that verifier's samples not written, and those of the
    verifiers `later` that the stage did not reach) for the exception that ends the stage."""
    from scorers.identity.fingerprint import fingerprint
    from warehouse import WarehouseError

    signum = stop_signal()
    assert signum is not None
    left: int | None = 0
    if writer is not None:
        writer.settle()
    waiting = writer.in_hand() if writer is not None else 0
    graded = sum(s.written for s in summaries.values()) + waiting
    say_stopping(f"writing {waiting:,} graded results, {graded:,} in all")
    if writer is not None:
        writer.flush()
        left = len(writer.samples) - writer.written
    try:
        for name, run_ids in later:
            left += wh.count_to_score(  # type: ignore[operator]
                name,
                fingerprint(get_verifier(name)).digest,
                run_ids=run_ids,
                retry=retries.retry,
                max_attempt=retries.max_attempt,
                skip_reasons=retries.skip_reasons,
            )
    except WarehouseError:  # a count is not worth failing the stop for
        left = None
    return ScoringStopped(signum, list(summaries.values()), left)


def _workers(opts: ScoreOptions) -> int:
    return max(1, opts.workers or os.cpu_count() or 1)


def scoring_pool(opts: ScoreOptions) -> GradingPool:
    """A worker pool for `score_runs` that a caller can `start()` early and must `close()`."""
    return GradingPool(_workers(opts))


class _null_progress:  # noqa: N801 - used like a context manager function
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def verifiers_of_log(path: str | Path) -> tuple[str, list[str]]:
    """The run id of a log and the verifiers that score it: those gradebook's generate stage
    recorded in it, else the log's own scorers (verifiers.specs: by registry name only).

    Raises:
        ValueError: a scorer the log names cannot be resolved here (one line, names the log).
        warehouse.LogReadError: the path is not a readable Inspect log.
    """
    from verifiers.specs import log_verifier_names
    from warehouse.logs import read_header

    return read_header(str(path)).eval.eval_id, log_verifier_names(path)


def ingest_and_plan(
    warehouse_path: str | Path,
    logs: Sequence[str | Path],
    verifiers: Iterable[str] | None,
    limits: Any = None,
) -> tuple[dict[str, list[str]], list[Any]]:
    """Ingest logs and decide which verifiers score each; returns (plan, ingest results).

    `limits`: how far the logs' members may inflate (warehouse.inflate.InflateLimits; default:
    the environment's, else the defaults)."""
    from verifiers.specs import names_for_entries
    from warehouse import Warehouse

    # the user's --verifier entries (names, Inspect scorers, file.py@scorer): trusted
    chosen = names_for_entries(verifiers or [], trusted=True)
    results = Warehouse(warehouse_path).ingest_logs([str(p) for p in logs], limits=limits)
    plan: dict[str, list[str]] = {}
    for res in results:
        # a log with damaged samples still has its readable ones stored: they are scored
        if not res.run_id:
            continue
        plan[res.run_id] = chosen or verifiers_of_log(res.path)[1]
    return plan, results


@task(
    name="ingest",
    task_run_name=lambda parameters: f"ingest {count(len(parameters['logs']), 'log')}",
    cache_policy=NO_CACHE,
)
def ingest_task(
    warehouse_path: str, logs: list[str], verifiers: list[str] | None, limits: Any = None
) -> tuple[dict[str, list[str]], list[Any]]:
    """Prefect task: load logs into the warehouse (idempotent)."""
    return ingest_and_plan(warehouse_path, logs, verifiers, limits)


class ScoreSummaries(list[RunScore]):
    """What `score_flow` wrote, one RunScore per (run, verifier); `problems`: what its ingest
    could not read, one line each (an unreadable log, a damaged sample); `stopped`: the signal
    that stopped it, if one did, and then `left`: the samples it left ungraded (None: not
    counted)."""

    def __init__(
        self,
        summaries: Iterable[RunScore],
        problems: Iterable[str] = (),
        *,
        stopped: int | None = None,
        left: int | None = None,
    ) -> None:
        super().__init__(summaries)
        self.problems = list(problems)
        self.stopped, self.left = stopped, left

    @property
    def written(self) -> int:
        return sum(s.written for s in self)

    def stop_line(self, command: str) -> str:
        """What a stopped stage did, for the terminal (`stop_line`)."""
        return stop_line(self.written, self.left, command)


def stop_line(written: int, left: int | None, command: str) -> str:
    """What a stopped stage did, for the terminal: "wrote 33,750 results in all; 66,250
    samples left for the next `gradebook score`" (`left` None: not counted)."""
    rest = f"{left:,} samples left for" if left is not None else "what is left is for"
    return f"wrote {written:,} results in all; {rest} the next `{command}`"


def _score_run_name() -> str:
    logs = parameter("logs") or []
    return (
        f"score {Path(str(logs[0])).name}" if len(logs) == 1 else f"score {count(len(logs), 'log')}"
    )


def _label_score_run(ingested: Sequence[Any], plan: dict[str, list[str]]) -> None:
    """Name the score flow run for what it scores, `score math_verified · demo-v2 (26
    samples)`, and tag it with the tasks, models and verifiers (once the logs are ingested)."""
    runs = [r for r in ingested if r.run_id in plan]
    if not runs:
        return
    tasks = [r.task or "?" for r in runs]
    models = [(r.model or "?").rsplit("/", 1)[-1] for r in runs]
    samples = count(sum(r.samples_total for r in runs), "sample")
    what = f"{listed(tasks)} · {listed(models)}"
    name = (
        f"score {what} ({samples})"
        if len(runs) == 1
        else f"score {len(runs)} runs: {what} ({samples})"
    )
    verifiers = sorted({v for names in plan.values() for v in names})
    label_run(
        name,
        [
            *(tag("task", t) for t in dict.fromkeys(tasks)),
            *(tag("model", r.model or "?") for r in runs),
            *(tag("verifier", v) for v in verifiers),
        ],
    )


@flow(name="score", flow_run_name=_score_run_name, log_prints=False, on_running=[record_owner])
def score_flow(
    logs: list[str],
    warehouse: str = "gradebook.duckdb",
    verifiers: list[str] | None = None,
    workers: int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    progress: bool = True,
    scored_log_dir: str | None = None,
    retry_unscored: bool = False,
) -> list[RunScore]:
    """Ingest logs, then score them with their verifiers (or `verifiers`).

    Args:
        logs: .eval log paths.
        warehouse: the DuckDB file.
        verifiers: verifier names for every log; default: the names recorded by generate.
        workers: worker processes (default: CPU count).
        chunk_size: samples per worker call.
        progress: show progress bars.
        scored_log_dir: if set, also write a scored copy of each log there (originals are
            never modified) so `inspect view` shows the scores.
        retry_unscored: also grade again samples left unscored for a retryable reason
            (grader_failed, sandbox_unavailable, timeout, verifier_error).

    Returns:
        The summaries per (run, verifier); `.problems` names each log or sample the ingest
        could not read (the readable ones are scored). A stop (SIGINT, SIGTERM) writes what
        was graded and ends the run Cancelled, with the summaries (`.stopped`, `.left`) as its
        data: `run_score` returns them.
    """
    opts = ScoreOptions(workers=workers, chunk_size=chunk_size, progress=progress)
    pool = scoring_pool(opts)
    # SIGINT/SIGTERM stop the stage in order (inside the flow run: Prefect's engine installs its
    # own SIGTERM handler, which would crash the run and drop what was graded)
    with stop_on_signals():
        try:
            try:
                # big logs, and judges: start the workers first, so that their start-up
                # overlaps the ingest
                early = verifiers_for(logs, verifiers)
                if starts_early(logs, warm_preload(early), opts.chunk_size):
                    _start_for(pool, early)
                plan, ingested = ingest_task(warehouse, logs, verifiers)
                _label_score_run(ingested, plan)
                summaries = score_runs(
                    warehouse, plan, opts, pool, retry="all" if retry_unscored else None
                )
            finally:
                pool.close()
        except KeyboardInterrupt as exc:
            signum = stop_signal()
            if signum is None:
                raise
            # a stop before grading (ingest, the workers' start) has graded nothing
            done = (
                ScoreSummaries(exc.summaries, stopped=signum, left=exc.left)
                if isinstance(exc, ScoringStopped)
                else ScoreSummaries([], stopped=signum)
            )
            return stopped_run(signum, done.stop_line("gradebook score"), done)
    problems = [line for r in ingested for line in r.problems()]
    if scored_log_dir:
        from warehouse.scored_logs import write_scored_logs

        write_scored_logs(warehouse, logs, Path(scored_log_dir), problems)
    return ScoreSummaries(summaries, problems)


def stopped_run(signum: int, line: str, result: Any) -> Any:
    """The state a flow run ends in when a stop ended its stage: Cancelled, its message the
    stop's `line` (`stop_line`), with `result` (what `run_score` and the like hand back)."""
    return Cancelled(message=f"stopped by {signal_name(signum)}: {line}", data=result)


def run_score(
    logs: list[str], warehouse: str = "gradebook.duckdb", **options: Any
) -> ScoreSummaries:
    """Run `score_flow` and return its summaries, also when a signal stopped it (the flow run
    then ends Cancelled, and `.stopped` says which signal); other failures raise as the flow
    did."""
    return finished_result(
        score_flow(logs, warehouse, **options, return_state=True), ScoreSummaries
    )
