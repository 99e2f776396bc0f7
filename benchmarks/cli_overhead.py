"""What a gradebook command costs beyond its work, as a user runs it (each command a process).

Rows, each the median of 3 runs, all in one run of this script against anchors of the same run:

- one-sample `gradebook sweep`, once the shared local Prefect server is up, against one-sample
  `inspect eval` of the same task with the same mockllm model (bar: <= 1.5x); and the cold first
  sweep, which starts that server (informational);
- `gradebook score` of a log that is already scored, and `gradebook rescore` with nothing
  changed (no-ops), against `gradebook sql "select 1"` (bar: <= 2x);
- the same no-ops and the same anchor again while two busy processes (`while True: pass`) run
  beside them, a fixed CPU load on top of whatever else the machine runs (bar: <= 3x `sql`
  under that load).

The task is written here and loads under Inspect's own loader; its model (mockllm with scripted
answers that carry token usage, so nothing is downloaded) is the task's own for `inspect eval`
and the sweep config's for gradebook. The anchor is checked to succeed. The server lives in a
Prefect home of this script's own and is stopped at the end.

    .venv/bin/python benchmarks/cli_overhead.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from _common import Row, emit, info  # noqa: E402

BIN = Path(sys.executable).parent

TASK = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import generate


    def _answer(input, tools, tool_choice, config):
        return ModelOutput.from_content(model="mockllm/model", content="The answer is 3").model_copy(
            update={"usage": ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)}
        )


    def mock_args():
        return {"custom_outputs": _answer}


    @task
    def one():
        return Task(
            dataset=[Sample(input="What is 1 + 2?", target="3", id=1)],
            solver=generate(),
            model=get_model("mockllm/model", custom_outputs=_answer),
        )
    """
)

CONFIG = textwrap.dedent(
    """
    name = "one"
    log_dir = "logs"
    warehouse = "one.duckdb"
    [[models]]
    name = "mock"
    model = "mockllm/model"
    args_from = "bench_task:mock_args"
    [[tasks]]
    task = "{task}@one"
    verifiers = ["math"]
    [gates]
    min_accuracy = 0.0
    max_regression = 0.5
    """
)


CPU: dict[str, list[float]] = {}  # command -> CPU seconds of each run (it and its children)


def _timed(args: list[str], env: dict[str, str], cwd: Path, label: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    CPU.setdefault(label, []).append(cpu)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed ({out.returncode}): {out.stderr[-2000:]}")
    return took


BUSY = "while True: pass"
BUSY_PROCESSES = 2


@contextmanager
def busy(n: int) -> Iterator[None]:
    """`n` processes spinning on a core each while the block runs (a fixed CPU load), each
    already spinning when the block starts (an interpreter's start is not the load)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        while min(_cpu_seconds(p.pid) for p in procs) < 0.2:
            time.sleep(0.05)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _check_anchor(log_dir: Path) -> None:
    """The anchor must be a run that worked: one sample, generated, no error."""
    from inspect_ai.log import read_eval_log

    logs = sorted(log_dir.glob("*.eval"))
    if not logs:
        raise SystemExit("inspect eval wrote no log")
    log = read_eval_log(str(logs[-1]))
    errors = [s.error for s in log.samples or [] if s.error]
    if log.status != "success" or len(log.samples or []) != 1 or errors:
        raise SystemExit(f"the anchor did not succeed: {log.status}, {errors}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run of each (under a minute)")
    ap.add_argument("--json", type=Path, help="write the result rows here")
    args = ap.parse_args()
    repeat = 1 if args.quick else 3

    from flows.runtime.background_server import stop_server

    with tempfile.TemporaryDirectory(prefix="gb-cli-bench-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "bench_task.py").write_text(TASK)
        cfg = tmp / "one.toml"
        cfg.write_text(CONFIG.format(task=tmp / "bench_task.py"))
        home = tmp / "prefect-home"
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(
            GRADEBOOK_PREFECT_HOME=str(home),
            GRADEBOOK_PREFECT_PORT="0",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp)]),
        )
        gb = [str(BIN / "gradebook")]
        db = tmp / "one.duckdb"
        sweep = [*gb, "sweep", str(cfg)]
        evaluate = [str(BIN / "inspect"), "eval", f"{tmp / 'bench_task.py'}@one", "--limit", "1",
                    "--no-score", "--display", "none", "--log-dir", str(tmp / "inspect-logs")]  # fmt: skip
        sql = [*gb, "sql", "select 1", "--db", str(db)]
        rescore = [*gb, "rescore", "--db", str(db)]
        try:
            cold = _timed(sweep, env, tmp, "cold sweep")  # starts the shared server
            log = sorted((tmp / "logs").glob("*.eval"))[0]
            score = [*gb, "score", str(log), "--db", str(db)]
            noops = {"sql": sql, "score": score, "rescore": rescore}
            times: dict[str, list[float]] = {
                k: [] for k in ("sweep", "eval", *noops, *(f"busy {k}" for k in noops))
            }
            for _ in range(repeat):  # interleaved: the machine's load moves during the run
                times["sweep"].append(_timed(sweep, env, tmp, "sweep"))
                times["eval"].append(_timed(evaluate, env, tmp, "eval"))
                for k, cmd in noops.items():
                    times[k].append(_timed(cmd, env, tmp, k))
                with busy(BUSY_PROCESSES):
                    for k, cmd in noops.items():
                        times[f"busy {k}"].append(_timed(cmd, env, tmp, f"busy {k}"))
            _check_anchor(tmp / "inspect-logs")
        finally:
            stop_server(home)
    med = {k: statistics.median(v) for k, v in times.items()}
    n = f"median of {repeat}"
    rows = [
        Row(f"1-sample gradebook sweep, server up ({n})", med["sweep"], "s",
            "inspect eval, 1 sample, mockllm", med["eval"], med["sweep"] / med["eval"],
            "<= 1.5x", med["sweep"] / med["eval"] <= 1.5),
        info("1-sample gradebook sweep, cold (starts the local server)", cold, "s",
             "inspect eval, 1 sample, mockllm", med["eval"], cold / med["eval"]),
        Row(f"gradebook score, nothing to do ({n})", med["score"], "s",
            'gradebook sql "select 1"', med["sql"], med["score"] / med["sql"],
            "<= 2x", med["score"] / med["sql"] <= 2),
        Row(f"gradebook rescore, nothing changed ({n})", med["rescore"], "s",
            'gradebook sql "select 1"', med["sql"], med["rescore"] / med["sql"],
            "<= 2x", med["rescore"] / med["sql"] <= 2),
    ]  # fmt: skip
    load = f"{BUSY_PROCESSES} busy processes beside it"
    anchor = f'gradebook sql "select 1", {BUSY_PROCESSES} busy processes beside it'
    for k, what in (("score", "nothing to do"), ("rescore", "nothing changed")):
        ratio = med[f"busy {k}"] / med["busy sql"]
        rows.append(Row(f"gradebook {k}, {what}, {load} ({n})", med[f"busy {k}"], "s", anchor,
                        med["busy sql"], ratio, f"<= 3x sql under {load}", ratio <= 3))  # fmt: skip
    for k, v in times.items():
        print(f"{k}: " + ", ".join(f"{s:.2f}" for s in v) + " s")
    # wall time against CPU time tells waiting (a lock, I/O) from work slowed by the load
    for k, v in CPU.items():
        print(f"CPU {k}: " + ", ".join(f"{s:.2f}" for s in v) + " s")
    emit("CLI overhead (each command a fresh process)", rows, args.json)


if __name__ == "__main__":
    main()
