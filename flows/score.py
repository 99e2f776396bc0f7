"""The scoring stage: saved logs in, score rows out; no model, no generation-time sandbox.

For each verifier registered for a run, the samples that have no score under the verifier's
current fingerprint are read from the warehouse, cut into chunks, and graded in a pool of worker
processes (spawned fresh for each stage run, so an edited verifier module is imported as it is
on disk now). One Prefect task per batch of chunks, not per sample: a task run costs ~10 ms.
The flow's process is the only DuckDB writer (principle 8).

Per-sample fault isolation: a verifier that raises on a sample, or overruns the per-sample time
limit, makes that sample `unscored` (reason "verifier_error" / "timeout", with a short
traceback in the row's metadata); the other samples are scored. A sample whose generation
errored gets a status "error" row without calling the verifier.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from prefect import flow, task
from prefect.cache_policies import NONE as NO_CACHE

from flows.console import progress_bar
from scorers.grade import Grade, SampleView, unscored
from scorers.registry import Verifier, get_verifier

__all__ = [
    "DEFAULT_CHUNK",
    "RunScore",
    "ScoreOptions",
    "score_flow",
    "score_runs",
    "scoring_pool",
    "verifiers_of_log",
]

DEFAULT_CHUNK = 250  # samples per worker call: large enough to amortise pickling
BATCH_CHUNKS = 16  # chunks per Prefect task run (one warehouse write per batch)
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
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        self.written += 1
        status = row["status"]
        if status == "scored":
            self.scored += 1
            self.correct += row["value"] == 1.0
        elif status == "unscored":
            self.unscored += 1
            self.reasons[row["reason"]] = self.reasons.get(row["reason"], 0) + 1
        else:
            self.error += 1


# -- worker side ---------------------------------------------------------------------------------


class _SampleTimeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SampleTimeout


def _short_traceback(exc: BaseException, limit: int = 1500) -> str:
    text = "".join(traceback.format_exception(exc, limit=-4)).strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def grade_one(grade: Callable[[SampleView], Grade], view: SampleView, timeout_s: float) -> Grade:
    """Call a verifier on one sample; never raises (a failure becomes an unscored Grade)."""
    use_alarm = timeout_s > 0 and hasattr(signal, "setitimer")
    try:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        result = grade(view)
        if not isinstance(result, Grade):
            return unscored(
                "verifier_error", f"verifier returned {type(result).__name__}, not a Grade"
            )
        return result
    except _SampleTimeout:
        return unscored("timeout", f"verifier did not finish within {timeout_s:g}s")
    except Exception as exc:
        return unscored(
            "verifier_error",
            f"verifier raised {type(exc).__name__}: {str(exc)[:200]}",
            traceback=_short_traceback(exc),
        )
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)


def grade_chunk(
    grade: Callable[[SampleView], Grade], rows: list[dict[str, Any]], timeout_s: float
) -> list[tuple[str, float | None, str | None, str, str, str, float]]:
    """Worker entry point: grade rows (dicts of the samples_to_score columns).

    Returns one compact tuple per row (status, value, answer, explanation, reason, metadata
    JSON, seconds), in order; the parent adds the key columns back.
    """
    if timeout_s > 0 and hasattr(signal, "setitimer"):
        signal.signal(signal.SIGALRM, _on_alarm)
    out = []
    for row in rows:
        t0 = time.perf_counter()
        view = SampleView(
            completion=row["completion"] or "",
            target=list(row["target"] or []),
            metadata=_loads(row["metadata"]),
            sample_id=row["sample_id"],
        )
        g = grade_one(grade, view, timeout_s)
        value = g.value if g.status == "scored" else None
        if value is not None and math.isnan(value):
            value = None
        out.append(
            (
                g.status,
                value,
                g.answer,
                g.explanation,
                g.reason,
                json.dumps(g.metadata, default=str) if g.metadata else "{}",
                time.perf_counter() - t0,
            )
        )
    return out


def _loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


# -- parent side ---------------------------------------------------------------------------------


def _error_row(row: dict[str, Any]) -> tuple[str, None, None, str, str, str, float]:
    first_line = (row["error"] or "").strip().splitlines()[0:1] or ["generation failed"]
    return ("error", None, None, first_line[0][:300], "generation_error", "{}", 0.0)


def _to_table(
    keys: list[dict[str, Any]], results: list[tuple], scorer: str, digest: str
) -> pa.Table:
    from warehouse import SCORE_SCHEMA

    now = datetime.now(UTC)
    cols = list(zip(*results, strict=True)) if results else [()] * 7
    return pa.Table.from_pydict(
        {
            "run_id": [k["run_id"] for k in keys],
            "sample_id": [k["sample_id"] for k in keys],
            "epoch": [k["epoch"] for k in keys],
            "scorer": [scorer] * len(keys),
            "fingerprint": [digest] * len(keys),
            "status": list(cols[0]),
            "value": list(cols[1]),
            "answer": list(cols[2]),
            "explanation": list(cols[3]),
            "reason": list(cols[4]),
            "metadata": list(cols[5]),
            "scored_at": [now] * len(keys),
            "duration_s": list(cols[6]),
        },
        schema=SCORE_SCHEMA,
    )


def _chunks(rows: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


def _warm_worker(modules: tuple[str, ...]) -> None:
    import importlib

    for name in modules:
        module = importlib.import_module(name)
        # a verifier module may offer warm_up() (e.g. math starts its symbolic worker)
        warm_up = getattr(module, "warm_up", None)
        if callable(warm_up):
            warm_up()


class _Pool:
    """A process pool that is rebuilt if a worker dies (segfault, OOM kill)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def get(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: workers import verifier modules fresh from disk (an edited
            # verifier is what gets run) and inherit sys.path as it is now.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        return self._pool

    def warm(self, modules: Sequence[str]) -> None:
        """Start the workers now and import the verifier modules in them (not awaited), so
        their start-up overlaps whatever the caller does next (ingest, reading samples)."""
        if self.workers <= 1:
            return
        pool = self.get()
        for _ in range(self.workers):
            pool.submit(_warm_worker, tuple(modules))

    def reset(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _grade_batch(
    pool: _Pool,
    verifier: Verifier,
    rows: list[dict[str, Any]],
    opts: ScoreOptions,
    advance: Callable[[int], None],
    *,
    in_process: bool = True,
) -> list[tuple]:
    results: list[tuple | None] = [None] * len(rows)
    todo: list[int] = []
    for i, row in enumerate(rows):
        if row["error"] is not None:
            results[i] = _error_row(row)
            advance(1)
        else:
            todo.append(i)
    idx_chunks = [todo[i : i + opts.chunk_size] for i in range(0, len(todo), opts.chunk_size)]
    # one chunk or one worker: spawning processes (each imports the verifier stack, ~1-2 s)
    # costs more than it saves -- unless this process holds stale verifier code
    if idx_chunks and in_process and (pool.workers <= 1 or len(idx_chunks) == 1):
        for idx in idx_chunks:
            graded = grade_chunk(verifier.grade, [rows[i] for i in idx], opts.sample_timeout_s)
            for i, r in zip(idx, graded, strict=True):
                results[i] = r
            advance(len(idx))
        return results  # type: ignore[return-value]
    futures: dict[Future, list[int]] = {}
    for idx in idx_chunks:
        fut = pool.get().submit(
            grade_chunk, verifier.grade, [rows[i] for i in idx], opts.sample_timeout_s
        )
        futures[fut] = idx
    for fut in as_completed(futures):
        idx = futures[fut]
        try:
            graded = fut.result()
        except BrokenProcessPool as exc:
            # a worker died (crash, OOM kill): those samples are unscored, the stage goes on
            pool.reset()
            why = f"scoring worker died: {exc}"[:300]
            graded = [("unscored", None, None, why, "verifier_error", "{}", 0.0)] * len(idx)
        except Exception as exc:  # e.g. the verifier could not be unpickled in the worker
            why = f"scoring worker failed: {type(exc).__name__}: {exc}"[:300]
            meta = json.dumps({"traceback": _short_traceback(exc)})
            graded = [("unscored", None, None, why, "verifier_error", meta, 0.0)] * len(idx)
        for i, r in zip(idx, graded, strict=True):
            results[i] = r
        advance(len(idx))
    return results  # type: ignore[return-value]


# The first fingerprint this process saw per verifier. A different one later means the module
# was edited after this process imported it: its in-memory code is stale, so grading must go to
# freshly spawned workers, which import the module as it is on disk now.
_FIRST_DIGEST: dict[str, str] = {}


class Bulk:
    """Hands a bulk value to or from a Prefect task without Prefect walking it.

    Prefect visits every item of list and dict parameters looking for futures: ~1 s for a
    batch of 4,000 sample dicts. An object it does not know is passed through untouched.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Bulk({len(self.value)} items)"


@task(name="score-batch", cache_policy=NO_CACHE, task_run_name="score {scorer} ({n} samples)")
def score_batch(
    warehouse_path: str,
    scorer: str,
    digest: str,
    rows: Bulk,
    n: int,
    opts: ScoreOptions,
    pool: Any,
    advance: Any,
) -> Bulk:
    """Prefect task: grade one batch of chunks in the pool and write it (one transaction).

    Returns:
        Bulk of the written rows' (run_id, status, value, reason) dicts.
    """
    from warehouse import Warehouse

    verifier = get_verifier(scorer)
    in_process = _FIRST_DIGEST.setdefault(scorer, digest) == digest
    results = _grade_batch(pool, verifier, rows.value, opts, advance, in_process=in_process)
    table = _to_table(rows.value, results, scorer, digest)
    written = Warehouse(warehouse_path).write_scores(table)
    # the summary counts what was written; a duplicate written by a concurrent stage is not ours
    out = table.select(["run_id", "status", "value", "reason"]).to_pylist()
    return Bulk(out if written == table.num_rows else out[:written])


def score_runs(
    warehouse_path: str | Path,
    plan: dict[str, list[str]],
    opts: ScoreOptions | None = None,
    pool: _Pool | None = None,
) -> list[RunScore]:
    """Score every run with its verifiers; skip samples already scored by the same fingerprint.

    Args:
        warehouse_path: the DuckDB file (the runs must be ingested already).
        plan: run_id -> names of the verifiers that score it.
        opts: pool size, chunking and limits.
        pool: a worker pool already started (and warmed) by the caller, who closes it.

    Returns:
        One RunScore per (run, verifier) that had anything to do, and zero-count ones for the
        rest, so a caller can show that nothing was left to score.
    """
    from scorers.fingerprint import fingerprint
    from warehouse import Warehouse

    opts = opts or ScoreOptions()
    wh = Warehouse(warehouse_path)
    by_scorer: dict[str, list[str]] = {}
    for run_id, names in plan.items():
        for name in names:
            by_scorer.setdefault(name, []).append(run_id)
    summaries: dict[tuple[str, str], RunScore] = {}
    own_pool = pool is None
    pool = pool or _Pool(_workers(opts))
    try:
        with progress_bar() if opts.progress else _null_progress() as progress:
            for name, run_ids in by_scorer.items():
                verifier = get_verifier(name)
                fp = fingerprint(verifier)
                wh.register_verifier(fp)
                for run_id in run_ids:
                    summaries[(run_id, name)] = RunScore(run_id, name, fp.digest)
                rows = wh.samples_to_score(name, fp.digest, run_ids=run_ids).to_pylist()
                bar = progress.add_task(f"score {name}", total=len(rows)) if progress else None

                def advance(n: int, bar: Any = bar) -> None:
                    if progress is not None and bar is not None:
                        progress.advance(bar, n)

                batch = opts.chunk_size * BATCH_CHUNKS
                for part in _chunks(rows, batch):
                    written = score_batch(
                        str(warehouse_path),
                        name,
                        fp.digest,
                        Bulk(part),
                        len(part),
                        opts,
                        pool,
                        advance,
                    )
                    for row in written.value:
                        summaries[(row["run_id"], name)].add(row)
    finally:
        if own_pool:
            pool.close()
    return list(summaries.values())


def _workers(opts: ScoreOptions) -> int:
    return max(1, opts.workers or os.cpu_count() or 1)


def scoring_pool(opts: ScoreOptions) -> _Pool:
    """A worker pool for `score_runs` that a caller can `warm()` early and must `close()`."""
    return _Pool(_workers(opts))


class _null_progress:  # noqa: N801 - used like a context manager function
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def verifiers_of_log(path: str | Path) -> tuple[str, list[str]]:
    """The run id of a log and the verifiers gradebook's generate stage recorded in it.

    Raises:
        ValueError: the log was not written by `gradebook generate` and names no verifiers.
    """
    from inspect_ai.log import read_eval_log

    log = read_eval_log(str(path), header_only=True)
    names = (log.eval.metadata or {}).get("verifiers") or []
    return log.eval.eval_id, [str(n) for n in names]


def ingest_and_plan(
    warehouse_path: str | Path, logs: Sequence[str | Path], verifiers: Iterable[str] | None
) -> tuple[dict[str, list[str]], list[Any]]:
    """Ingest logs and decide which verifiers score each; returns (plan, ingest results)."""
    from warehouse import Warehouse

    results = Warehouse(warehouse_path).ingest_logs([str(p) for p in logs])
    chosen = list(verifiers or [])
    plan: dict[str, list[str]] = {}
    for res in results:
        if res.error or not res.run_id:
            continue
        names = chosen
        if not names:
            _, names = verifiers_of_log(res.path)
        if not names:
            raise ValueError(
                f"{res.path}: the log names no verifiers (it was not written by "
                "`gradebook generate`); pass --verifier NAME"
            )
        plan[res.run_id] = names
    return plan, results


def _expected_samples(logs: Sequence[str]) -> int:
    from inspect_ai.log import read_eval_log

    total = 0
    for path in logs:
        try:
            spec = read_eval_log(str(path), header_only=True).eval
        except Exception:  # an unreadable log is reported by ingest, with its name
            continue
        total += (spec.dataset.samples or 0) * (spec.config.epochs or 1)
    return total


def _verifier_modules(logs: Sequence[str], verifiers: Iterable[str] | None) -> list[str]:
    names = set(verifiers or [])
    if not names:
        for path in logs:
            try:
                names.update(verifiers_of_log(path)[1])
            except Exception:  # noqa: S112 - only a warm-up hint; ingest reports bad logs
                continue
    modules = []
    for name in sorted(names):
        try:
            modules.append(get_verifier(name).module)
        except KeyError:
            continue
    return modules


@task(name="ingest", cache_policy=NO_CACHE)
def ingest_task(
    warehouse_path: str, logs: list[str], verifiers: list[str] | None
) -> tuple[dict[str, list[str]], list[Any]]:
    """Prefect task: load logs into the warehouse (idempotent)."""
    return ingest_and_plan(warehouse_path, logs, verifiers)


@flow(name="score", log_prints=False)
def score_flow(
    logs: list[str],
    warehouse: str = "gradebook.duckdb",
    verifiers: list[str] | None = None,
    workers: int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    progress: bool = True,
    scored_log_dir: str | None = None,
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
    """
    opts = ScoreOptions(workers=workers, chunk_size=chunk_size, progress=progress)
    pool = scoring_pool(opts)
    try:
        # big logs: start the workers first, so their imports overlap the ingest
        if _expected_samples(logs) > 2 * opts.chunk_size:
            pool.warm(_verifier_modules(logs, verifiers))
        plan, _ = ingest_task(warehouse, logs, verifiers)
        summaries = score_runs(warehouse, plan, opts, pool)
    finally:
        pool.close()
    if scored_log_dir:
        from flows.scored_log import write_scored_logs

        write_scored_logs(warehouse, logs, Path(scored_log_dir))
    return summaries
