"""Agentic re-scoring: a sandbox scorer re-run from captured workspaces vs re-running the agent.

    .venv/bin/python benchmarks/agentic_rescore.py [--quick] [--json PATH] [--samples N]
        [--agent-steps K] [--repeat R]

The workload is the bundled agentic example (tasks/agentic.py): a scripted coding agent fixes a
failing test through Inspect's `bash` tool in a gradebook sandbox (one container per sample),
scored by running the repository's tests in the sandbox (tasks/agentic_scorer.py). The agent
first runs K read-only commands (`--agent-steps`, default 20: a coding agent looks before it
edits, and SWE-style agents make tens of tool calls per sample), then its 3 working steps. The
anchor's cost grows with K and, with a real model, with the model's latency per turn (zero
here): the scripted model is the anchor's most favourable case.

Rows:
  - re-score N samples: gradebook's scoring stage (the score flow, as `gradebook score` and
    `rescore` run it) on a warehouse that holds their logs: per sample a fresh container, the captured workspace
    restored, the scorer re-run; in samples/s. Anchor, measured in the same run: Inspect's only
    way to re-score a sandbox scorer, eval-retry with checkpoint resume where it works, else
    re-running the agent with the scripted model (`eval(..., score=True)`: the same tasks,
    same sandbox, same scorer). Checkpoint resume is tried first on one sample; offline it fails
    (Inspect's checkpointing downloads restic from GitHub), and the note says so. Bar: >= 3x.
  - capture overhead: generation with capture over generation without (the same eval, taking
    turns, medians of R each): bar <= 10%.
  - restore into the task's own image (`--own-image` of the demo: gradebook's image plus the
    repository's checker, built from a compose file) against restore into gradebook's, per
    sample, the same scorer and the same agent, once the image exists: bar <= 1.5x.
  - the one-time rebuild from the recipe: the first re-score after the task image is removed
    from the Engine (rebuilt from the recipe in the workspace store), against a re-score with
    the image there: informational.
  - stored bytes per sample after deduplication (the store's size over N), archive bytes per
    sample, capture seconds per sample: informational.

Mocks only at the model edge: real eval() runs, real Docker containers, a real warehouse and
scoring stage (a local Prefect server, as the CLI runs one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the project: benchmarks/warehouse.py

from _common import Row, emit, judged, use_bench_prefect  # noqa: E402

CACHE = ROOT / ".bench"


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 samples, one turn each (a smoke run)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--agent-steps", type=int, default=20, help="read-only agent steps first")
    ap.add_argument("--repeat", type=int, default=None, help="turns of each timing (median)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.samples = args.samples or (6 if args.quick else 24)
    args.repeat = args.repeat or (1 if args.quick else 3)
    return args


def _eval(task: Any, agent: Any, log_dir: Path, *, score: bool, checkpoint: Any = None) -> Any:
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    kwargs = {"checkpoint": checkpoint} if checkpoint is not None else {}
    (log,) = inspect_eval(
        task,
        model=get_model("mockllm/model", custom_outputs=agent, memoize=False),
        log_dir=str(log_dir),
        display="none",
        score=score,
        **kwargs,
    )
    errors = [s.error.message for s in log.samples or [] if s.error is not None]
    if log.status != "success" or errors:
        raise RuntimeError(f"eval {log.status}: {log.error or errors[:1]}")
    return log


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def checkpoint_resume_note(tmp: Path, agent: Any) -> str:
    """Try Inspect's checkpointing on one sample; what happened, in a line."""
    from inspect_ai.util import (
        ArchiveSnapshots,
        CheckpointConfig,
        SandboxSnapshotConfig,
        TurnInterval,
    )

    from tasks.agentic import fix_the_bug

    config = CheckpointConfig(
        trigger=TurnInterval(every=1),
        sandbox_paths={
            "default": SandboxSnapshotConfig(paths=["/work/repo"], strategy=ArchiveSnapshots())
        },
        checkpoints_location=str(tmp / "checkpoints"),
    )
    try:
        from inspect_ai.agent import react
        from inspect_ai.tool import bash

        task = fix_the_bug(1)
        task.solver = react(tools=[bash(timeout=60)])  # checkpoints are taken by react's turns
        _eval(task, _submitting(agent), tmp / "checkpoint-logs", score=False, checkpoint=config)
    except Exception as exc:  # noqa: BLE001 - the note is the result
        return f"checkpoint resume unusable here: {' '.join(str(exc).split())[:200]}"
    return "checkpointing ran; its resume path re-runs the agent's remaining turns (not timed)"


