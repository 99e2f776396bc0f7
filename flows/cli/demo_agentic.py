"""`gradebook demo --agentic`: a sandbox scorer re-scored from the log, offline.

The loop a team with an agentic eval lives in: a sweep runs a (scripted) coding agent in a
sandbox per sample and scores it by running the repository's tests there; then the test
command changes, and every sample is graded again from its captured workspace, restored into
a fresh container, with no model call; the verdicts that changed are in `grade_flips`.

The agent is tasks/agentic.py's `scripted_agent` (Inspect's mockllm driven by a script, so no
model server is needed); its scorer is a copy of tasks/agentic_scorer.py in the demo's
directory, which the demo edits the way a user would. Docker (the sandbox image) is required.

`--own-image`: the task brings its own image (a compose file whose Dockerfile adds the
repository's checker, `repo-check`), and its scorer (a copy of tasks/agentic_checker.py) calls
that tool: the sandboxes run in that image, and the re-score restores into it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flows.cli.demo_files import print_commands, toml_text
from flows.cli.pipeline import print_gate_problems, summary_table
from flows.runtime.console import console, err_console
from warehouse.commands import command

__all__ = ["agentic_config", "run_agentic_demo"]

SCORER = "repo_tests"
IMAGE_SCORER = "repo_check"  # --own-image: the scorer that calls the image's own checker
NARROW = '"test_calc.AddTests"]'  # the template's test command ends so
WIDE = '"test_calc"]'  # ... and the demo's edit makes it run the whole suite


def agentic_config(
    directory: Path, scorer_file: Path, tickets: int, compose: Path | None = None
) -> dict[str, Any]:
    """The demo's sweep config (a TOML-shaped dict; also written to DIR/demo.toml); with
    `compose`, the task runs in the image that compose file builds."""
    args: dict[str, Any] = {"tickets_n": tickets}
    if compose is not None:
        args["image_recipe"] = str(compose)
    return {
        "name": "demo-agentic",
        "log_dir": str(directory / "logs"),
        "warehouse": str(directory / "demo.duckdb"),
        "models": [
            {
                "name": "scripted-agent",
                "model": "mockllm/model",
                "args_from": "tasks.agentic:scripted_agent_args",
            }
        ],
        "tasks": [
            {
                "task": "fix_the_bug",
                "args": args,
                "verifiers": [f"{scorer_file}@{IMAGE_SCORER if compose else SCORER}"],
            }
        ],
        "gates": {"min_accuracy": 0.5, "max_unscored_rate": 0.05, "max_regression": None},
    }


def _scorer_template(own_image: bool) -> str:
    import tasks.agentic_checker
    import tasks.agentic_scorer

    template = tasks.agentic_checker if own_image else tasks.agentic_scorer
    return Path(template.__file__).read_text()


def _edit_test_command(path: Path) -> str:
    """Widen the scorer's test command to the whole suite; returns the edited line."""
    text = path.read_text()
    if NARROW not in text:
        raise ValueError(f"{path}: no test command ending in {NARROW} to edit")
    path.write_text(text.replace(NARROW, WIDE, 1))
    found = re.search(r"^(TEST|CHECK)_COMMAND = .*$", path.read_text(), re.MULTILINE)
    return found.group(0) if found else WIDE


