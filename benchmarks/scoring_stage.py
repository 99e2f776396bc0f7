"""Throughput of the `score` flow on a big math log, against two anchors measured in the same run.

    .venv/bin/python benchmarks/scoring_stage.py [--quick] [--json PATH] [--samples N]
    .venv/bin/python benchmarks/scoring_stage.py --markdown RUN.json [RUN.json ...]

Rows:
  - score flow (a real Prefect flow run against a local server, on a log already ingested, so
    its ingest step is the idempotent no-op; ingest is timed as its own row) in samples/s,
    against the bare loop split over `--workers` processes at once, each with its own sympy
    worker: the same work on every core with no pipeline around it, the honest limit of the
    stage on this machine (bar: >= 0.8x, the median of 3 alternating rounds; --quick runs one
    round on a log that is mostly fixed cost: see the full run). In the full run the bare loop,
    the split loop and the flow run three times each, taking turns, and the row compares their
    medians (each round's ratios are printed too): the load of a shared machine drifts over the
    minutes between two single runs.
  - the same flow against a bare single-process loop calling `is_correct` on the
    already-extracted answers, and the split loop against that loop (what that many processes
    gain on this work at that moment): informational, as the 1-process loop's speed moves
    20-30% with host load. And against `inspect_ai.score()` with the same math scorer on the
    same log (bar: >= 3x). Above 20,000 samples the bare loops grade the 20,000-sample log's
    pairs once per epoch (the same pairs as the big log's), and the inspect score anchor is
    timed on the 20,000-sample log (the big one's first epoch) and compared per sample: on the
    whole log it would take hours; --quick times it on the log's first 200 samples, per sample.
  - peak RSS of the score flow's process tree: the flow's process plus every grading worker,
    zygote and sympy worker it starts, polled from /proc during the flow run (bar: <= 1.5 GB).
    The anchors run in a process of their own, so what they read does not count here.
  - CPU scaling: N busy processes at once against one alone, measured in the same run. It is
    the ceiling for any N-worker speed-up on this machine at that moment (2.0 on two idle
    cores; a shared VM gives less), so the flow row can be read against it.
  - the score flow run again on the same warehouse (nothing left to score): its fixed cost.
  - the fixed overhead of one `gradebook sweep` with one sample, as a subprocess (Prefect start-up
    included), against a bare `inspect eval` of the same one sample in a subprocess; both talk to
    a local OpenAI-compatible server (sweeps/mock_server.py) and must succeed, or the run stops.

Each round also records, in the --json file and the printed tables (issue 41): the machine's
load average and its busiest other processes at the round's start (a row measured while a
round began at load >= 0.5 says so in its `note`), and where the flow's seconds went: its
timeline (Prefect's start, to the first chunk, grading, after the last result, Prefect's end),
the seconds of each step of the stage's process and of its grading workers
(scorers.workers.phases), and CPU seconds per kind of process. `--markdown RUN.json...`
renders the docs tables (docs/benchmarks/scoring-stage.md) from such files.

The log is generated once with mockllm (a scripted mix of right and wrong answers over the
bundled math problems, which cover integers, fractions, radicals, sets, matrices...) and cached
in .bench/ (gitignored). Above 20,000 samples (`--samples 200000`: a multiple of 20,000) it is
the 20,000-sample log's samples repeated as epochs 1..N of a new run, written with Inspect's
own `.eval` recorder and read back with its reader: the same mix of right and wrong, without
a mockllm eval of every sample (most of an hour for 200,000 here).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the project: benchmarks/warehouse.py
sys.path.append(str(ROOT / "tests"))  # warehouse_logs: the repeated-epochs log

from _common import emit, info, judged, stage_args, use_bench_prefect  # noqa: E402
from _machine import load_average, load_note, machine_state  # noqa: E402
from _tree_rss import TreeRss  # noqa: E402

CACHE = ROOT / ".bench"
RSS_BAR_BYTES = 1.5e9


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


# Above this many samples the log is this size's log run for several epochs: generating with
# mockllm costs ~12 ms a sample, and the repeats keep this log's exact mix of right and wrong.
GENERATED_MAX = 20_000
INSPECT_QUICK = 200  # --quick: inspect score on this many samples (it grades ~30x slower)
REPEATS = 3  # the full run: the flow and the bare loop each run this many times, taking turns


def build_log(n: int) -> Path:
    path = CACHE / f"math_{n}.eval"
    if path.exists():
        return path
    if n > GENERATED_MAX:
        from warehouse_logs import repeated_epochs

        template, epochs = build_log(GENERATED_MAX), n // GENERATED_MAX
        t0 = time.perf_counter()
        repeated_epochs(template, epochs, path)
        print(f"wrote {n} samples ({GENERATED_MAX} x {epochs} epochs) in "
              f"{time.perf_counter() - t0:.0f}s -> {path}")  # fmt: skip
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


def _read(log: Path) -> tuple[Any, float]:
    """The log as Inspect's reader returns it, and the seconds the read took."""
    from inspect_ai.log import read_eval_log

    t0 = time.perf_counter()
    read = read_eval_log(str(log))
    return read, time.perf_counter() - t0


