"""The scoring-stage tables of docs/benchmarks/scoring-stage.md, rendered from the --json files
of `benchmarks/scoring_stage.py` runs:

    .venv/bin/python benchmarks/scoring_stage.py --markdown RUN1.json [RUN2.json ...]

prints two Markdown tables: one row per round (the load at its
start, the split loop, the flow, their ratio, and the flow's timeline), and one row per run (the
medians, the bar's verdict, `inspect score`, peak RSS), then the stage's steps per run (the
median over its rounds). Nothing is typed in by hand: paste the output under the run's command.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from _machine import QUIET_LOAD

BAR = 0.8  # the flow-vs-split row's bar (benchmarks/scoring_stage.py)

# the steps shown, in the stage's order: (key in the flow's `steps`, what it is)
STEPS = (
    ("start the workers", "start the workers (early)"),
    ("ingest (a task run)", "ingest, a no-op (a task run)"),
    ("name the flow run", "name the flow run (read its labels; the server call is on a thread)"),
    ("fingerprint the verifier", "fingerprint"),
    ("read the samples to grade", "read the samples out of the warehouse"),
    ("await the workers' start", "wait for the workers' start"),
    ("build a chunk's rows", "hand out: build the rows"),
    ("pickle a chunk", "hand out: pickle"),
    ("send a chunk", "hand out: send"),
    ("wait for results", "wait for results (idle)"),
    ("receive results", "results back: receive"),
    ("hand results to the caller", "results back: to the writer"),
    ("write (on the writer thread)", "write score rows (writer thread, beside grading)"),
    ("last write", "the last write (after grading)"),
    ("record the fingerprint", "record the fingerprint"),
    ("close the pool", "close the pool"),
    ("worker: wait for a chunk", "workers: wait for a chunk"),
    ("worker: decode the chunk", "workers: decode chunks"),
    ("worker: grade exact", "workers: grade, exact path (extraction + exact verification)"),
    ("worker: grade symbolic", "workers: grade, symbolic path (+ sympy worker round trip)"),
    ("worker: grade other", "workers: grade, no answer or other"),
    ("worker: send the results", "workers: send results"),
)


def _load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    if "rounds" not in doc or "run" not in doc:
        raise SystemExit(
            f"{path}: not a scoring_stage.py --json file with rounds (run the benchmark of this "
            "checkout with --json)"
        )
    doc["path"] = path
    return doc


def rounds_table(docs: list[dict[str, Any]]) -> str:
    head = (
        "| run | round | load | split loop | score flow | "
        "**flow / split** (bar 0.8×) | Prefect's start | to chunk 1 | grading | "
        "after last result | Prefect's end |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for k, doc in enumerate(docs, 1):
        for i, r in enumerate(doc["rounds"], 1):
            load = r["machine"].get("load") or [float("nan")]
            quiet = "" if load[0] < QUIET_LOAD else " *"
            t = r["flow_phases"]["timeline"]
            cells = [
                f"{k} ({doc['run']['commit']})",
                str(i),
                f"{load[0]:.2f}{quiet}",
                f"{r['split_s']:.1f} s",
                f"{r['flow_s']:.1f} s",
                f"**{r['flow_vs_split']:.2f}×**",
                *(
                    f"{t[key]:.2f} s" if key in t else "–"
                    for key in (
                        "prefect_start",
                        "before_first_chunk",
                        "grading",
                        "after_last_result",
                        "prefect_end",
                    )
                ),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def runs_table(docs: list[dict[str, Any]]) -> str:
    head = (
        "| run | date | samples | rounds | split loop (median) | score flow (median) | "
        "**flow vs split** | met (≥ 0.8×)? | vs `inspect score` | peak RSS | load at end |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for k, doc in enumerate(docs, 1):
        rounds, run = doc["rounds"], doc["run"]
        split = statistics.median(r["split_s"] for r in rounds)
        flow = statistics.median(r["flow_s"] for r in rounds)
        loads = [r["machine"]["load"][0] for r in rounds if r["machine"].get("load")]
        quiet = bool(loads) and max(loads) < QUIET_LOAD
        verdict = ("yes" if split / flow >= BAR else "no") + ("" if quiet else ", not quiet")
        end = doc.get("load_at_end") or [float("nan")]
        cells = [
            f"{k} ({run['commit']})",
            run["date"][:16],
            f"{run['samples']:,}",
            str(len(rounds)),
            f"{split:.1f} s",
            f"{flow:.1f} s",
            f"**{split / flow:.2f}×**",
            verdict,
            f"{run['inspect_ratio']:.1f}×" if run.get("inspect_ratio") else "–",
            f"{run['peak_rss_mb']:,.0f} MB" if run.get("peak_rss_mb") else "–",
            f"{end[0]:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def steps_table(docs: list[dict[str, Any]]) -> str:
    head = (
        "| step (seconds summed; steps overlap) | "
        + " | ".join(f"run {k}" for k in range(1, len(docs) + 1))
        + " |\n|---|"
        + "---|" * len(docs)
        + "\n"
    )
    lines = []
    for key, text in STEPS:
        cells = []
        for doc in docs:
            values = [r["flow_phases"]["steps"].get(key) for r in doc["rounds"]]
            values = [v for v in values if v is not None]
            cells.append(f"{statistics.median(values):.2f}" if values else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {text} | " + " | ".join(cells) + " |")
    cpu_keys = sorted({k for doc in docs for r in doc["rounds"] for k in r["flow_phases"]["cpu"]})
    for key in cpu_keys:
        cells = []
        for doc in docs:
            values = [r["flow_phases"]["cpu"].get(key) for r in doc["rounds"]]
            values = [v for v in values if v is not None]
            cells.append(f"{statistics.median(values):.2f}" if values else "–")
        lines.append(f"| CPU seconds: {key} | " + " | ".join(cells) + " |")
    extraction = [
        f"{doc['run']['extraction_s']:.2f}" if doc["run"].get("extraction_s") else "–"
        for doc in docs
    ]
    lines.append(
        "| extraction alone, timed in one process (inside the workers' grade calls) | "
        + " | ".join(extraction)
        + " |"
    )
    return head + "\n".join(lines) + "\n"


def render(paths: list[Path]) -> str:
    docs = [_load(p) for p in paths]
    return "\n".join([runs_table(docs), rounds_table(docs), steps_table(docs)])


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv if a != "--markdown"]
    if not paths:
        print("--markdown: give the --json files of scoring_stage.py runs", file=sys.stderr)
        sys.exit(2)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"--markdown: no such file: {', '.join(missing)}", file=sys.stderr)
        sys.exit(2)
    print(render(paths))