def run_agentic_demo(directory: Path, tickets: int = 6, *, own_image: bool = False) -> int:
    """Sweep -> scores -> edit the scorer's test command -> rescore -> flips; with
    `own_image`, in the task's own image (built from tasks/data/agentic_image/).

    Returns:
        0 when the loop ran, 2 if it could not (no Docker, a failed generation), 130/143 if a
        signal stopped it.
    """
    from flows.rescore import rescore_flow
    from flows.sweep import run_sweep
    from scorers.sandbox.pool import sandbox_down
    from sweeps.config import parse_config
    from tasks import agentic
    from warehouse import Warehouse

    problem = sandbox_down()
    if problem is not None:
        err_console.print(
            f"[red]error:[/red] gradebook demo --agentic runs its agent in the Docker sandbox, "
            f"which is not available: {problem}",
            soft_wrap=True,
        )
        return 2
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    name = IMAGE_SCORER if own_image else SCORER
    scorer_file = directory / f"{name}.py"
    scorer_file.write_text(_scorer_template(own_image))  # the scorer as shipped, each run
    compose = None
    if own_image:
        from scorers.sandbox.image import image_tag

        compose = agentic.image_compose(directory / "task-image", image_tag())
    raw = agentic_config(directory, scorer_file, tickets, compose)
    toml = directory / "demo.toml"
    toml.write_text(toml_text(raw))
    cfg = parse_config(raw, source=toml)
    db = cfg.warehouse
    console.print(
        f"[bold]gradebook demo --agentic[/bold]: a scripted coding agent fixes a failing test "
        f"in {tickets} sandboxes (bash tool, one container per sample); its workspaces are "
        f"captured into {cfg.workspaces.store}; warehouse {db}"
    )
    result = run_sweep(cfg)
    console.print(summary_table(result))
    print_gate_problems(result)
    if result.stopped is not None:
        return result.exit_code
    if any(g.log is None for g in result.generations):
        return 2
    model_calls = agentic.calls[0]
    with Warehouse(db).read() as con:
        n, digests, stored = con.execute(
            "SELECT count(*), count(DISTINCT digest), "
            "(SELECT sum(s) FROM (SELECT any_value(stored_bytes) AS s FROM workspaces "
            " GROUP BY digest)) FROM workspaces WHERE status = 'captured'"
        ).fetchone()
    console.print(
        f"\n{n} workspaces captured: {digests} distinct archive(s), {stored or 0:,} bytes stored "
        f"(identical workspaces are stored once); the agent made {model_calls} model calls"
    )
    if own_image:
        with Warehouse(db).read() as con:
            images = con.execute("SELECT DISTINCT image, recipe FROM workspaces").fetchall()
        for image, recipe in images:
            console.print(
                f"ran in the task's own image {image} (adds repo-check), recipe "
                f"{(recipe or '')[:12]} kept in the workspace store",
                markup=False,
            )

    line = _edit_test_command(scorer_file)
    console.print(
        f"\n[bold]The test command changed[/bold] ({scorer_file.name}): {line}\n"
        "Re-scoring every sample from its captured workspace, in a fresh container each:"
    )
    plans = rescore_flow(str(db), verifier_modules=[f"{scorer_file}@{name}"])
    for plan in plans:
        if plan.changed:
            written = sum(w.written for w in plan.written)
            console.print(
                f"  rescore {plan.scorer} {plan.digest[:12]}: {written} sample(s) graded again, "
                f"{plan.flipped_samples} flipped; model calls: {agentic.calls[0] - model_calls}"
            )
    with Warehouse(db).read() as con:
        flips = con.execute(
            "SELECT sample_id, old_value, new_value, new_explanation FROM grade_flips "
            "WHERE scorer = ? ORDER BY sample_id::INTEGER",
            [name],
        ).fetchall()
    for sample_id, old, new, why in flips:
        console.print(f"  flip ticket {sample_id}: {old} -> {new}  ({why})", markup=False)
    console.print("\n[bold]Next:[/bold]")
    print_commands(
        command("sql", "--db", db, "SELECT * FROM grade_flips"),
        command(
            "sql",
            "--db",
            db,
            f"SELECT sample_id, fingerprint, command, exit_code, stderr FROM sandbox_calls "
            f"WHERE scorer = '{name}' ORDER BY sample_id",
        ),
        command("sql", "--db", db, "SELECT * FROM workspaces"),
        f"# edit {scorer_file} again, then:",
        command("rescore", "--db", db, "--verifier-module", f"{scorer_file}@{name}"),
    )
    return 0
