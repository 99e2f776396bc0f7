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

import contextvars
import gc
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, task
from prefect.cache_policies import NONE as NO_CACHE
from prefect.states import Cancelled, Failed

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
from flows.score_start import starts_early
from flows.score_writes import (
    BatchWriter,
)
from scorers.registry import Verifier, get_verifier
from scorers.workers.phases import STAGE
from scorers.workers.pool import DEFAULT_CHUNK, GradingPool, grade_chunk
from scorers.workers.prewarm import warm_preload
from scorers.workers.stage import (
    CODE_PASSES,
    CodeChanged,
    ScoreOptions,
    scoring_pool,
    start_early,
    start_for,
    stream_grades,
)
from scorers.workers.stage import grade_batch as _grade_batch
from verifiers.specs import verifiers_for
from warehouse.schema import RetryScope
from warehouse.score_batches import RunScore, Samples, scores_table

if TYPE_CHECKING:
    from scorers.workers.pool import ResultRow
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
    "UnreadableLogs",
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


# -- parent side ---------------------------------------------------------------------------------


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
    from workspaces.image_regrade import rebuilt_image_samples

    warehouse_path = wh.path
    by_scorer: dict[str, list[str]] = {}
    for run_id, names in plan.items():
        for name in names:
            by_scorer.setdefault(name, []).append(run_id)
    summaries: dict[tuple[str, str], RunScore] = {}
    own_pool = pool is None
    pool = pool or scoring_pool(opts)
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
                    with STAGE.timed("fingerprint the verifier"):
                        fp = fingerprint(verifier)
                    for run_id in run_ids:
                        summary = summaries.setdefault((run_id, name), RunScore(run_id, name, ""))
                        summary.fingerprint, summary.stale = fp.digest, 0
                    with STAGE.timed("read the samples to grade"):
                        regrade = rebuilt_image_samples(wh, verifier, fp.digest, run_ids)
                        samples = Samples(
                            wh.samples_to_score(
                                name,
                                fp.digest,
                                run_ids=run_ids,
                                retry=retry,
                                max_attempt=max_attempt,
                                skip_reasons=skip_reasons,
                                state=verifier.reads_state,
                                regrade=regrade,
                            )
                        )
                    STAGE.mark("samples read")
                    label = f"score {name}" + (" (+ retries)" if retry else "")
                    if regrade:
                        label += f" (+ {len(regrade)} whose task image was rebuilt)"
                    if code_pass:
                        label += " (its code changed while grading: again)"
                    bar = progress.add_task(label, total=len(samples)) if progress else None
                    writer = BatchWriter(
                        str(warehouse_path), name, fp.digest, samples, summaries,
                        lambda n, bar=bar: progress.advance(bar, n) if progress else None,
                        register=lambda wait_s, fp=fp: Warehouse(
                            warehouse_path, lock_timeout_s=wait_s
                        ).register_verifier(fp, current=True),
                        lock_timeout_s=wh.lock_timeout_s,
                    )  # fmt: skip
                    try:
                        stale = stream_grades(
                            pool, verifier, samples, opts, writer, expect=fp.digest,
                            guard=interruptible,
                        )  # fmt: skip
                    except KeyboardInterrupt:
                        if stop_signal() is None:
                            raise
                        raise _stop(wh, summaries, writer, order[position + 1 :], retries) from None
                    finally:
                        with STAGE.timed("wait for the write in flight (grading done)"):
                            writer.settle()
                    with STAGE.timed("the last write (grading done)"):
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
    writer: BatchWriter | None,
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
    """`scorers.workers.stage.grade_batch` of `samples` (dicts: the samples_to_score columns):
    one result per sample, in order; a stop noted inside `stop_softly()` ends a chunk graded
    in this process.

    Raises:
        CodeChanged: with `expect`, some samples were still graded by other code at the end.
    """
    if not isinstance(samples, Samples):
        samples = Samples.from_dicts(samples)
    return _grade_batch(
        pool, verifier, samples, opts, advance, in_process=in_process, expect=expect,
        guard=interruptible,
    )  # fmt: skip


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


class UnreadableLogs(Exception):
    """Some logs given to `score_flow`, or samples of them, could not be read: its run ends
    Failed, as the command exits 2. What could be read was scored: `summaries` (a ScoreSummaries
    whose `.problems` say what could not, one line each)."""

    def __init__(self, summaries: ScoreSummaries) -> None:
        problems = summaries.problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0] if problems else 'a log could not be read'}{more}")
        self.summaries = summaries

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt from its summaries, not its message
        return (type(self), (self.summaries,))


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


