"""`gradebook demo`: the whole pipeline offline, with nothing installed but the package (+ Docker).

Two "model versions" are served by a local OpenAI-compatible server started here (the stand-in
for vLLM): both answer the bundled tasks from a script, each getting a different set of problems
wrong, so the two runs differ and the history has something to show. Generation goes through
Inspect's real `openai-api` provider; scoring, the warehouse and the gate are the real thing.
Without a Docker Engine the code task's samples are unscored with reason `sandbox_unavailable`,
the gate says so, and the demo prints the commands that grade them from the saved transcripts
once Docker is up.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.demo_files import print_commands, toml_text
from flows.cli.pipeline import (
    VerboseOption,
    _run_flow,
    print_gate_problems,
    print_heal,
    print_scored_copies,
    summary_table,
)
from flows.runtime.console import console, err_console, quiet_prefect
from flows.runtime.envvars import environ_set
from sweeps.mock_server import scripted_server
from warehouse.commands import command, program
from warehouse.heal import unscored_in_rows

__all__ = [
    "DEMO_MODELS",
    "METRICS_SQL",
    "DemoTask",
    "demo_config",
    "demo_tasks",
    "next_commands",
    "register",
    "run_demo",
]

# (model id served locally, which problems it gets wrong: index % mod == rem)
DEMO_MODELS = {"demo-v1": (3, 0), "demo-v2": (5, 1)}
HUMANEVAL_LIMIT = 10  # each sample runs its tests in a container: keep the demo short


@dataclass(frozen=True)
class DemoTask:
    """A bundled task the demo runs, with scripted right and wrong completions per prompt."""

    spec: str  # a registered Inspect task name
    verifiers: list[str]
    answers: list[tuple[str, str, str]]  # (text that identifies the prompt, correct, wrong)
    args: dict[str, Any] = field(default_factory=dict)
    needs_docker: bool = False


def demo_tasks() -> list[DemoTask]:
    """The bundled tasks: math always; the first HumanEval problems when tasks.code is there."""
    out: list[DemoTask] = []
    math_mod = importlib.import_module("tasks.math")
    by_id = {c.id: c for c in math_mod.scripted_completions()}
    answers = [
        (str(s.input), by_id[s.id].correct, by_id[s.id].wrong)
        for s in math_mod.bundled_samples()
        if s.id in by_id
    ]
    # registered task names, not file paths: a task module loaded from its path is not in
    # sys.modules, which breaks dataclasses defined in it
    out.append(DemoTask("math_verified", ["math"], answers))
    try:
        code_mod = importlib.import_module("tasks.code")
    except ModuleNotFoundError:
        return out
    answers = []
    for sample in code_mod.humaneval_samples(HUMANEVAL_LIMIT):
        prompt = sample.metadata["prompt"]
        solution = str(sample.target)  # prompt + canonical solution
        answers.append(
            (
                prompt,
                f"```python\n{solution}\n```",
                # a plausible wrong completion: right signature, wrong body
                f"```python\n{prompt}    return None\n```",
            )
        )
    out.append(
        DemoTask(
            "humaneval", ["unit_tests"], answers, args={"limit": HUMANEVAL_LIMIT}, needs_docker=True
        )
    )
    return out


def make_script(tasks: list[DemoTask]) -> Callable[[str, list[dict[str, Any]]], str | int]:
    """The answering policy of the demo server: each model version is wrong on its own set."""
    table = [a for t in tasks for a in t.answers]

    def script(model: str, messages: list[dict[str, Any]]) -> str | int:
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        mod, rem = DEMO_MODELS.get(model, (2, 0))
        for i, (key, correct, wrong) in enumerate(table):
            if key and key in prompt:
                return wrong if i % mod == rem else correct
        return "I cannot answer that."

    return script


def demo_config(directory: Path, tasks: list[DemoTask]) -> dict[str, Any]:
    """The demo's sweep config (as a TOML-shaped dict; also written to DIR/demo.toml)."""
    return {
        "name": "demo",
        "log_dir": str(directory / "logs"),
        "warehouse": str(directory / "demo.duckdb"),
        "models": [
            {"name": name, "model": f"openai-api/local/{name}", "config": {"max_retries": 2}}
            for name in DEMO_MODELS
        ],
        "tasks": [
            {"task": t.spec, "verifiers": t.verifiers, **({"args": t.args} if t.args else {})}
            for t in tasks
        ],
        "gates": {
            "min_accuracy": 0.6,
            "max_unscored_rate": 0.05,
            "max_error_rate": 0.05,
            "max_regression": None,
        },
    }


