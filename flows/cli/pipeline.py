"""The pipeline commands: sweep, generate, serve, and the helpers the commands share (the
scoring commands, score, rescore and verifiers, are flows.cli.scoring).

Exit codes: 0 ok, 1 a gate failed, 2 bad input or environment, or what was asked could not all
be done (as `gate`'s "cannot evaluate": `rescore` with a verifier it could not check, `score`
with a log it could not read); the output says what to run. Errors are one line naming the
input and what to do.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from flows.cli.ingest_limits import MaxLogOption, MaxMemberOption, MaxRatioOption, set_limits
from flows.runtime.console import console, err_console, quiet_prefect, shown, waiting

__all__ = ["register"]

T = TypeVar("T")

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar="GRADEBOOK_DB", help="DuckDB warehouse file (env GRADEBOOK_DB)."),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show Prefect's own log lines and server output.")
]
WorkersOption = Annotated[
    int | None, typer.Option("--workers", min=1, help="Scoring worker processes (default: CPUs).")
]
LockTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--lock-timeout",
        envvar="GRADEBOOK_LOCK_TIMEOUT",
        min=0,
        help="Seconds a write waits for another process (a reader) to release the warehouse "
        "(env GRADEBOOK_LOCK_TIMEOUT; default 5); graded results are kept in hand meanwhile.",
    ),
]
RetryOption = Annotated[
    bool,
    typer.Option(
        "--retry-unscored",
        help="Also grade again samples left unscored for a reason a retry can fix "
        "(grader_failed, sandbox_unavailable, timeout, verifier_error); old rows stay.",
    ),
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    # soft_wrap: an error is one line per problem, however narrow the terminal
    err_console.print(f"[red]error:[/red] {shown(message)}", soft_wrap=True)
    return typer.Exit(code)


def _run_flow(
    verbose: bool,
    fn: Callable[[], T],
    meanwhile: Callable[[], object] | None = None,
    lock_timeout: float | None = None,
) -> T:
    """Run `fn` (which calls flows) against a Prefect API; map known failures to exit 2.

    `meanwhile` runs while a local Prefect server boots (checks that would otherwise wait).
    `lock_timeout`: the warehouse lock timeout for every open the flows make.
    SIGINT and SIGTERM stop the command (flows.runtime.interrupts): exit 130 or 143.
    """
    from flows.runtime.envvars import environ_set
    from flows.runtime.interrupts import exit_code, stop_on_signals, stop_signal
    from flows.runtime.server import PrefectServerError
    from flows.runtime.session import PrefectUnavailable, prefect_session
    from sweeps.config import ConfigError
    from warehouse import WarehouseError
    from warehouse.connection import LOCK_TIMEOUT_ENV

    quiet_prefect(verbose)
    env = {LOCK_TIMEOUT_ENV: str(lock_timeout)} if lock_timeout is not None else {}
    try:
        with environ_set(env), stop_on_signals(), prefect_session(meanwhile=meanwhile):
            return fn()
    except (ConfigError, PrefectUnavailable, PrefectServerError, WarehouseError) as exc:
        raise _fail(str(exc)) from None
    except RuntimeError as exc:
        from flows.cluster.dispatch import DispatchError

        if isinstance(exc, DispatchError):  # a cluster without its deployments or workers
            raise _fail(str(exc)) from None
        raise
    except KeyboardInterrupt:
        stopped = stop_signal()
        if stopped is None:
            raise _fail("interrupted", 130) from None
        raise typer.Exit(exit_code(stopped)) from None  # the handler said so, in one line


def _no_op(check: Callable[[], T]) -> T | None:
    """Run a warehouse-only check; a warehouse it cannot read is reported as the flow would."""
    from warehouse import SchemaTooNew, WarehouseLocked, WarehouseMissing

    try:
        return check()
    except (WarehouseLocked, WarehouseMissing, SchemaTooNew) as exc:
        raise _fail(str(exc)) from None


def _load(config: Path, *, tasks: bool = False, generates: bool = False) -> Any:
    """Load a sweep config; with `tasks`, also load each task once (before Prefect starts);
    with `generates` (the command generates now), also check each model's environment and the
    warehouse the results go to."""
    from sweeps.config import ConfigError, load_config

    try:
        cfg = load_config(config)
        if tasks:
            _check_tasks(cfg)
        if generates and cfg.cluster is None:
            # in cluster mode the workers need them, not this host: each generate run checks
            # its own host's environment (flows.cluster.work)
            from sweeps.model_servers import check_model_env

            check_model_env(cfg)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    if generates:
        _check_warehouse(cfg.warehouse)
    return cfg


def _check_warehouse(db: Path) -> None:
    """Fail now, before Prefect starts or a model is called, on a --db that cannot be a
    warehouse (not a DuckDB file, a missing directory, a read-only file system)."""
    from warehouse import Warehouse, WarehouseError

    try:
        Warehouse(db).check()
    except WarehouseError as exc:
        raise _fail(str(exc)) from None


def _check_tasks(cfg: Any) -> None:
    # Loading every task (Inspect's imports, the task files) takes a second or two: a command
    # that runs flows does it while its local Prefect server boots (`_run_flow(meanwhile=)`),
    # still before any model call; a task that does not load is exit 2 with one line.
    from sweeps.tasks import check_tasks
    from verifiers.specs import check_verifiers

    check_tasks(cfg)
    check_verifiers(cfg)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def summary_table(result: Any) -> Table:
    """The end-of-sweep table: one row per (model, task, scorer) under current fingerprints."""
    table = Table(title=f"sweep {result.name}", title_justify="left", pad_edge=False)
    for col in ("model", "task", "scorer", "state"):
        table.add_column(col, overflow="fold")
    for col in ("n", "err", "scored", "unscored", "acc", "strict"):
        table.add_column(col, justify="right")
    table.add_column("gate", overflow="fold")
    for r in result.rows:
        unscored = str(r.unscored)
        if r.unscored_reasons:
            unscored += " (" + ", ".join(f"{k} {v}" for k, v in r.unscored_reasons.items()) + ")"
        gate = {"pass": "[green]pass[/green]", "fail": "[red]FAIL[/red]"}.get(
            r.gate or "", f"[yellow]{r.gate or '–'}[/yellow]"
        )
        table.add_row(
            shown(r.model),
            shown(r.task),
            shown(r.scorer or "–"),  # a variant's name has brackets: `match[numeric=true]`
            r.state if r.state == "done" else f"[yellow]{r.state}[/yellow]",
            str(r.samples),
            str(r.errored),
            str(r.scored),
            unscored,
            _pct(r.accuracy),
            _pct(r.accuracy_strict),
            gate if r.note is None else f"{gate} [red]{r.note}[/red]",
        )
    return table


def print_gate_problems(result: Any) -> None:
    # soft_wrap: a problem names a command to run, which a folded line would break; escape:
    # task names and paths are text, not markup
    for gate in result.gates.values():
        where = shown(f"{gate.task} / {gate.model}")
        for rule in getattr(gate, "failing", []) or []:
            console.print(f"  [red]gate[/red] {where}: {shown(_rule_text(rule))}", soft_wrap=True)
        for problem in getattr(gate, "problems", []) or []:
            console.print(f"  [yellow]gate[/yellow] {where}: {shown(problem)}", soft_wrap=True)


def print_heal(db: Path | str, unscored: list[Any], gate: list[str] | None) -> None:
    """The samples left unscored for a retryable reason, and the command that grades exactly
    those again (warehouse.heal); nothing when there are none."""
    from warehouse.heal import heal_lines

    lines = heal_lines(db, unscored, gate)
    if lines:
        console.print(f"\n[yellow]{shown(lines[0])}[/yellow]", soft_wrap=True)
    for line in lines[1:]:
        # a command to paste: never folded, never read as markup
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def _print_heal_runs(db: Path, left: list[Any]) -> None:
    """`print_heal`, then the gate of the runs that hold those samples."""
    runs = [a for run in sorted({u.run_id for u in left}) for a in ("--run", run)]
    print_heal(db, left, ["gate", "--db", str(db), *runs])


def _rule_text(rule: Any) -> str:
    detail = getattr(rule, "detail", None) or getattr(rule, "message", None)
    return str(detail) if detail else str(rule)


def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep TOML file.")],
    workers: WorkersOption = None,
    no_gate: Annotated[bool, typer.Option("--no-gate", help="Skip the gate step.")] = False,
    max_member_mb: MaxMemberOption = None,
    max_log_mb: MaxLogOption = None,
    max_inflate_ratio: MaxRatioOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Generate -> ingest -> score -> gate every (model, task) of CONFIG; print a summary.

    SIGINT or SIGTERM stops the whole sweep: the eval in flight is cancelled, what was written
    (cancelled logs too) is ingested, the summary shows every pair; exit 130 or 143. A second
    signal exits at once.
    """
    quiet_prefect(verbose)  # before Prefect is imported: its logging is set up then
    set_limits(max_member_mb, max_log_mb, max_inflate_ratio)  # they win over [ingest]
    cfg = _load(config, generates=True)  # a bad config is said before seconds of imports
    with waiting("loading Inspect and Prefect", plain=False):
        from flows.sweep import run_sweep
    result = _run_flow(
        verbose,
        lambda: run_sweep(cfg, workers=workers, gate=not no_gate),
        meanwhile=lambda: _check_tasks(cfg),
    )
    console.print(summary_table(result))
    print_scored_copies(result)
    print_gate_problems(result)
    if result.stopped is not None:
        _print_stopped(result)
    else:
        from warehouse.heal import unscored_in_rows

        print_heal(cfg.warehouse, unscored_in_rows(result.rows), ["gate", "--config", str(config)])
    raise typer.Exit(result.exit_code)


