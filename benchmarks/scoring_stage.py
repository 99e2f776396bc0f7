"""Throughput of the `score` flow on a big math log, against two anchors measured in the same run.

    .venv/bin/python benchmarks/scoring_stage.py [--quick] [--json PATH] [--samples N]

Rows:
  - score flow (a real Prefect flow run against a local server, on a log already ingested, so
    its ingest step is the idempotent no-op; ingest is timed as its own row) in samples/s,
    against (a) a bare single-process loop calling `is_correct` on the already-extracted answers
    (bar: >= 1.5x on 2 cores) and (b) `inspect_ai.score()` with the same math scorer on the same
    log (bar: >= 3x).
  - CPU scaling: N busy processes at once against one alone, measured in the same run. It is
    the ceiling for any N-worker speed-up on this machine at that moment (2.0 on two idle
    cores; a shared VM gives less), so the flow row can be read against it.
  - the score flow run again on the same warehouse (nothing left to score): its fixed cost.
  - the fixed overhead of one `gradebook sweep` with one sample, as a subprocess (Prefect start-up
    included), against a bare `inspect eval` of the same one sample in a subprocess; both talk to
    a local OpenAI-compatible server (flows/mock_server.py) and must succeed, or the run stops.

The log is generated once with mockllm (a scripted mix of right and wrong answers over the
bundled math problems, which cover integers, fractions, radicals, sets, matrices...) and cached
in .bench/ (gitignored).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the project: benchmarks/warehouse.py

from _common import Row, emit, stage_args, use_bench_prefect  # noqa: E402

CACHE = ROOT / ".bench"


def _task(n: int):
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate

    import tasks.math as tm

    base = tm.bundled_samples()
    samples = [
        Sample(
            id=f"{base[i % len(base)].id}-{i}",
            input=base[i % len(base)].input,
            target=base[i % len(base)].target,
        )
        for i in range(n)
    ]
    return Task(
        dataset=MemoryDataset(samples, name="math_bench"), solver=generate(), name="math_bench"
    )


def _outputs():
    from inspect_ai.model import ModelOutput, ModelUsage

    import tasks.math as tm

    scripted = {
        s.input: c for s, c in zip(tm.bundled_samples(), tm.scripted_completions(), strict=True)
    }
    counter = {"i": 0}

    def outputs(input, tools, tool_choice, config):  # noqa: A002
        prompt = " ".join(str(getattr(m, "text", m)) for m in input)
        counter["i"] += 1
        c = next((v for k, v in scripted.items() if k in prompt), None)
        text = "no idea" if c is None else (c.wrong if counter["i"] % 3 == 0 else c.correct)
        return ModelOutput.from_content(model="mockllm/model", content=text).model_copy(
            update={"usage": ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)}
        )

    return outputs


def build_log(n: int) -> Path:
    path = CACHE / f"math_{n}.eval"
    if path.exists():
        return path
    from inspect_ai import eval as inspect_eval

    CACHE.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (log,) = inspect_eval(
            _task(n),
            model="mockllm/model",
            model_args={"custom_outputs": _outputs()},
            score=False,
            log_dir=tmp,
            display="none",
            max_connections=64,
            max_samples=256,
            metadata={"verifiers": ["math"]},
        )
        shutil.move(log.location, path)
    print(f"generated {n} samples in {time.perf_counter() - t0:.0f}s -> {path}")
    return path


def bare_loop(log: Path) -> tuple[float, int]:
    from inspect_ai.log import read_eval_log

    from scorers.math import is_correct
    from scorers.math._extract import DEFAULT_PATTERNS, extract_answer

    # read_eval_log_samples re-reads the zip per sample (quadratic on a 20,000-sample log)
    pairs = [
        (extract_answer(s.output.completion, DEFAULT_PATTERNS), str(s.target))
        for s in read_eval_log(str(log)).samples or []
    ]
    t0 = time.perf_counter()
    correct = sum(is_correct(a, t) for a, t in pairs)
    return time.perf_counter() - t0, correct


def inspect_score(log: Path) -> float:
    from inspect_ai import score
    from inspect_ai.log import read_eval_log

    from scorers.math import math_verifier

    t0 = time.perf_counter()
    read = read_eval_log(str(log))
    score(read, scorers=math_verifier(), action="append", display="none")
    return time.perf_counter() - t0


def flow_score(log: Path, workers: int) -> tuple[float, float, int]:
    from flows.runtime.console import quiet_prefect
    from flows.score import ScoreOptions, score_flow, score_runs  # noqa: F401

    quiet_prefect(False)
    from warehouse import Warehouse

    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.duckdb")
        # ingest is timed on its own: the anchors start from samples already in memory too
        t0 = time.perf_counter()
        Warehouse(db).ingest_logs([str(log)])
        ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        summaries = score_flow([str(log)], db, ["math"], workers, progress=False)
        total = time.perf_counter() - t0
        correct = sum(s.correct for s in summaries)
        # the same flow again finds nothing left to score: what is left is its fixed cost
        # (Prefect flow and task runs, the idempotent ingest, fingerprint, the pool's start)
        t0 = time.perf_counter()
        again = score_flow([str(log)], db, ["math"], workers, progress=False)
        fixed_s = time.perf_counter() - t0
        assert sum(s.written for s in again) == 0, "a re-run wrote scores again"
    return total, ingest_s, correct, fixed_s


def _right_answers(model: str, messages: list[dict]) -> str:
    """The local model server's script: the right answer to each bundled math problem."""
    import tasks.math as tm

    prompt = "\n".join(str(m.get("content", "")) for m in messages)
    for sample, scripted in zip(tm.bundled_samples(), tm.scripted_completions(), strict=True):
        if str(sample.input) in prompt:
            return scripted.correct
    return "no idea"