def run_demo(directory: Path) -> int:
    """Run the demo sweep into `directory`; print the summary and what to try next.

    Returns:
        0 when the pipeline ran (the gate verdicts are part of the show), 2 if it could not,
        130/143 if SIGINT/SIGTERM stopped it.
    """
    from flows.sweep import run_sweep
    from sweeps.config import parse_config

    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    tasks = demo_tasks()
    raw = demo_config(directory, tasks)
    (directory / "demo.toml").write_text(toml_text(raw))
    cfg = parse_config(raw, source=directory / "demo.toml")
    console.print(
        f"[bold]gradebook demo[/bold]: {len(DEMO_MODELS)} model versions x {len(tasks)} task(s), "
        f"served offline by a local OpenAI-compatible server; warehouse {cfg.warehouse}"
    )
    with scripted_server(make_script(tasks), models=list(DEMO_MODELS)) as server:
        with environ_set({"LOCAL_BASE_URL": server.base_url, "LOCAL_API_KEY": "demo"}):
            result = run_sweep(cfg)
    console.print(summary_table(result))
    print_scored_copies(result)
    print_gate_problems(result)
    if result.stopped is not None:
        return result.exit_code
    db, toml = cfg.warehouse, directory / "demo.toml"
    # counted from the summary (latest attempts): the sweep's own retry leaves a second
    # unscored row per sample in the history, which is not a second sample
    unscored = unscored_in_rows(result.rows)
    print_heal(db, unscored, ["gate", "--config", str(toml)])
    if not unscored and not any(t.needs_docker for t in tasks):
        console.print(
            "\n[dim]The HumanEval task is not part of this build (tasks/code.py not found).[/dim]"
        )
    console.print("\n[bold]Next:[/bold]")
    if program() != "gradebook":
        # the commands below name the program by its path; this is the shorter way
        console.print(
            "  # `gradebook` is not on your PATH: `source .venv/bin/activate` puts it there",
            markup=False,
        )
    print_commands(*next_commands(db, cfg.scored_log_dir if result.scored_logs else None))
    if any(g.log is None for g in result.generations):
        return 2
    return 0


# run_metrics has a row per verifier fingerprint: after a re-score, the older fingerprint's rows
# would read as duplicates of the current ones
METRICS_SQL = (
    "SELECT model, task, scorer, accuracy, n_scored, n_unscored FROM run_metrics "
    "SEMI JOIN current_verifiers USING (scorer, fingerprint) ORDER BY model, task"
)


def next_commands(db: Path, scored: Path | None = None) -> list[str]:
    """The demo's "Next:" lines: commands that run as printed, and comments (`scored`: where
    the sweep wrote the scored copies of its logs)."""
    view = [f"# the logs with gradebook's scores in Inspect View: inspect view --log-dir "
            f"{shlex.quote(str(scored))}"] if scored else []  # fmt: skip
    return [
        "# accuracy under each verifier's current code (run_metrics keeps every version's):",
        command("sql", "--db", db, METRICS_SQL),
        command("verifiers", "--db", db),
        *view,
        "# edit a verifier (e.g. scorers/math/grader.py), then re-grade every saved sample:",
        command("rescore", "--db", db, "--dry-run"),
        command("rescore", "--db", db),
        command("sql", "--db", db, "--format", "line", "SELECT * FROM grade_flips"),
        command("report", "--db", db),
    ]


def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="Where the demo's logs and warehouse go (default .gradebook/demo, "
            "or .gradebook/demo-agentic).",
        ),
    ] = None,
    agentic: Annotated[
        bool,
        typer.Option(
            "--agentic",
            help="Instead: a scripted coding agent in Docker sandboxes; its workspaces are "
            "captured, then re-scored from the logs after the scorer's test command changes.",
        ),
    ] = False,
    own_image: Annotated[
        bool,
        typer.Option(
            "--own-image",
            help="With --agentic: the task brings its own image (a compose file whose "
            "Dockerfile adds the checker its scorer calls); it runs and is re-scored in it.",
        ),
    ] = False,
    verbose: VerboseOption = False,
) -> None:
    """End to end offline: two model versions, math + HumanEval, a warehouse, a gate."""
    quiet_prefect(verbose)
    if own_image and not agentic:
        err_console.print("[red]error:[/red] --own-image goes with --agentic: add --agentic")
        raise typer.Exit(2)
    if agentic:
        from flows.cli.demo_agentic import run_agentic_demo

        where = directory or Path(".gradebook/demo-agentic")
        code = _run_flow(verbose, lambda: run_agentic_demo(where, own_image=own_image))
    else:
        code = _run_flow(verbose, lambda: run_demo(directory or Path(".gradebook/demo")))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `gradebook demo` to the gradebook CLI."""
    app.command("demo")(demo)