def bare_loop(samples: list[Any], epochs: int = 1) -> tuple[float, int]:
    """`is_correct` over the samples' extracted answers; `epochs`: over each pair that many
    times (a log built by `repeated_epochs` from these: the same pairs, without reading 200,000
    samples through Inspect's models first)."""
    from scorers.math import is_correct
    from scorers.math._extract import DEFAULT_PATTERNS, extract_answer

    pairs = [
        (extract_answer(s.output.completion, DEFAULT_PATTERNS), str(s.target)) for s in samples
    ] * epochs
    t0 = time.perf_counter()
    correct = sum(is_correct(a, t) for a, t in pairs)
    return time.perf_counter() - t0, correct


def inspect_score(read: Any, read_s: float, limit: int) -> float:
    """Seconds per sample of `inspect_ai.score()` over the first `limit` samples of a log that
    took `read_s` to read (that read's share counted as theirs, as `inspect score` reads)."""
    from inspect_ai import score

    from scorers.math import math_verifier

    share = read_s * limit / len(read.samples)
    read.samples = read.samples[:limit]
    t0 = time.perf_counter()
    score(read, scorers=math_verifier(), action="append", display="none")
    return (share + time.perf_counter() - t0) / limit


_BARE: tuple[list[Any], int] | None = None  # the anchor process's samples and epochs


def anchors(
    bare_log: Path, epochs: int, insp_log: Path, insp_limit: int
) -> tuple[float, int, float]:
    """Both anchors, in the anchor process: (bare loop seconds, its correct count, inspect
    score seconds per sample). A log both use is read once; the bare loop's samples are kept
    for `bare_again`."""
    global _BARE
    from scorers.math.grader import warm_up

    warm_up()  # sympy's worker boots while the log is read, not in the timed loop
    # read_eval_log_samples re-reads the zip per sample (quadratic on a 20,000-sample log)
    bare, bare_read_s = _read(bare_log)
    _BARE = (list(bare.samples or []), epochs)
    bare_s, correct = bare_loop(*_BARE)
    insp, insp_read_s = (bare, bare_read_s) if insp_log == bare_log else _read(insp_log)
    return bare_s, correct, inspect_score(insp, insp_read_s, insp_limit)


def extraction_s() -> float:
    """Seconds `extract_answer` takes over the bare loop's completions (once per epoch), in
    the anchor process: the extraction the workers do inside each grade call, which the bare
    loops do before their timed loop."""
    assert _BARE is not None, "anchors() runs first"
    from scorers.math._extract import DEFAULT_PATTERNS, extract_answer

    samples, epochs = _BARE
    completions = [s.output.completion for s in samples] * epochs
    t0 = time.perf_counter()
    for c in completions:
        extract_answer(c, DEFAULT_PATTERNS)
    return time.perf_counter() - t0


def bare_again() -> tuple[float, int]:
    """The bare loop once more, in the anchor process, over the samples `anchors` read."""
    assert _BARE is not None, "anchors() runs first"
    return bare_loop(*_BARE)


def _load_bare(log: Path, epochs: int) -> None:
    """A split-loop process's start: the samples read once, sympy's worker booted."""
    global _BARE
    from scorers.math.grader import warm_up

    warm_up()
    _BARE = (list(_read(log)[0].samples or []), epochs)