def _submitting(agent: Any) -> Any:
    """The agent, ending with react's `submit` tool instead of a plain reply."""
    from inspect_ai.model import ModelOutput, ModelUsage

    def outputs(input: Any, tools: Any, tool_choice: Any, config: Any) -> Any:  # noqa: A002
        out = agent(input, tools, tool_choice, config)
        if out.message.tool_calls:
            return out
        call = ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": out.completion})
        return call.model_copy(update={"usage": ModelUsage(input_tokens=1, output_tokens=1,
                                                           total_tokens=2)})  # fmt: skip

    return outputs


def generation(n: int, agent: Any, tmp: Path, repeat: int) -> tuple[list[float], list[float], Any]:
    """(seconds without capture, seconds with capture, the last captured log), taking turns."""
    from tasks.agentic import fix_the_bug
    from workspaces.capture import CaptureSettings, with_capture

    plain, captured, log = [], [], None
    for i in range(repeat):
        seconds, _ = _timed(
            lambda i=i: _eval(fix_the_bug(n), agent, tmp / f"plain{i}", score=False)
        )
        plain.append(seconds)
        settings = CaptureSettings(store=tmp / "store")
        seconds, log = _timed(
            lambda i=i, settings=settings: _eval(
                with_capture(fix_the_bug(n), settings), agent, tmp / f"cap{i}", score=False
            )
        )
        captured.append(seconds)
    return plain, captured, log


def rescore(log: Any, tmp: Path, repeat: int) -> tuple[list[float], int]:
    """Seconds of the scoring stage (a Prefect flow run, as `gradebook score` runs it) grading
    the log's samples with the sandbox scorer (a fresh warehouse each turn, the log ingested
    before the clock starts: the stage's ingest is then its no-op check); correct count."""
    from flows.score import score_flow
    from warehouse import Warehouse

    entry = f"{ROOT / 'tasks' / 'agentic_scorer.py'}@repo_tests"
    times, correct = [], -1
    tmp.mkdir(parents=True, exist_ok=True)
    for i in range(repeat):
        db = str(tmp / f"rescore{i}.duckdb")
        Warehouse(db).ingest_logs([log.location])
        seconds, summaries = _timed(
            lambda db=db: score_flow([log.location], db, [entry], progress=False)
        )
        times.append(seconds)
        got = sum(s.correct for s in summaries)
        if sum(s.scored for s in summaries) != len(log.samples):
            with Warehouse(db).read() as con:
                why = con.execute("SELECT DISTINCT reason, explanation FROM latest_scores "
                                  "WHERE status <> 'scored' LIMIT 3").fetchall()  # fmt: skip
            raise SystemExit(
                f"the stage scored {summaries} of {len(log.samples)} samples of {log.location}: {why}"
            )
        if correct not in (-1, got):
            raise SystemExit("two re-scores disagree")
        correct = got
    return times, correct


def own_image_log(n: int, agent: Any, tmp: Path) -> Any:
    """The agent in the task's own image (the demo's `--own-image`): its captured log."""
    from scorers.sandbox.image import image_tag
    from tasks.agentic import fix_the_bug, image_compose
    from workspaces.capture import CaptureSettings, with_capture

    compose = image_compose(tmp / "task-image", image_tag())
    # this run's own recipe (so its own tag): the rebuild row removes the image, which must
    # not be one a demo or a test elsewhere on the Engine is using
    compose.write_text(compose.read_text() + f"x-benchmark-run: {uuid.uuid4().hex}\n")
    task = with_capture(fix_the_bug(n, str(compose)), CaptureSettings(store=tmp / "own-store"))
    return _eval(task, agent, tmp / "own", score=False)


def rebuild_rescore(log: Any, tmp: Path) -> float:
    """Seconds of the re-score right after the log's task image was removed from the Engine
    (the image rebuilt from the recipe in the workspace store, once)."""
    import docker

    from workspaces.record import STORE_KEY

    client = docker.from_env()
    (image_id,) = {s.store[STORE_KEY]["sandboxes"][0]["image_id"] for s in log.samples}
    for tag in client.images.get(image_id).tags:
        client.images.remove(tag)  # never forced: a container still using it would refuse
    (seconds,), _ = rescore(log, tmp, 1)
    return seconds