def _label_score_run(
    warehouse: str, ingested: Sequence[Any], plan: dict[str, list[str]]
) -> threading.Thread | None:
    """Name the score flow run for what it scores, `score math_verified · demo-v2 (26
    samples)`, and tag it with the tasks, models and verifiers (once the logs are ingested).

    The name and tags are read here (the warehouse, before any write of the stage); the call to
    the Prefect server that sets them is made on a thread (returned: join it before the run
    ends), beside the stage's start rather than before its first chunk.

    A model is called what the sweep that generated its log called it (`_model_labels`), so
    the UI's `model:` filter finds its sweep, generation and scoring under one tag; a log from
    elsewhere, by its model."""
    runs = [r for r in ingested if r.run_id in plan]
    if not runs:
        return None
    labels = _model_labels(warehouse, [r.run_id for r in runs])
    tasks = [r.task or "?" for r in runs]
    models = [labels.get(r.run_id) or (r.model or "?").rsplit("/", 1)[-1] for r in runs]
    samples = count(sum(r.samples_total for r in runs), "sample")
    what = f"{listed(tasks)} · {listed(models)}"
    name = (
        f"score {what} ({samples})"
        if len(runs) == 1
        else f"score {len(runs)} runs: {what} ({samples})"
    )
    verifiers = sorted({v for names in plan.values() for v in names})
    tags = [
        *(tag("task", t) for t in dict.fromkeys(tasks)),
        *(tag("model", labels.get(r.run_id) or r.model or "?") for r in runs),
        *(tag("verifier", v) for v in verifiers),
    ]
    # the run's context is a contextvar: the thread runs in a copy of it. A daemon: a second
    # Ctrl-C, which exits at once, is not held up by a slow server
    labeling = threading.Thread(
        target=contextvars.copy_context().run, args=(label_run, name, tags),
        name="label-run", daemon=True,
    )  # fmt: skip
    labeling.start()
    return labeling


# how long the end of a score flow run waits for its naming call (a server that does not answer
# leaves the run with its first name; the stage's results are written either way)
LABEL_WAIT_S = 10.0


def _model_labels(warehouse: str, run_ids: list[str]) -> dict[str, str]:
    """run_id -> the model's name in the sweep config that generated the run's log, which
    gradebook's generate records in the log's metadata (`gradebook_model`) and tags the sweep's
    runs with; runs without one (logs from elsewhere) are left out."""
    import duckdb

    from warehouse import Warehouse, WarehouseError

    try:
        with Warehouse(warehouse).read() as con:
            rows = con.execute(
                "SELECT run_id, eval_spec->'metadata'->>'gradebook_model' FROM runs "
                "WHERE list_contains(?::VARCHAR[], run_id)",
                [run_ids],
            ).fetchall()
    except (WarehouseError, duckdb.Error):  # a name is not worth failing the stage for
        return {}
    return {run_id: label for run_id, label in rows if label}


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
        The summaries per (run, verifier). A log or sample the ingest could not read ends the
        run Failed with `UnreadableLogs` (what was readable is scored; its `.summaries.problems`
        name each one). A stop (SIGINT, SIGTERM) writes what was graded and ends the run
        Cancelled, with the summaries (`.stopped`, `.left`) as its data. `run_score` returns
        the summaries in both cases.
    """
    STAGE.mark("flow body start")
    opts = ScoreOptions(workers=workers, chunk_size=chunk_size, progress=progress)
    pool = scoring_pool(opts)
    labeling: threading.Thread | None = None
    # SIGINT/SIGTERM stop the stage in order (inside the flow run: Prefect's engine installs its
    # own SIGTERM handler, which would crash the run and drop what was graded)
    with stop_on_signals():
        try:
            try:
                # big logs, and judges: start the workers first, so that their start-up
                # overlaps the ingest
                with STAGE.timed("start the workers"):
                    early = verifiers_for(logs, verifiers)
                    if starts_early(logs, warm_preload(early), opts.chunk_size):
                        start_for(pool, early)
                with STAGE.timed("ingest (a task run)"):
                    plan, ingested = ingest_task(warehouse, logs, verifiers)
                with STAGE.timed("name the flow run"):
                    labeling = _label_score_run(warehouse, ingested, plan)
                summaries = score_runs(
                    warehouse, plan, opts, pool, retry="all" if retry_unscored else None
                )
                STAGE.mark("stage done")
            finally:
                with STAGE.timed("close the pool"):
                    pool.close()
                if labeling is not None:
                    labeling.join(LABEL_WAIT_S)
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

        write_scored_logs(warehouse, logs, scored_log_dir, problems)
    STAGE.mark("flow body end")
    if problems:
        # the command exits 2 on these: its run says so too, not Completed
        unreadable = UnreadableLogs(ScoreSummaries(summaries, problems))
        return Failed(message=f"could not read all it was given: {unreadable}", data=unreadable)
    return ScoreSummaries(summaries, problems)


def stopped_run(signum: int, line: str, result: Any) -> Any:
    """The state a flow run ends in when a stop ended its stage: Cancelled, its message the
    stop's `line` (`stop_line`), with `result` (what `run_score` and the like hand back)."""
    return Cancelled(message=f"stopped by {signal_name(signum)}: {line}", data=result)


def run_score(
    logs: list[str], warehouse: str = "gradebook.duckdb", **options: Any
) -> ScoreSummaries:
    """Run `score_flow` and return its summaries, also when a signal stopped it (the flow run
    then ends Cancelled, and `.stopped` says which signal) and when some logs or samples could
    not be read (the run ends Failed, and `.problems` names them); other failures raise as the
    flow did."""
    state = score_flow(logs, warehouse, **options, return_state=True)
    if state.is_failed():
        failure = state.result(raise_on_failure=False)
        if isinstance(failure, UnreadableLogs):
            return failure.summaries
    return finished_result(state, ScoreSummaries)