def bare_part(k: int, parts: int) -> tuple[float, float, int]:
    """The bare loop over every `parts`-th sample from the k-th: (start, end, correct), the
    times from `time.time()` so that processes can be compared."""
    assert _BARE is not None
    samples, epochs = _BARE
    start = time.time()
    _, correct = bare_loop(samples[k::parts], epochs)
    return start, time.time(), correct


def _pid_after(delay_s: float) -> int:
    time.sleep(delay_s)
    return os.getpid()


def split_pool(log: Path, epochs: int, parts: int) -> ProcessPoolExecutor:
    """`parts` processes for `split_loop`, each done reading the log when this returns (so
    that no read runs beside a timed loop)."""
    pool = ProcessPoolExecutor(
        parts, mp_context=multiprocessing.get_context("spawn"),
        initializer=_load_bare, initargs=(log, epochs),
    )  # fmt: skip
    # a process takes a task only once its initializer is done: all of them answer at once
    # only when all of them are ready
    while len({f.result() for f in [pool.submit(_pid_after, 0.2) for _ in range(parts)]}) < parts:
        pass
    return pool


def split_loop(pool: ProcessPoolExecutor, parts: int) -> tuple[float, int]:
    """The bare loop split over `parts` processes at once, each with its own sympy worker:
    the same work on every core with no pipeline around it. (seconds from the first start to
    the last end, correct)."""
    runs = [f.result() for f in [pool.submit(bare_part, k, parts) for k in range(parts)]]
    return max(r[1] for r in runs) - min(r[0] for r in runs), sum(r[2] for r in runs)


def anchor_process() -> ProcessPoolExecutor:
    """The process the anchors run in: what they read (a whole log, through Inspect) is not
    left in this process, whose memory the stage's row measures. It stays up between calls,
    so the bare loop can run again between flow runs without reading the log again."""
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


def ingested(log: Path, tmp: Path) -> tuple[Path, float]:
    """A warehouse holding the log (not scored), and the seconds the ingest took."""
    from warehouse import Warehouse

    db = tmp / "ingested.duckdb"
    t0 = time.perf_counter()
    Warehouse(db).ingest_logs([str(log)])
    return db, time.perf_counter() - t0


def flow_score(
    log: Path, base: Path, workers: int, again: bool
) -> tuple[float, int, float, TreeRss, dict[str, Any]]:
    """The score flow over `log` in a fresh copy of the ingested warehouse `base`: (seconds,
    correct, seconds of a re-run with nothing left to score (`again`; else 0), memory, where
    the flow's seconds went (`flow_phases`))."""
    from flows.score import score_flow
    from scorers.workers.phases import STAGE

    with tempfile.TemporaryDirectory(dir=base.parent) as tmp:
        db = str(Path(tmp) / "bench.duckdb")
        shutil.copy(base, db)
        STAGE.reset()
        with TreeRss() as rss:  # the flow's process and every worker and zygote it starts
            t0 = time.monotonic()
            summaries = score_flow([str(log)], db, ["math"], workers, progress=False)
            t1 = time.monotonic()
        total = t1 - t0
        phases = flow_phases(t0, t1, STAGE.snapshot(), rss)
        correct = sum(s.correct for s in summaries)
        fixed_s = 0.0
        if again:
            # the same flow again finds nothing left to score: what is left is its fixed cost
            # (Prefect flow and task runs, the idempotent ingest, fingerprint, the pool's start)
            t0 = time.perf_counter()
            rerun = score_flow([str(log)], db, ["math"], workers, progress=False)
            fixed_s = time.perf_counter() - t0
            assert sum(s.written for s in rerun) == 0, "a re-run wrote scores again"
    return total, correct, fixed_s, rss, phases


# The flow's wall time, cut at the moments the stage marks (scorers.workers.phases): these add
# up to the flow's seconds.
TIMELINE = (
    ("prefect_start", "Prefect's start: the call to the flow's body", None, "flow body start"),
    ("before_first_chunk", "the flow's body to the first chunk out (workers' start, ingest, "
     "fingerprint, reading the samples)", "flow body start", "first chunk out"),
    ("grading", "first chunk out to the last result in", "first chunk out", "last result in"),
    ("after_last_result", "the last result in to the end of the flow's body (the last write, "
     "closing the pool)", "last result in", "flow body end"),
    ("prefect_end", "Prefect's end: the flow's body to the call's return", "flow body end", None),
)  # fmt: skip


