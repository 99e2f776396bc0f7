"""Where a grading worker's CPU goes per sample, against the split loop's bare `is_correct`.

    .venv/bin/python benchmarks/grading_overhead.py [--quick] [--json PATH] [--samples N]

In one process, over the same pairs (scoring_stage.py's math log: 20,000 samples, 1,000 with
--quick), taking turns, median of 5 rounds (3 with --quick): process CPU seconds (the sympy
worker's are not in them) of

1. `is_correct` over answers extracted beforehand: what each process of the split loop does
   (the anchor);
2. extraction and `is_correct`: the extraction the split loop does before its timed loop;
3. `grade_math` over SampleViews built beforehand: the math verifier's own call (its Grade,
   explanation and metadata); this code is in the verifier's fingerprint;
4. `grade_chunk` over rows shaped as the stage hands them to a worker (completion, targets,
   metadata JSON, id, state), in chunks of 2,000 with the worker's per-path timing: the
   worker's loop (the SampleView, the per-sample limit, the result tuple).

Every row informs (issue 41's bar is on the whole flow: scoring_stage.py); together they say
how much of the flow's extra CPU is per-sample work inside a grading process.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks._common import Row, emit, info, stage_args  # noqa: E402

CHUNK = 2_000


def _inputs(n: int) -> tuple[list, list, list, list]:
    """(pairs extracted beforehand, (completion, target) pairs, views, worker rows)."""
    import json

    from inspect_ai.log import read_eval_log
    from scoring_stage import GENERATED_MAX, build_log

    from scorers.grade import SampleView
    from scorers.math._extract import DEFAULT_PATTERNS, extract_answer

    samples = (read_eval_log(str(build_log(min(n, GENERATED_MAX)))).samples or [])[:n]
    raw = [(s.output.completion, str(s.target)) for s in samples]
    meta = [json.dumps(s.metadata) if s.metadata else None for s in samples]
    pairs = [(extract_answer(c, DEFAULT_PATTERNS), t) for c, t in raw]
    views = [SampleView(c, [t], {}, str(i)) for i, (c, t) in enumerate(raw)]
    rows = [(c, [t], m, str(i), None) for i, ((c, t), m) in enumerate(zip(raw, meta, strict=True))]
    return pairs, raw, views, rows


def main() -> None:
    args, n = stage_args(__doc__.splitlines()[0], "1,000 samples; under a minute", quick_n=1_000)
    from scorers.math import is_correct
    from scorers.math._extract import DEFAULT_PATTERNS, extract_answer
    from scorers.math.grader import grade_math, warm_up
    from scorers.workers.phases import WorkerTimes
    from scorers.workers.stage import SAMPLE_TIMEOUT_S
    from scorers.workers.worker import grade_chunk

    warm_up()
    pairs, raw, views, rows = _inputs(n)
    n = len(pairs)
    gc.collect()

    def chunks() -> None:
        times = WorkerTimes()
        for i in range(0, n, CHUNK):
            grade_chunk(grade_math, rows[i : i + CHUNK], SAMPLE_TIMEOUT_S, False, times)

    runs: dict[str, Callable[[], object]] = {
        "is_correct": lambda: [is_correct(a, t) for a, t in pairs],
        "extract": lambda: [is_correct(extract_answer(c, DEFAULT_PATTERNS), t) for c, t in raw],
        "grade_math": lambda: [grade_math(v) for v in views],
        "grade_chunk": chunks,
    }
    spent: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(3 if args.quick else 5):
        for name, fn in runs.items():
            t0 = time.process_time()
            fn()
            spent[name].append(time.process_time() - t0)
    us = {k: statistics.median(v) / n * 1e6 for k, v in spent.items()}
    anchor = "is_correct, answers extracted beforehand (the split loop)"
    base = us["is_correct"]
    rows_out: list[Row] = [
        info("is_correct over pre-extracted answers", base, "us/sample", anchor, base, 1.0),
        info("extraction + is_correct", us["extract"], "us/sample", anchor, base,
             us["extract"] / base),
        info("grade_math over SampleViews built beforehand (the verifier's call)",
             us["grade_math"], "us/sample", anchor, base, us["grade_math"] / base),
        info("grade_chunk over worker rows (the grading worker's loop)", us["grade_chunk"],
             "us/sample", anchor, base, us["grade_chunk"] / base),
    ]  # fmt: skip
    print(f"{n:,} samples; process CPU per round (s): " + "; ".join(
        f"{k} " + ", ".join(f"{x:.2f}" for x in v) for k, v in spent.items()))  # fmt: skip
    emit("grading CPU per sample, one process", rows_out, args.json)


if __name__ == "__main__":
    main()