def print_scored_copies(result: Any) -> None:
    """Where the sweep's scored copies are, as the command that shows them (`inspect view`)."""
    for problem in result.scored_problems:
        err_console.print(f"note: {shown(problem)}", soft_wrap=True)
    if result.scored_logs:
        where = str(result.scored_logs[0]).rsplit("/", 1)[0]  # a directory or an s3:// prefix
        console.print(
            f"scored copies of the logs ({len(result.scored_logs)}), for Inspect View: "
            f"inspect view --log-dir {shlex.quote(str(where))}",
            markup=False, soft_wrap=True,
        )  # fmt: skip


def print_skipped(skipped: list[str]) -> None:
    """One line naming the files under the given directories that are not Inspect logs."""
    if skipped:
        names = ", ".join(skipped[:5]) + (
            f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        )
        err_console.print(
            f"note: skipped {len(skipped)} file(s) that are not Inspect logs: {shown(names)}",
            soft_wrap=True,
        )


def _print_stopped(result: Any) -> None:
    from flows.runtime.interrupts import signal_name

    logs = [g.log for g in result.generations if g.log]
    console.print(
        f"sweep stopped by {signal_name(result.stopped)}: the logs written are in the warehouse"
        + (", not all scored or gated" if logs else ""),
        soft_wrap=True,
    )


