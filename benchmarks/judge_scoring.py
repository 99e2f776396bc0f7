"""Judge-graded scoring: `gradebook score` with model_graded_qa against `inspect score`, same judge.

    .venv/bin/python benchmarks/judge_scoring.py [--quick] [--json PATH] [--samples N]

Both sides grade the same log with Inspect's `model_graded_qa`, bound to the same local
OpenAI-compatible judge (`openai-api/judge/judge`: max_connections 32, max_retries 3, timeout
10) that answers every request after a fixed 50 ms. Both run as a user runs them, as
subprocesses timed by wall time: `gradebook score LOG --verifier model_graded_qa
--verifier-module SPEC` (SPEC: the scorer spec as JSON, its `grader` role bound to the judge)
against a warm local Prefect server, and `inspect score LOG --scorer model_graded_qa
--model-role grader={model, max_connections, max_retries, timeout}` (the judge's base URL
from JUDGE_BASE_URL, as Inspect reads it for `openai-api/judge/...`).

Rows:
  - judge throughput on a 100-sample log (a team re-judging yesterday's small runs), every
    judge call answered, the median of 3 alternating pairs (--quick: 1). Bar: >= 1.1x
    `inspect score`, cold (issue 38: both commands pay Inspect's import and start-up hooks,
    most of either run; no grading process outlives the command to hide them).
  - judge throughput (samples/s) on the full log (20,000 samples), every judge call answered.
    Bar: >= 3x `inspect score`. Below ~20,000 samples this bar is under Inspect's own floor
    (its import, and the 3 s minimum backoff of a failed call), so it is set at 20,000.
  - time to finish when 10% of the samples' first judge calls fail with HTTP 500 (the retry of
    the same prompt is answered). Bar: >= 3x `inspect score` (its ratio: anchor s / ours).
  - with those failures, samples lost (not scored, or unscored) in the warehouse, read back
    from `current_scores`. Bar: 0.
  - with those failures, requests the generation server received while scoring. Bar: 0. The
    server the log was generated against runs during every measured command, and the log's
    model (`openai-api/gen/gen`) is pointed at it, so a call to the model under test would be
    counted, not refused.

Both sides must agree, or the run stops: `inspect score` scores every sample, so does gradebook
when the judge does not fail, and both find as many correct answers. The judge's verdict is a function of
the prompt (C when the submission holds the criterion), so it is the same on both sides.

The servers (sweeps/mock_server.py) run in this script's process; the measured commands are
subprocesses, so neither shares a GIL with them. The log (a QA task of distinct arithmetic
questions, 80% answered right, generated with a real `eval()` against the generation server)
is cached in .bench/ (gitignored).

--quick: the 100-sample log only: its row (judged: it is the same measurement as the full run's),
and the failure-mode pair on it, whose time-to-finish ratio says "see the full run" (its bar is
set for 20,000 samples) while its samples lost and generator calls are judged.
docs/benchmarks/judge-scoring.md has the latest table.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the project: benchmarks/warehouse.py

from _common import Row, emit, judged, stage_args, use_bench_prefect  # noqa: E402
from _machine import load_average, load_note, machine_state  # noqa: E402

CACHE = ROOT / ".bench"
SCORER = "model_graded_qa"
JUDGE = "openai-api/judge/judge"
GENERATOR = "openai-api/gen/gen"
JUDGE_DELAY_S = 0.05
JUDGE_CONFIG = {"max_connections": 32, "max_retries": 3, "timeout": 10}
GRADEBOOK = [str(Path(sys.executable).parent / "gradebook")]  # the console script, as users run it
FAIL_EVERY = 10  # in the failure mode, the first judge call of every 10th question fails
SMALL_N = 100  # the small-log row's samples
SMALL_ROUNDS = 3  # its pairs in the full run, alternating (a small log's seconds are noisy)
# building a log, the longest wait for the generation server's next answer that is not a stall:
# it answers every ~15 ms at 64 connections; Inspect's start-up before the first request is
# seconds, on a loaded machine tens of seconds
STALL_S = 120.0
_QUESTION = re.compile(r"Question (\d+): what is (\d+) plus (\d+)\?")


def _question(i: int) -> tuple[str, int]:
    a, b = i, (7 * i) % 97
    return f"Question {i}: what is {a} plus {b}?", a + b


def _task(n: int):
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate

    samples = [
        Sample(id=i, input=q, target=str(t)) for i in range(1, n + 1) for q, t in [_question(i)]
    ]
    return Task(
        dataset=MemoryDataset(samples, name="judge_bench"),
        solver=generate(),
        scorer=None,
        name="judge_bench",
    )


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


def _answer(model: str, messages: list[dict[str, Any]]) -> str:
    """The generation server: right for 4 questions in 5, one off for the fifth."""
    found = _QUESTION.search(_text(messages))
    if found is None:
        return "I do not know."
    i, a, b = (int(g) for g in found.groups())
    return f"The answer is {a + b + (1 if i % 5 == 0 else 0)}."


def _verdict(prompt: str) -> str:
    """C when the submission holds the criterion as a number, else I: a function of the
    prompt alone, so both sides get the same verdicts."""
    submission = re.search(r"\[Submission\]: (.*?)\n\*\*\*", prompt, re.S)
    criterion = re.search(r"\[Criterion\]: (.*?)\n\*\*\*", prompt, re.S)
    if submission is None or criterion is None:
        return "The data is missing.\n\nGRADE: I"
    ok = re.search(rf"(?<!\d){re.escape(criterion.group(1).strip())}(?!\d)", submission.group(1))
    return f"Checked the number.\n\nGRADE: {'C' if ok else 'I'}"


def judge_script(failing: bool) -> Callable[[str, list[dict[str, Any]]], str | int]:
    """The judge: 50 ms, then a verdict; when `failing`, HTTP 500 for the first request of
    every FAIL_EVERY-th question (its retry is answered)."""
    failed: set[int] = set()
    lock = threading.Lock()

    def script(model: str, messages: list[dict[str, Any]]) -> str | int:
        time.sleep(JUDGE_DELAY_S)
        prompt = _text(messages)
        if failing and (found := _QUESTION.search(prompt)):
            i = int(found.group(1))
            if i % FAIL_EVERY == 0:
                with lock:
                    if i not in failed:
                        failed.add(i)
                        return 500
        return _verdict(prompt)

    return script


@contextmanager
def servers(failing: bool) -> Iterator[tuple[Any, Any]]:
    """(judge, generation server), both counting requests, for one measured command."""
    # sweeps.mock_server listens with a real server's backlog: a burst of 32 connections
    # would otherwise stall on SYN retries, and the stalls would be measured
    from sweeps.mock_server import scripted_server

    with (
        scripted_server(judge_script(failing), models=["judge"]) as judge,
        scripted_server(_answer, models=["gen"]) as gen,
    ):
        yield judge, gen


def _env(judge: Any, gen: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        JUDGE_BASE_URL=judge.base_url,
        JUDGE_API_KEY="bench",
        GEN_BASE_URL=gen.base_url,
        GEN_API_KEY="bench",
    )
    return env


def build_log(n: int, cache: Path = CACHE) -> Path:
    """An n-sample log generated by a real eval() against the generation server, no scores.

    The eval gets a model of its own (not memoized): Inspect memoizes `openai-api/gen/gen` under
    its name and config, not the GEN_BASE_URL it read, so a second build in this process got
    the first build's model, bound to the first server (stopped by then), and retried its port
    in ever longer backoffs at 0% CPU (the cold-cache hang of issue 38). The URL stays in
    GEN_BASE_URL, not in the log (an explicit base URL would be recorded, and `inspect score`
    would rebuild the log's model against this build's server, gone when scoring: a generator
    call would be refused, not counted). A stall past STALL_S stops the build with a line
    saying what it waited on."""
    path = cache / f"judge_qa_{n}.eval"
    if path.exists():
        return path
    import shutil
    from unittest.mock import patch

    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    from sweeps.mock_server import Stalled, watchdog

    cache.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    what = f"eval() generating the {n}-sample log ({GENERATOR})"
    with servers(failing=False) as (judge, gen), tempfile.TemporaryDirectory() as tmp:
        try:
            with (
                patch.dict(os.environ, GEN_BASE_URL=gen.base_url, GEN_API_KEY="bench"),
                watchdog(gen, waiting=what, quiet_s=STALL_S, until=n),
            ):
                logs = inspect_eval(
                    _task(n),
                    model=get_model(GENERATOR, memoize=False),
                    score=False,
                    log_dir=tmp,
                    display="none",
                    max_connections=64,
                    max_samples=256,
                )
        except Stalled as stalled:
            raise SystemExit(str(stalled)) from None
        (log,) = logs
        errors = [s.error.message for s in log.samples or [] if s.error]
        if log.status != "success" or len(log.samples or []) != n or errors:
            raise SystemExit(f"generating the log failed: {log.status}, errors {errors[:1]}")
        shutil.move(log.location, path)
    print(f"generated {n} samples in {time.perf_counter() - t0:.0f}s -> {path}")
    return path


def _run(what: str, cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"{what} failed (exit {proc.returncode}): {' / '.join(tail)}")
    return seconds


class Side:
    """One measured command: seconds, what it scored, and what the servers saw meanwhile."""

    def __init__(self, seconds: float, scored: int, lost: int, correct: int, judge: Any,
                 gen_calls: int, why_lost: dict[str, int] | None = None) -> None:  # fmt: skip
        self.seconds, self.scored, self.lost, self.correct = seconds, scored, lost, correct
        self.judge_ok, self.judge_500 = judge.count(200), judge.count(500)
        self.gen_calls, self.why_lost = gen_calls, why_lost or {}


def inspect_side(log: Path, n: int, tmp: Path, failing: bool) -> Side:
    """`inspect score` with the judge as the grader role, writing a scored copy of the log."""
    from inspect_ai.log import read_eval_log

    # a new file each time: `inspect score` asks before overwriting one, and a run has no stdin
    out = tmp / f"inspect-{n}-{'failing' if failing else 'ok'}-{time.monotonic_ns()}{log.suffix}"
    role = json.dumps({"model": JUDGE, **JUDGE_CONFIG})
    with servers(failing) as (judge, gen):
        seconds = _run(
            "inspect score",
            [sys.executable, "-m", "inspect_ai", "score", str(log), "--scorer", SCORER,
             "--model-role", f"grader={role}", "--action", "append", "--output-file", str(out),
             "--display", "none"],
            _env(judge, gen), tmp,
        )  # fmt: skip
        scored_log = read_eval_log(str(out))
        values = [
            s.scores[SCORER].value for s in scored_log.samples or [] if SCORER in (s.scores or {})
        ]
        side = Side(seconds, len(values), n - len(values), values.count("C"), judge, gen.count())
    return side


def spec(judge_url: str) -> str:
    """The scorer spec `--verifier-module` takes: model_graded_qa with the judge bound."""
    role = {"model": JUDGE, "base_url": judge_url, "args": {}, "config": JUDGE_CONFIG}
    return json.dumps(
        {"kind": "registry", "scorer": SCORER, "params": {}, "roles": {"grader": role}}
    )


def _warehouse_counts(db: Path, n: int) -> tuple[int, int, dict[str, int]]:
    """(scored, correct, {status/reason: samples} of the rest) of the verifier's current
    scores, read back from the warehouse; a sample with no current score is "missing"."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT status, reason, count(*), count(*) FILTER (value = 1) FROM current_scores "
            "WHERE scorer = ? GROUP BY ALL",
            [SCORER],
        ).fetchall()
    scored = sum(k for status, _, k, _ in rows if status == "scored")
    correct = sum(c for status, _, _, c in rows if status == "scored")
    rest = {f"{status}/{reason}": k for status, reason, k, _ in rows if status != "scored"}
    if (missing := n - sum(k for _, _, k, _ in rows)) > 0:
        rest["missing"] = missing
    return scored, correct, rest