def flow_phases(t0: float, t1: float, snap: dict[str, Any], rss: TreeRss) -> dict[str, Any]:
    """Where one flow run's seconds went: `timeline` (TIMELINE: sums to the run's seconds),
    `steps` (seconds per step of the stage's process and, under `worker: `, of the grading
    workers summed: steps run side by side, so these overlap), and `cpu` (CPU seconds of each
    kind of process in the tree while it ran, from /proc)."""
    marks = dict(snap["marks"])
    marks.setdefault("last result in", marks.get("first chunk out", t0))
    timeline = {}
    for key, _, start, end in TIMELINE:
        a = t0 if start is None else marks.get(start)
        b = t1 if end is None else marks.get(end)
        if a is not None and b is not None:
            timeline[key] = round(b - a, 4)
    steps = {k: round(v, 4) for k, v in sorted(snap["seconds"].items())}
    return {
        "seconds": round(t1 - t0, 4),
        "timeline": timeline,
        "steps": steps,
        "counts": {k: int(v) for k, v in sorted(snap["counts"].items())},
        "cpu": {k: round(v, 3) for k, v in rss.cpu_by_label().items()},
    }


def print_phases(rounds: list[dict[str, Any]]) -> None:
    """Each round's flow phases, as a table: one column per round."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="where the score flow's seconds went, per round (s)")
    table.add_column("phase")
    for i, r in enumerate(rounds, 1):
        table.add_column(
            f"round {i} (load {r['machine']['load'][0] if r['machine']['load'] else '?'})"
        )
    keys = [("timeline", k, text) for k, text, _, _ in TIMELINE]
    steps = sorted({k for r in rounds for k in r["flow_phases"]["steps"]})
    keys += [("steps", k, k) for k in steps]
    cpus = sorted({k for r in rounds for k in r["flow_phases"]["cpu"]})
    keys += [("cpu", k, f"CPU s: {k}") for k in cpus]
    table.add_row("the flow, in all", *(f"{r['flow_s']:.2f}" for r in rounds))
    for group, key, text in keys:
        cells = [r["flow_phases"][group].get(key) for r in rounds]
        table.add_row(text, *("–" if c is None else f"{c:.3f}" for c in cells))
    Console(width=200).print(table)


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
    the same local OpenAI-compatible server (sweeps/mock_server.py), both checked to succeed."""
    from sweeps.mock_server import scripted_server

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


def cpu_scaling(workers: int, seconds: float) -> float:
    """Throughput of `workers` CPU-bound processes at once over one alone: the most any
    `workers`-process speed-up can reach on this machine right now (2.0 on 2 idle cores).
    Each process counts rounds of work for `seconds` (so a loaded machine does not stretch it)."""
    code = (
        f"import time\nend = time.perf_counter() + {seconds}\nn = 0\n"
        "while time.perf_counter() < end:\n"
        "    s = 0\n    for i in range(20_000): s += i * i\n    n += 1\nprint(n)"
    )

    def rounds(n: int) -> int:
        procs = [
            subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(n)
        ]
        return sum(int(p.communicate()[0]) for p in procs)

    return rounds(workers) / rounds(1)