def generate(
    config: Annotated[Path, typer.Argument(help="Sweep TOML file.")],
    verbose: VerboseOption = False,
) -> None:
    """Generate only (Inspect eval, score=False) every (model, task) of CONFIG into its log dir."""
    quiet_prefect(verbose)
    cfg = _load(config, generates=True)  # a bad config is said before seconds of imports
    with waiting("loading Inspect and Prefect", plain=False):
        from flows.generate import generate_flow
    results = _run_flow(verbose, lambda: generate_flow(cfg), meanwhile=lambda: _check_tasks(cfg))
    table = Table(title="generated logs", title_justify="left")
    for col in ("model", "task", "samples", "errored", "status", "log"):
        table.add_column(col)
    for g in results:
        table.add_row(g.model, g.task, str(g.samples), str(g.errored), g.status,
                      g.log or f"[red]{g.error or '–'}[/red]")  # fmt: skip
    console.print(table)
    from flows.runtime.interrupts import exit_code, stop_signal

    if stop_signal() is not None:
        raise typer.Exit(exit_code(stop_signal()))
    raise typer.Exit(2 if any(g.log is None for g in results) else 0)


def serve(
    configs: Annotated[list[Path], typer.Argument(help="Sweep TOML files to schedule.")],
    watch_every: Annotated[
        int, typer.Option("--watch-every", min=5, help="Seconds between verifier checks.")
    ] = 60,
    max_member_mb: MaxMemberOption = None,
    max_log_mb: MaxLogOption = None,
    max_inflate_ratio: MaxRatioOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run sweeps on their cron schedules and re-score when a verifier changes; Ctrl-C stops."""
    from flows.serve import serve_configs

    set_limits(max_member_mb, max_log_mb, max_inflate_ratio)  # the runs it starts inherit them

    # every config and its tasks before the server starts: a bad spec would otherwise fail
    # only at its scheduled run, hours later, with nothing said at registration
    cfgs = [_load(c, tasks=True) for c in configs]
    for cfg in cfgs:
        _check_warehouse(cfg.warehouse)
    try:
        code = serve_configs(cfgs, watch_every=watch_every, verbose=verbose)
    except RuntimeError as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(code)


def register(app: typer.Typer, scoring: tuple[Callable[..., Any], ...] = ()) -> None:
    """Add the pipeline commands to the gradebook CLI, with the scoring commands
    (flows.cli.scoring) between them, in the order `--help` lists them."""
    for fn in (sweep, generate, *scoring, serve):
        app.command(fn.__name__)(fn)