def gradebook_side(log: Path, n: int, tmp: Path, failing: bool, workers: int) -> Side:
    """`gradebook score` into a fresh warehouse (ingest included), against the warm server."""
    db = tmp / f"gradebook-{n}-{'failing' if failing else 'ok'}-{time.monotonic_ns()}.duckdb"
    with servers(failing) as (judge, gen):
        seconds = _run(
            "gradebook score",
            [*GRADEBOOK, "score", str(log), "--db", str(db), "--verifier", SCORER,
             "--verifier-module", spec(judge.base_url), "--workers", str(workers)],
            _env(judge, gen), tmp,
        )  # fmt: skip
        gen_calls = gen.count()
        scored, correct, rest = _warehouse_counts(db, n)
        return Side(seconds, scored, n - scored, correct, judge, gen_calls, rest)


def _check(side: Side, anchor: Side, n: int, what: str, *, complete: bool) -> None:
    """Both sides must have graded every sample alike, or a ratio would compare other work.
    With `complete`, a gradebook sample left unscored stops the run too (with failures, the
    lost samples are a row of their own)."""
    if anchor.scored != n:
        raise SystemExit(f"inspect score ({what}) scored {anchor.scored} of {n} samples")
    if complete and side.lost:
        raise SystemExit(f"gradebook score ({what}) left {side.lost} of {n} samples without a "
                         f"score: {side.why_lost}")  # fmt: skip
    if side.correct != anchor.correct and side.scored == n:
        raise SystemExit(
            f"{what}: gradebook found {side.correct} correct, inspect score {anchor.correct}"
        )


