"""The scoring stage's use of the engine: samples in, one result per sample out, chunk by chunk.

`stream_grades` cuts the samples into strided chunks and hands them to the pool (or grades a
lone chunk in this process), emitting each chunk's results as it comes back; only results of
the code the caller expects (a verifier's fingerprint) are emitted. `grade_batch` collects them,
grading again in fresh workers what other code graded (CODE_PASSES in all). What the samples
are (`warehouse.score_batches.Samples`: `errors`, `rows_at`, `subset`, `run_id`) and where the
results go is the caller's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from scorers.registry import Verifier, get_verifier
from scorers.workers.pool import DEFAULT_CHUNK, GradingPool, ResultRow, SampleRow, grade_chunk
from scorers.workers.prewarm import warm_preload, worker_modules

__all__ = [
    "CODE_PASSES",
    "SAMPLE_TIMEOUT_S",
    "CodeChanged",
    "ScoreOptions",
    "grade_batch",
    "scoring_pool",
    "start_early",
    "start_for",
    "stream_grades",
]

CODE_PASSES = 3  # a verifier edited while it grades: grade what its old code did again, twice
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


def _error_row(error: str) -> ResultRow:
    first_line = error.strip().splitlines()[0:1] or ["generation failed"]
    return ("error", None, None, first_line[0][:300], "generation_error", "{}", 0.0)


class _ChunkRows(Sequence[list[SampleRow]]):
    """The rows of each chunk, built when a chunk is asked for (`GradingPool.map` asks as it
    hands the chunk to a worker, so building overlaps the grading of the chunks before it)."""

    def __init__(self, samples: Any, chunks: list[list[int]]) -> None:
        self.samples, self.chunks = samples, chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, k: int) -> list[SampleRow]:  # type: ignore[override]
        return self.samples.rows_at(self.chunks[k])


def stream_grades(
    pool: GradingPool,
    verifier: Verifier,
    samples: Any,
    opts: ScoreOptions,
    emit: Callable[[list[int], list[ResultRow]], None],
    *,
    in_process: bool = True,
    expect: str | None = None,
    guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
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
        guard: around each chunk graded in this process, where a stop cannot be polled (the
            score flow's `interruptible`: a stop raises KeyboardInterrupt in it).
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
            with guard():
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
    samples: Any,
    opts: ScoreOptions,
    advance: Callable[[int], None] | None = None,
    *,
    in_process: bool = True,
    expect: str | None = None,
    guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> list[ResultRow]:
    """`stream_grades`, collected: one result per sample, in order.

    With `expect`, samples graded by other code than that fingerprint are graded again in a
    fresh pool (CODE_PASSES in all).

    Raises:
        CodeChanged: with `expect`, some samples were still graded by other code at the end.
    """
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
            guard=guard,
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
    start_for(pool, [get_verifier(n) for n in names])
    return pool


def start_for(pool: GradingPool, verifiers: Sequence[Verifier]) -> None:
    # a judge scorer's workers warm up its judge (scorers.inspect_scorers.judges.warm_up);
    # Inspect scorers' workers fork from one warm process (scorers.workers.prewarm)
    pool.start(
        worker_modules(verifiers),
        [h for v in verifiers for h in v.helpers],
        warm_preload(verifiers),
    )


def _workers(opts: ScoreOptions) -> int:
    return max(1, opts.workers or os.cpu_count() or 1)


def scoring_pool(opts: ScoreOptions) -> GradingPool:
    """A worker pool for `score_runs` that a caller can `start()` early and must `close()`."""
    return GradingPool(_workers(opts))