def main() -> None:
    if "--markdown" in sys.argv[1:]:
        from _stage_markdown import main as markdown

        markdown(sys.argv[1:])
        return
    args, n = stage_args(__doc__.splitlines()[0], "1,000 samples; under a minute", quick_n=1_000)
    if n > GENERATED_MAX and n % GENERATED_MAX:
        print(
            f"--samples {n}: above {GENERATED_MAX:,} the log is the {GENERATED_MAX:,}-sample one "
            f"run for several epochs; give a multiple of {GENERATED_MAX:,}",
            file=sys.stderr,
        )
        sys.exit(2)
    use_bench_prefect(CACHE)
    from flows.runtime.session import prefect_session

    log = build_log(n)
    at_start = machine_state()
    scaling = cpu_scaling(args.workers, seconds=1.5 if args.quick else 5.0)
    # Above GENERATED_MAX the bare loop grades that log's pairs once per epoch (the flow reads
    # the big log itself, and must find the same number correct). inspect_ai.score() is far
    # slower than the flow: it is timed on at most GENERATED_MAX samples (--quick: the first
    # INSPECT_QUICK of this log) and compared per sample.
    epochs = n // GENERATED_MAX if n > GENERATED_MAX else 1
    insp_n = min(n, INSPECT_QUICK if args.quick else GENERATED_MAX)
    where = "epoch 1 of this log" if n > GENERATED_MAX else "this log's first samples"
    insp_anchor = "inspect_ai.score()" + (
        f" on {insp_n:,} samples ({where}), per sample" if insp_n < n else ""
    )
    # The flow and the bare loop take turns (bare, flow, bare, flow...) and the row compares
    # their medians: on a shared machine the load drifts over minutes, and two single runs
    # minutes apart can differ by a fifth for that alone.
    repeats = 1 if args.quick else REPEATS
    from flows.runtime.console import quiet_prefect

    quiet_prefect(False)
    bare_runs: list[float] = []
    flow_runs: list[float] = []
    split_runs: list[float] = []
    rounds: list[dict[str, Any]] = []  # each round's machine state at its start, and phases
    bare_log = build_log(GENERATED_MAX) if epochs > 1 else log
    split = split_pool(bare_log, epochs, args.workers)
    with split, anchor_process() as anchor, tempfile.TemporaryDirectory() as tmp_dir:
        bare_s, bare_correct, insp_per_sample = anchor.submit(
            anchors, bare_log, epochs, build_log(min(n, GENERATED_MAX)), insp_n,
        ).result()  # fmt: skip
        bare_runs.append(bare_s)
        extract_s = anchor.submit(extraction_s).result()
        base, ingest_s = ingested(log, Path(tmp_dir))
        peak, fixed_s = None, 0.0
        with prefect_session():  # a local server, set up exactly as the CLI's commands do
            for i in range(repeats):
                machine = machine_state()  # before the round: who else is using the cores
                if i:
                    bare_runs.append(anchor.submit(bare_again).result()[0])
                split_s, split_correct = split_loop(split, args.workers)
                split_runs.append(split_s)
                flow_s, flow_correct, fixed, rss, phases = flow_score(
                    log, base, args.workers, i == 0
                )
                flow_runs.append(flow_s)
                rounds.append({"machine": machine, "bare_s": bare_runs[-1], "split_s": split_s,
                               "flow_s": flow_s, "flow_vs_split": split_s / flow_s,
                               "flow_phases": phases})  # fmt: skip
                fixed_s = fixed_s or fixed
                peak = rss if peak is None or rss.peak_bytes > peak.peak_bytes else peak
                if not flow_correct == split_correct == bare_correct:
                    print(f"WARNING: flow found {flow_correct} correct, bare loop {bare_correct}, "
                          f"split loop {split_correct}")  # fmt: skip
    rss = peak
    bare_s, flow_s = statistics.median(bare_runs), statistics.median(flow_runs)
    split_s = statistics.median(split_runs)
    insp_s = insp_per_sample * n
    pairs = [b / f for b, f in zip(bare_runs, flow_runs, strict=True)]
    print("bare loop s: " + ", ".join(f"{b:.1f}" for b in bare_runs)
          + "; split loop s: " + ", ".join(f"{x:.1f}" for x in split_runs)
          + "; score flow s: " + ", ".join(f"{f:.1f}" for f in flow_runs)
          + "; flow vs bare per round: " + ", ".join(f"{r:.2f}" for r in pairs)
          + "; flow vs split per round: " + ", ".join(
              f"{x / f:.2f}" for x, f in zip(split_runs, flow_runs, strict=True)))  # fmt: skip
    assert rss is not None
    print("peak RSS row, each process's own peak (MB): " + "; ".join(
        f"{label} {'+'.join(map(str, mbs))}" for label, mbs in rss.peaks_by_label().items()
    ))  # fmt: skip
    for i, r in enumerate(rounds, 1):
        busy = "; ".join(f"{p['cpu_pct']:.0f}% {p['command'][:50]}" for p in r["machine"]["busy"])
        print(f"round {i}: load {r['machine']['load']} at its start; other busy processes: "
              f"{busy or 'none'}")  # fmt: skip
    print_phases(rounds)
    full = not args.quick  # a --quick log is mostly fixed cost: the bars are the full run's
    rows = [
        judged(f"score flow vs the bare loop split over {args.workers} processes at once "
               f"(median of {repeats} alternating rounds): the same work on every core, no "
               "pipeline", n / flow_s, "samples/s", f"bare loop, {args.workers} processes",
               n / split_s, split_s / flow_s, ">= 0.8x the split loop, median of 3 rounds",
               split_s / flow_s >= 0.8, judge=full and repeats >= REPEATS),
        info(f"score flow vs bare is_correct loop (median of {repeats}, taking turns)",
             n / flow_s, "samples/s", "bare loop, 1 process", n / bare_s, bare_s / flow_s),
        info(f"the split loop vs the bare loop: what {args.workers} processes gain on this "
             "work, now (the ceiling of the row above)", n / split_s, "samples/s",
             "bare loop, 1 process", n / bare_s, bare_s / split_s),
        info(f"CPU scaling, {args.workers} busy processes (a busy loop: the ceiling for work "
             f"that shares nothing; {args.workers:.1f} on {args.workers} idle cores)",
             scaling, "x", "1 process", 1.0, scaling),
        judged("score flow vs inspect score", n / flow_s, "samples/s", insp_anchor,
               n / insp_s, insp_s / flow_s, ">= 3x inspect score", insp_s / flow_s >= 3,
               judge=full),
        judged(f"peak RSS, score flow's process tree ({rss.processes} processes): the sum of "
               "each one's own peak", rss.peak_bytes / 1e6, "MB", "the bar",
               RSS_BAR_BYTES / 1e6, rss.peak_bytes / RSS_BAR_BYTES, "<= 1,500 MB",
               rss.peak_bytes <= RSS_BAR_BYTES, judge=full),
        info("peak PSS of that tree at one poll (shared pages split between processes)",
             rss.peak_pss_bytes / 1e6, "MB", "peak RSS row above", rss.peak_bytes / 1e6,
             rss.peak_pss_bytes / rss.peak_bytes),
        info("ingest (not in the flow rows)", n / ingest_s, "samples/s",
             "bare loop, 1 process", n / bare_s, bare_s / ingest_s),
        info("score flow re-run, nothing to score (fixed cost; its share of the first run)",
             fixed_s, "s", "score flow, first run", flow_s, fixed_s / flow_s),
        info("extraction alone: extract_answer over the same completions in one process (the "
             "workers do it inside each grade call; the bare loops before their timed loop)",
             extract_s, "s", "bare loop, 1 process", bare_s, extract_s / bare_s),
    ]  # fmt: skip
    # rows measured over the rounds say so when a round began on a busy machine; the others
    # (CPU scaling, the anchors, ingest) ran at the start. The rounds' load holds the anchors
    # timed seconds before, so other processes' CPU judges them.
    over_rounds = load_note([r["machine"] for r in rounds], by_load=False)
    at_first = load_note([at_start])
    for row in rows:
        row.note = (
            over_rounds if row.name.startswith(("score flow", "the split", "peak")) else at_first
        )
    if not args.quick:
        before_sweep = load_note([machine_state(0.5)], by_load=False)
        with tempfile.TemporaryDirectory() as tmp:
            sweep_s, eval_s = sweep_overhead(Path(tmp))
        rows.append(
            info("gradebook sweep, 1 sample (Prefect start-up included: fixed cost of a sweep)",
                 sweep_s, "s", "inspect eval, 1 sample", eval_s, sweep_s / eval_s)
        )  # fmt: skip
        rows[-1].note = before_sweep
    from flows.runtime.background_server import stop_server

    stop_server()  # the shared local server this script's commands started in its home
    extra = {
        "run": {"samples": n, "workers": args.workers, "repeats": repeats, "quick": args.quick,
                "commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "extraction_s": extract_s, "peak_rss_mb": rss.peak_bytes / 1e6,
                "inspect_ratio": insp_s / flow_s},
        "machine_at_start": at_start,
        "load_at_end": load_average(),
        "rounds": rounds,
    }  # fmt: skip
    emit(f"scoring stage ({n:,} samples, {args.workers} workers)", rows, args.json, extra)


def _commit() -> str:
    """The checkout's commit, with "+changes" when its tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+changes" if dirty else "")  # fmt: skip


if __name__ == "__main__":
    main()