def _succeeded(what: str, proc: subprocess.CompletedProcess, log_dir: Path) -> None:
    """Both sides of the row must be runs that worked: exit 0 and one log whose samples all
    generated (a crash or an offline tokenizer download would time an error instead)."""
    from inspect_ai.log import read_eval_log

    logs = sorted(log_dir.glob("*.eval"))
    if proc.returncode != 0 or len(logs) != 1:
        tail = (proc.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"{what} failed (exit {proc.returncode}): {' / '.join(tail)}")
    log = read_eval_log(str(logs[0]))
    errors = [s.error.message for s in log.samples or [] if s.error]
    if log.status != "success" or not log.samples or errors:
        raise SystemExit(f"{what}: log {log.status}, sample errors {errors[:1]}")


def sweep_overhead(tmp: Path) -> tuple[float, float]:
    """One-sample `gradebook sweep` and `inspect eval` of the bundled math task, both against
    the same local OpenAI-compatible server (flows/mock_server.py), both checked to succeed."""
    from flows.mock_server import scripted_server

    cfg = tmp / "one.toml"
    cfg.write_text(
        'name = "one"\nwarehouse = "one.duckdb"\nlog_dir = "logs"\n'
        '[[models]]\nmodel = "openai-api/local/m"\n'
        '[[tasks]]\ntask = "math_verified"\nlimit = 1\nverifiers = ["math"]\n'
        "[gates]\nmax_regression = 0.5\n"
    )
    gradebook = Path(sys.executable).parent / "gradebook"
    with scripted_server(_right_answers, models=["m"]) as server:
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(LOCAL_BASE_URL=server.base_url, LOCAL_API_KEY="bench")
        t0 = time.perf_counter()
        sweep = subprocess.run([str(gradebook), "sweep", str(cfg)], env=env, capture_output=True)
        sweep_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        inspect = subprocess.run(
            [sys.executable, "-m", "inspect_ai", "eval", "tasks/math.py@math_verified", "--model",
             "openai-api/local/m", "--limit", "1", "--no-score", "--log-dir", str(tmp / "ilogs"),
             "--display", "none"],
            cwd=ROOT, env=env, capture_output=True,
        )  # fmt: skip
        eval_s = time.perf_counter() - t0
    _succeeded("gradebook sweep", sweep, tmp / "logs")
    _succeeded("inspect eval", inspect, tmp / "ilogs")
    return sweep_s, eval_s


def cpu_scaling(workers: int, loops: int = 12_000_000) -> float:
    """Throughput of `workers` CPU-bound processes at once over one alone: the most any
    `workers`-process speed-up can reach on this machine right now (2.0 on 2 idle cores)."""
    code = f"s = 0\nfor i in range({loops}): s += i * i"

    def run(n: int) -> float:
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
        for p in procs:
            p.wait()
        return time.perf_counter() - t0

    alone = run(1)
    return workers * alone / run(workers)


def main() -> None:
    args, n = stage_args(__doc__.splitlines()[0], "2,000 samples; under a minute", quick_n=2_000)
    use_bench_prefect(CACHE)
    from flows.runtime.session import prefect_session

    log = build_log(n)
    scaling = cpu_scaling(args.workers)
    bare_s, bare_correct = bare_loop(log)
    insp_s = inspect_score(log)
    with prefect_session():  # a local server, set up exactly as the CLI's commands do
        flow_s, ingest_s, flow_correct, fixed_s = flow_score(log, args.workers)
    if flow_correct != bare_correct:
        print(f"WARNING: flow found {flow_correct} correct, bare loop {bare_correct}")
    rows = [
        Row("score flow vs bare is_correct loop", n / flow_s, "samples/s",
            "bare loop, 1 process", n / bare_s, bare_s / flow_s,
            f">= 1.5x the bare loop on {args.workers} cores", bare_s / flow_s >= 1.5),
        Row(f"CPU scaling, {args.workers} busy processes (the ceiling for the row above)",
            scaling, "x", "1 process", 1.0, scaling,
            f"informational: {args.workers:.1f} on {args.workers} idle cores", True),
        Row("score flow vs inspect score", n / flow_s, "samples/s", "inspect_ai.score()",
            n / insp_s, insp_s / flow_s, ">= 3x inspect score", insp_s / flow_s >= 3),
        Row("ingest (informational, not in the flow rows)", n / ingest_s, "samples/s",
            "bare loop, 1 process", n / bare_s, bare_s / ingest_s, "informational", True),
        Row("score flow re-run, nothing to score (fixed cost)", fixed_s, "s",
            "score flow, first run", flow_s, fixed_s / flow_s,
            "informational: share of the first run that is fixed cost", True),
    ]  # fmt: skip
    if not args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            sweep_s, eval_s = sweep_overhead(Path(tmp))
        rows.append(
            Row(
                "gradebook sweep, 1 sample (Prefect start-up included)",
                sweep_s,
                "s",
                "inspect eval, 1 sample",
                eval_s,
                sweep_s / eval_s,
                "informational: fixed cost of one sweep",
                True,
            )  # fmt: skip
        )
    from flows.runtime.background_server import stop_server

    stop_server()  # the shared local server this script's commands started in its home
    emit(f"scoring stage ({n:,} samples, {args.workers} workers)", rows, args.json)


if __name__ == "__main__":
    main()