def rerun_agent(n: int, agent: Any, tmp: Path, repeat: int) -> tuple[list[float], int]:
    """Seconds of Inspect re-running the agent and scoring at eval time; correct count."""
    from tasks.agentic import fix_the_bug

    times, correct = [], -1
    for i in range(repeat):
        seconds, log = _timed(
            lambda i=i: _eval(fix_the_bug(n), agent, tmp / f"rerun{i}", score=True)
        )
        times.append(seconds)
        correct = sum(s.scores["repo_tests"].value == "C" for s in log.samples)
    return times, correct


def main() -> None:
    args = _args()
    n = args.samples
    use_bench_prefect(CACHE)
    from flows.runtime.console import quiet_prefect
    from flows.runtime.session import prefect_session
    from scorers.sandbox.pool import sandbox_down
    from tasks.agentic import make_agent
    from workspaces.record import STORE_KEY

    problem = sandbox_down()
    if problem:
        raise SystemExit(f"needs the Docker sandbox: {problem}")
    quiet_prefect(False)
    agent = make_agent(explore=args.agent_steps)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        note = checkpoint_resume_note(tmp, agent)
        plain, captured, log = generation(n, agent, tmp, args.repeat)
        own_log = own_image_log(n, agent, tmp)
        with prefect_session():  # a local server, set up exactly as the CLI's commands do
            ours, own = [], []
            for i in range(args.repeat):  # taking turns: neither is always the cold one
                seconds, ours_correct = rescore(log, tmp / f"gb{i}", 1)
                ours += seconds
                seconds, own_correct = rescore(own_log, tmp / f"own{i}", 1)
                own += seconds
            rebuilt_s = rebuild_rescore(own_log, tmp / "rebuild")
        if own_correct != ours_correct:
            raise SystemExit(
                f"in its own image {own_correct} correct, in gradebook's {ours_correct}"
            )
        theirs, their_correct = rerun_agent(n, agent, tmp, args.repeat)
        if ours_correct != their_correct:
            raise SystemExit(f"re-score found {ours_correct} correct, the re-run {their_correct}")
        stored = sum(p.stat().st_size for p in (tmp / "store").rglob("*.tar.zst"))
        boxes = [s.store[STORE_KEY]["sandboxes"][0] for s in log.samples]
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    plain_s, cap_s = statistics.median(plain), statistics.median(captured)
    overhead = cap_s / plain_s - 1
    steps = args.agent_steps + 3
    anchor = f"re-running the agent ({steps} tool calls/sample, scripted model) + eval-time score"
    rows = [
        Row(f"re-score {n} agentic samples from the workspace store", n / ours_s, "samples/s",
            anchor, n / theirs_s, theirs_s / ours_s, ">= 3x", theirs_s / ours_s >= 3),
        # one turn (--quick) cannot tell a 10 % difference from the machine's noise
        judged("generation time added by capture", 100 * overhead, "%",
               "generation without capture (s)", plain_s, cap_s / plain_s, "<= 10%",
               overhead <= 0.10, judge=not args.quick),
        Row("re-score per sample, restored into the task's own image", statistics.median(own) / n,
            "s", "restored into gradebook's image (s/sample)", ours_s / n,
            statistics.median(own) / ours_s, "<= 1.5x", statistics.median(own) / ours_s <= 1.5),
        Row("first re-score after the task image was removed (rebuilt from the recipe)",
            rebuilt_s, "s", "re-score with the image on the Engine (s)", statistics.median(own),
            rebuilt_s / statistics.median(own), None, None),
        Row("stored bytes per sample after deduplication", stored / n, "bytes",
            "archive bytes per sample (uncompressed)", sum(b["bytes"] for b in boxes) / n,
            stored / max(1, sum(b["bytes"] for b in boxes)), None, None),
        Row("capture seconds per sample (inside generation)",
            statistics.mean(b["seconds"] for b in boxes), "s",
            "generation seconds per sample (wall / N)", plain_s / n,
            statistics.mean(b["seconds"] for b in boxes) / (plain_s / n), None, None),
    ]  # fmt: skip
    print(f"anchor note: {note}")
    print(f"correct: {ours_correct}/{n} both ways; turns: {args.repeat}; "
          f"generation s without/with capture: {plain} / {captured}")  # fmt: skip
    emit(f"Agentic re-scoring ({n} samples, {steps} agent tool calls each)", rows, args.json)


if __name__ == "__main__":
    main()
