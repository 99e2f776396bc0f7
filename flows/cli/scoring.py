"""The scoring commands: score, rescore, verifiers (what grades the saved logs, and with what).

Exit codes and error lines as in flows.cli.pipeline, whose helpers these share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flows.cli.ingest_limits import MaxLogOption, MaxMemberOption, MaxRatioOption, set_limits
from flows.cli.pipeline import (
    DbOption,
    LockTimeoutOption,
    RetryOption,
    VerboseOption,
    WorkersOption,
    _check_warehouse,
    _fail,
    _load,
    _no_op,
    _print_heal_runs,
    _run_flow,
    print_skipped,
)
from flows.runtime.console import console, err_console, quiet_prefect, shown
from verifiers.modules import ModulesOption
from verifiers.roles import ModelRoleOption

__all__ = ["rescore", "score", "verifiers"]

TaskDirOption = Annotated[
    str | None,  # not a Path: it would fold `s3://b/x` into `s3:/b/x`, a local name
    typer.Option(
        "--task-dir",
        help="The task's directory, for logs with no captured workspace: sandbox scorers run "
        "in the image its compose file or Dockerfile builds (default: beside the log's task "
        "file, if it is here; else gradebook's image, marked stand_in in the scores).",
    ),
]


def _use_task_dir(given: str | None) -> None:
    """`--task-dir` for every restore this command's grading runs (workspaces.foreign_image,
    through the environment its worker processes inherit); a URL or not a directory: one line,
    exit 2."""
    if given is None:
        return
    from warehouse.object_store import UnsupportedLocation, local_path

    try:
        task_dir = local_path(given)
    except UnsupportedLocation as exc:
        raise _fail(
            f"--task-dir {exc}: the task's image is built from its files on this machine; "
            "copy them here and give that directory"
        ) from None
    if not task_dir.is_dir():
        raise _fail(
            f"--task-dir {task_dir}: no such directory; give the directory of the task file, "
            "where the compose file or Dockerfile its logs name is"
        )
    import os

    from workspaces.foreign_image import TASK_DIR_ENV

    os.environ[TASK_DIR_ENV] = str(task_dir.resolve())


def _with_judges(modules: list[str] | None, roles: list[str], entries: list) -> list[str]:
    """`--verifier-module`s plus the judge scorers among `entries` with `--model-role` bound
    (verifiers.roles); none of them a judge is one line (exit 2)."""
    from verifiers.roles import bindings, judge_specs

    try:
        bound = bindings(roles)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    specs = judge_specs(entries, bound)
    if not specs:
        raise _fail(
            f"--model-role {roles[0]}: no judge-graded scorer here to bind it to (the verifiers "
            "given, or those the logs or warehouse name); drop it, or pass --verifier "
            "model_graded_qa"
        )
    return [*(modules or []), *specs]


def _load_verifiers(modules: list[str] | None, names: list[str], db: Path) -> None:
    """Import the verifier modules the user named (and rebuild every verifier the warehouse
    stores a spec of, verifiers.stored), then check every verifier asked for is loaded or
    is an Inspect scorer spec; a failure is one line that names the module or name and the fix
    (exit 2)."""
    from scorers.inspect_scorers.specs import SpecError
    from verifiers.modules import VerifierLoadError, load_modules, recorded_modules
    from verifiers.specs import names_for_entries
    from verifiers.stored import rebuild, unknown_verifiers

    try:
        load_modules(modules)
    except VerifierLoadError as exc:
        raise _fail(str(exc)) from None
    for note in rebuild(db).overridden.values():  # a flag given here wins, and says so
        console.print(f"note: {shown(note)}", soft_wrap=True)
    problem = unknown_verifiers(names, db)
    if problem:
        try:  # not a loaded verifier: an Inspect scorer the user names (trusted)
            names_for_entries(names, trusted=True)
        except SpecError as exc:
            if any(n in recorded_modules(db) for n in names):
                # a verifier the warehouse knows the module of: the fix is that module's flag
                raise _fail(problem) from None
            raise _fail(str(exc) if len(names) == 1 else f"{exc} ({problem})") from None


def _log_locations_dir(location: str) -> str:
    """--scored-logs as given (`file://` as a local path); an unsupported URL is one line."""
    from warehouse.object_store import UnsupportedLocation, is_url, local_path, require_supported

    try:
        require_supported(location, "--scored-logs")
    except UnsupportedLocation as exc:
        raise _fail(str(exc)) from None
    return location if is_url(location) else str(local_path(location))


def _check_readable(files: list[str], given: int) -> None:
    """When no log given can be read (a truncated archive, a file that is not a log), say why
    for each, one line, and stop (exit 2) before any Prefect start; with some readable, the
    stage scores those and reports the others."""
    from warehouse.logs import LogReadError, read_header

    problems = []
    for path in files:
        try:
            read_header(str(path))
        except LogReadError as exc:
            problems.append(str(exc))
    if problems and len(problems) == given:
        for line in problems:
            err_console.print(f"[red]error:[/red] {shown(line)}", soft_wrap=True)
        raise typer.Exit(2)


def _check_logs_scorers(logs: list[str], db: Path) -> None:
    """Logs scored with the verifiers they name or their own scorers: each log whose scorers
    cannot be resolved is one line, and nothing is written (exit 2)."""
    from verifiers.modules import recorded_modules
    from verifiers.specs import log_problems

    _, problems = log_problems(logs, recorded_modules(db))
    for line in problems:
        err_console.print(f"[red]error:[/red] {shown(line)}", soft_wrap=True)
    if problems:
        raise typer.Exit(2)


# -- commands ------------------------------------------------------------------------------------


def _log_locations(logs: list[str]) -> list[str]:
    """The logs given, `file://` URLs as local paths; an unsupported URL or a local path that
    is not there is one line (exit 2). An object-store URL is checked when it is read."""
    from warehouse.object_store import UnsupportedLocation, is_url, local_path, require_supported

    out = []
    for given in logs:
        try:
            require_supported(given, "log")
        except UnsupportedLocation as exc:
            raise _fail(str(exc)) from None
        out.append(given if is_url(given) else str(local_path(given)))
    missing = [p for p in out if not is_url(p) and not Path(p).exists()]
    if missing:
        raise _fail(f"log not found: {', '.join(missing)}; pass paths of .eval or .json logs")
    return out


def _is_log_file(location: str) -> bool:
    """A log file, not a directory or prefix of logs (a URL: by its name)."""
    from warehouse.object_store import is_url

    if is_url(location):
        return location.endswith((".eval", ".json"))
    return Path(location).is_file()


def score(
    logs: Annotated[
        list[str],
        typer.Argument(
            help="Inspect logs (.eval or .json), or directories of logs, to score; local "
            "paths, file:// or s3:// URLs (an s3:// prefix is listed like a directory)."
        ),
    ],
    db: DbOption = Path("gradebook.duckdb"),
    verifier: Annotated[
        list[str] | None,
        typer.Option(
            "--verifier", help="Verifier name (repeatable); default: those the log names."
        ),
    ] = None,
    workers: WorkersOption = None,
    scored_logs: Annotated[
        str | None,
        typer.Option(
            "--scored-logs",
            help="Also write scored copies of the logs into this dir (or s3:// prefix).",
        ),
    ] = None,
    retry_unscored: RetryOption = False,
    verifier_module: ModulesOption = None,
    model_role: ModelRoleOption = None,
    lock_timeout: LockTimeoutOption = None,
    max_member_mb: MaxMemberOption = None,
    max_log_mb: MaxLogOption = None,
    max_inflate_ratio: MaxRatioOption = None,
    task_dir: TaskDirOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Score saved logs with their verifiers; samples already scored are skipped."""
    set_limits(max_member_mb, max_log_mb, max_inflate_ratio)  # every read of a log below
    _use_task_dir(task_dir)  # before any grading process starts: they inherit it
    logs = _log_locations(logs)
    if scored_logs is not None:
        scored_logs = _log_locations_dir(scored_logs)
    _check_warehouse(db)  # before the imports below (Inspect, Prefect: seconds)
    if model_role:
        from verifiers.roles import log_entries
        from warehouse.logs import LogReadError, expand_log_paths

        try:
            entries = verifier or log_entries(expand_log_paths(logs))
        except LogReadError as exc:
            raise _fail(str(exc)) from None
        verifier_module = _with_judges(verifier_module, model_role, entries)
    files = all(_is_log_file(p) for p in logs)  # not directories of logs
    if files:
        # an Inspect scorer's warm process boots from the command line alone, while the
        # verifiers are resolved (that imports Inspect too) and the warehouse is checked
        from flows.score_start import prewarm_for

        prewarm_for([str(p) for p in logs], verifier, early=verifier_module or [])
    # decided from the warehouse before Prefect or Inspect are loaded: a no-op costs ~ `sql`
    local = not any("://" in p for p in logs)  # a URL's log is compared once it is fetched
    if scored_logs is None and files and local:
        from verifiers.nothing_to_do import nothing_to_score

        _load_verifiers(verifier_module, verifier or [], db)
        given = [Path(p) for p in logs]
        noop = _no_op(lambda: nothing_to_score(given, db, verifier, retry_unscored=retry_unscored))
        if noop is not None:
            console.print(noop, soft_wrap=True)
            return
        # its Inspect scorers' warm process boots while Prefect loads and the stage ingests
        from flows.score_start import prewarm_for

        prewarm_for([str(p) for p in logs], verifier)

    _check_readable([p for p in logs if _is_log_file(p)], len(logs))
    quiet_prefect(verbose)  # before Prefect is first imported
    from flows.score import run_score
    from warehouse.logs import LogReadError, find_logs

    try:
        paths, skipped = find_logs(logs)
    except LogReadError as exc:
        raise _fail(str(exc)) from None
    print_skipped(skipped)
    _load_verifiers(verifier_module, verifier or [], db)
    if not verifier:
        _check_logs_scorers(paths, db)
    if scored_logs is not None:
        from warehouse.scored_logs import check_scored_log_dir

        try:
            check_scored_log_dir(paths, scored_logs)
        except ValueError as exc:
            raise _fail(str(exc)) from None
    try:
        summaries = _run_flow(
            verbose,
            lambda: run_score(
                paths,
                str(db),
                verifiers=verifier,
                workers=workers,
                scored_log_dir=scored_logs,
                retry_unscored=retry_unscored,
            ),
            lock_timeout=lock_timeout,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if summaries:  # none: stopped before grading, or nothing readable; the lines below say so
        console.print(_written_table(summaries))
    if summaries.stopped is not None:
        from flows.runtime.interrupts import exit_code

        _print_problems(summaries.problems)
        console.print(summaries.stop_line("gradebook score"), soft_wrap=True)
        raise typer.Exit(exit_code(summaries.stopped))
    stale = sum(s.stale for s in summaries)
    if stale:
        console.print(
            f"[yellow]{stale} sample(s) not graded: the verifier's code kept changing while they "
            "were graded; run the command again once it is saved[/yellow]",
            soft_wrap=True,
        )
    from warehouse.heal import retryable_unscored

    fingerprints = {s.scorer: s.fingerprint for s in summaries if s.fingerprint}
    _print_heal_runs(db, retryable_unscored(db, fingerprints, {s.run_id for s in summaries}))
    _print_problems(summaries.problems)
    if summaries.problems:
        raise typer.Exit(2)


def _written_table(summaries: list[Any]) -> Table:
    """What `score` wrote, one row per (run, verifier)."""
    table = Table(title="scores written", title_justify="left")
    for col in ("run", "scorer", "written", "retried", "scored", "correct", "unscored", "error"):
        table.add_column(col)
    for s in summaries:
        table.add_row(s.run_id[:12], shown(s.scorer), str(s.written), str(s.retried), str(s.scored),
                      str(s.correct), str(s.unscored), str(s.error))  # fmt: skip
    return table


def _print_problems(problems: list[str]) -> None:
    # what could not be read, one line each, as `ingest` reports it (the rest was scored)
    for line in problems:
        err_console.print(f"[red]error:[/red] {shown(line)}", soft_wrap=True)


def rescore(
    db: DbOption = Path("gradebook.duckdb"),
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Sweep TOML: load every verifier it names (its verifier_modules, its tasks' "
            "verifiers and scorer files, the tasks' own scorers), as `serve` does; its "
            "warehouse is the default --db.",
        ),
    ] = None,
    scorer: Annotated[
        list[str] | None, typer.Option("--scorer", help="Only this verifier (repeatable).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
    workers: WorkersOption = None,
    retry_unscored: RetryOption = False,
    verifier_module: ModulesOption = None,
    model_role: ModelRoleOption = None,
    lock_timeout: LockTimeoutOption = None,
    task_dir: TaskDirOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Re-score saved samples of every verifier whose fingerprint changed (no model calls).

    Exit 0: every verifier the warehouse has grades of was checked. Exit 2: one could not be
    (not loaded here: its file changed, a judge's key is not set, ...); the output names it and
    the command that checks it.
    """
    from verifiers.rescore_plan import plan_rescore, record_current, unchecked_lines
    from verifiers.stored import judge_entries, unloaded
    from warehouse import DEFAULT_DB

    _use_task_dir(task_dir)
    if config is not None:
        # the user's own file, as trusted as a flag: what it names is loaded, as for `serve`
        from verifiers.specs import config_modules

        cfg = _load(config, tasks=True)
        if db == Path(DEFAULT_DB):  # as `gate --config`: a --db (or GRADEBOOK_DB) given wins
            db = cfg.warehouse
        verifier_module = [*(verifier_module or []), *config_modules(cfg)]
    if not db.exists():
        raise _fail(f"{db}: no warehouse here; run a sweep first or pass --db")
    _check_warehouse(db)
    if model_role:
        verifier_module = _with_judges(verifier_module, model_role, judge_entries(db))
    _load_verifiers(verifier_module, scorer or [], db)
    # planned from the warehouse first: with nothing to do, no flow run (and no Prefect) at all
    plans = _no_op(lambda: plan_rescore(db, scorer, retry_unscored=retry_unscored)) or []
    if not dry_run and not any(p.changed for p in plans):
        # a reverted verifier has nothing left to grade, but its code is "newest" again
        _no_op(lambda: record_current(db, plans))
    if not dry_run and any(p.changed for p in plans):
        quiet_prefect(verbose)
        from flows.rescore import run_rescore

        plans = _run_flow(
            verbose,
            lambda: run_rescore(
                str(db),
                scorers=scorer,
                verifier_modules=list(verifier_module or []),  # --model-role's judges too
                workers=workers,
                retry_unscored=retry_unscored,
            ),
            lock_timeout=lock_timeout,
        )
    table = Table(title="rescore" + (" (dry run)" if dry_run else ""), title_justify="left")
    for col in ("scorer", "fingerprint", "runs", "samples", "retries", "flipped", "vs log"):
        table.add_column(col)
    for p in plans:
        ran = not dry_run and p.changed
        table.add_row(shown(p.scorer), p.digest[:12], str(len(p.run_ids)), str(p.pending),
                      str(p.retries), str(p.flipped_samples) if ran else "–",
                      str(p.differs_from_recorded) if ran else "–")  # fmt: skip
    console.print(table)
    for p in plans:
        _print_flips(p)
    from flows.runtime.interrupts import exit_code, stop_signal

    stopped = stop_signal()
    if stopped is not None:  # a stop cut it short: what was graded is written
        from flows.rescore import rescore_stop_line

        console.print(rescore_stop_line(plans), soft_wrap=True)
        raise typer.Exit(exit_code(stopped))
    # verifiers that graded this warehouse but are not loaded here: not checked (exit 2)
    missing = {} if scorer else dict(sorted(unloaded(db).items()))
    if not any(p.changed for p in plans):
        console.print(
            (
                "nothing to re-score among the verifiers checked here"
                if missing
                else "nothing to re-score: every verifier's fingerprint is current"
            )
            + (" and no sample is unscored for a retryable reason" if retry_unscored else "")
        )
    if not dry_run:
        from warehouse.heal import retryable_unscored

        _print_heal_runs(db, retryable_unscored(db, {p.scorer: p.digest for p in plans}))
    if missing:
        import sys

        again = sys.argv[1:]  # this command as it was typed
        if again[:1] != ["rescore"]:  # called in-process (a test's CliRunner)
            again = ["rescore", "--db", str(db), *(["--dry-run"] if dry_run else [])]
        for line in unchecked_lines(db, missing, again):
            # the last is a command to paste: never folded, never read as markup
            console.print(line, soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(2)


def _print_flips(plan: Any) -> None:
    """What one verifier's pass changed (`flip`: against gradebook's own older verdicts), apart
    from where it disagrees with the scores the logs recorded, then where its runs stand."""
    from verifiers.rescore_plan import MAX_FLIPS_SHOWN

    for kind, flips, query in (
        ("flip", plan.flips, "SELECT * FROM grade_flips"),
        ("vs log", plan.recorded_flips,
         "SELECT * FROM grade_flips WHERE starts_with(old_fingerprint, 'recorded:')"),
    ):  # fmt: skip
        for f in flips[:MAX_FLIPS_SHOWN]:
            console.print(
                f"  {kind} {plan.scorer} {f['run_id'][:10]} #{f['sample_id']}.{f['epoch']}: "
                f"{f['old_value']} -> {f['new_value']}  ({f['new_explanation']})",
                markup=False,
            )
        if len(flips) > MAX_FLIPS_SHOWN:
            console.print(f"  … {len(flips) - MAX_FLIPS_SHOWN} more: {query}", markup=False)
    outcome = plan.outcome()
    if outcome:
        console.print(f"  {outcome}", markup=False, soft_wrap=True)


def verifiers(
    db: DbOption = Path("gradebook.duckdb"), verifier_module: ModulesOption = None
) -> None:
    """List verifiers: name, current fingerprint, label, first seen, samples graded."""
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import all_verifiers
    from verifiers.stored import unloaded
    from warehouse import Warehouse, WarehouseError
    from warehouse.schema import RECORDED_PREFIX

    _load_verifiers(verifier_module, [], db)
    current = {name: fingerprint(v).digest for name, v in all_verifiers().items()}
    seen: dict[tuple[str, str], tuple[Any, int]] = {}
    recorded: set[str] = set()  # fingerprints of the scores logs held (warehouse.recorded_scores)
    if not db.exists() and db != Path("gradebook.duckdb"):
        # a warehouse the user named is not there: a typo, not "nothing graded yet"
        raise _fail(
            f"{shown(str(db))}: no such warehouse; pass --db (or GRADEBOOK_DB) the path of one "
            "(`gradebook verifiers` with neither lists the verifiers this install knows)"
        )
    if not db.exists():
        err_console.print(
            f"note: {shown(str(db))}: no warehouse here, so nothing is counted as graded; "
            "pass --db (or set GRADEBOOK_DB) to count a warehouse's grades",
            soft_wrap=True,
        )
    else:
        try:
            # best effort: a listing never waits for a writer (the next scoring records it)
            Warehouse(db).record_current(current, wait=False)
            with Warehouse(db).read() as con:
                for name, digest, first, n in con.execute(
                    "SELECT f.scorer, f.fingerprint, f.first_seen, "
                    # per sample, by its latest attempt: an outage's unscored attempts are not
                    # grades, and a retried sample counts once
                    "(SELECT count(*) FROM current_scores s WHERE s.scorer = f.scorer "
                    " AND s.fingerprint = f.fingerprint AND s.status = 'scored') "
                    "FROM fingerprint_order f"
                ).fetchall():
                    seen[(name, digest)] = (first, n)
                    if digest.startswith(RECORDED_PREFIX):
                        recorded.add(digest)
        except WarehouseError as exc:
            raise _fail(str(exc)) from None
    table = Table(
        title="verifiers",
        title_justify="left",
        caption="also any Inspect scorer: a registry name (match, choice, includes, exact, f1, "
        "model_graded_qa, ...), an installed package's (inspect_evals/NAME), or FILE.py@NAME",
        caption_justify="left",
    )
    table.add_column("name", no_wrap=True)
    table.add_column("fingerprint", no_wrap=True, min_width=12)
    table.add_column("label", overflow="fold", ratio=1)
    for col in ("first seen", "graded", "current"):
        table.add_column(col)
    for name, v in sorted(all_verifiers().items()):
        digest = current[name]
        first, n = seen.get((name, digest), (None, 0))
        table.add_row(shown(name), digest[:12], shown(v.label), str(first or "–"), str(n), "yes")
        for (other, d), (f, m) in sorted(seen.items()):
            if other == name and d != digest:
                older = "recorded in a log" if d in recorded else "(older)"
                table.add_row("", _short(d), f"[dim]{older}[/dim]", str(f or "–"), str(m), "")
    for name, fix in sorted(unloaded(db).items()):
        rows = sorted((d, f, m) for (other, d), (f, m) in seen.items() if other == name)
        for i, (d, f, m) in enumerate(rows or [("–", None, 0)]):
            label = f"[yellow]not loaded:[/yellow] {shown(fix)}" if i == 0 else ""
            table.add_row(
                shown(name) if i == 0 else "", _short(d), label, str(f or "–"), str(m), "no"
            )
    console.print(table)


def _short(fingerprint: str) -> str:
    """A fingerprint as listed: 12 hex digits; a recorded one (`recorded:inspect_ai-VERSION:
    DIGEST`) by the Inspect version that wrote it and 6 digits of its options' digest."""
    from warehouse.schema import RECORDED_PREFIX

    if fingerprint.startswith(RECORDED_PREFIX):
        origin, _, digest = fingerprint[len(RECORDED_PREFIX) :].rpartition(":")
        version = origin.removeprefix("inspect_ai-").split("+")[0]
        return f"{RECORDED_PREFIX}{version}:{digest[:6]}"
    return fingerprint[:12]