def main() -> None:
    args, n = stage_args(
        __doc__.splitlines()[0],
        f"the {SMALL_N}-sample log only: its row, and the failure-mode pair on it (a smoke run "
        "under a minute; the 20,000-sample bars are the full run's)",
        quick_n=SMALL_N,
        full_n=20_000,
    )
    use_bench_prefect(CACHE)
    from flows.runtime.background_server import ensure_server, find_server, stop_server

    small, log = build_log(SMALL_N), build_log(n)
    at_start = machine_state()  # who else is using the cores: the rows say so when not quiet
    running = find_server() is not None
    ensure_server()  # warm: both gradebook runs find it, as a user's second command does
    sides: dict[str, Side] = {}
    small_pairs: list[tuple[Side, Side]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            for _ in range(1 if args.quick else SMALL_ROUNDS):  # taking turns: load drifts
                a_small = inspect_side(small, SMALL_N, tmp, failing=False)
                g_small = gradebook_side(small, SMALL_N, tmp, False, args.workers)
                _check(g_small, a_small, SMALL_N, f"{SMALL_N} samples", complete=True)
                small_pairs.append((g_small, a_small))
            if not args.quick:
                sides["inspect score"] = inspect_side(log, n, tmp, failing=False)
                sides["gradebook score"] = gradebook_side(log, n, tmp, False, args.workers)
                _check(sides["gradebook score"], sides["inspect score"], n, "no failures",
                       complete=True)  # fmt: skip
            a_fail = sides["inspect score, failing"] = inspect_side(log, n, tmp, failing=True)
            g_fail = sides["gradebook score, failing"] = gradebook_side(
                log, n, tmp, True, args.workers
            )
            _check(g_fail, a_fail, n, "10% failing", complete=False)
    finally:
        if not running:
            stop_server()  # the local server this script started in its Prefect home
    for i, (g, a) in enumerate(small_pairs, 1):
        sides[f"gradebook score, {SMALL_N} samples, round {i}"] = g
        sides[f"inspect score, {SMALL_N} samples, round {i}"] = a
    for name, s in sides.items():
        lost = f", lost {s.lost} ({s.why_lost})" if s.lost else ""
        print(f"{name}: {s.seconds:.1f}s, scored {s.scored}, correct {s.correct}, judge "
              f"requests 200/500 {s.judge_ok}/{s.judge_500}, generator calls {s.gen_calls}{lost}")  # fmt: skip
    g_s = statistics.median(g.seconds for g, _ in small_pairs)
    a_s = statistics.median(a.seconds for _, a in small_pairs)
    rows = [
        Row(f"judge throughput, {SMALL_N}-sample log, 50 ms judge (median of "
            f"{len(small_pairs)}, taking turns)", SMALL_N / g_s, "samples/s", "inspect score",
            SMALL_N / a_s, a_s / g_s, ">= 1.1x inspect score, cold", a_s / g_s >= 1.1),
    ]  # fmt: skip
    if not args.quick:
        a_ok, g_ok = sides["inspect score"], sides["gradebook score"]
        ratio = a_ok.seconds / g_ok.seconds
        rows.append(
            Row(f"judge throughput, {n:,} samples, max_connections 32", n / g_ok.seconds,
                "samples/s", "inspect score", n / a_ok.seconds, ratio,
                ">= 3x inspect score at 20,000 samples", ratio >= 3)
        )  # fmt: skip
    ratio = a_fail.seconds / g_fail.seconds
    rows += [
        judged(f"time to finish, {n:,} samples, 10% of judge calls failing once",
               g_fail.seconds, "s", "inspect score", a_fail.seconds, ratio,
               ">= 3x inspect score (anchor s / ours) at 20,000 samples", ratio >= 3,
               judge=not args.quick),
        Row("samples lost (not scored or unscored), 10% failing", g_fail.lost, "samples",
            "inspect score", a_fail.lost, g_fail.lost / max(a_fail.lost, 1), "0",
            g_fail.lost == 0),
        Row("generator calls during scoring, 10% failing", g_fail.gen_calls, "requests",
            "inspect score", a_fail.gen_calls, g_fail.gen_calls / max(a_fail.gen_calls, 1),
            "0", g_fail.gen_calls == 0),
    ]  # fmt: skip
    note = load_note([at_start])
    for row in rows:
        row.note = note
    emit(f"judge-graded scoring, {SCORER} ({n:,} samples, {args.workers} workers)", rows,
         args.json, {"machine_at_start": at_start, "load_at_end": load_average()})  # fmt: skip


if __name__ == "__main__":
    main()
