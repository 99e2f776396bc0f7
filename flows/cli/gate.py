"""`gradebook gate` and `gradebook report`.

Exit codes of `gate`: 0 every gated run passed; 1 a rule failed; 2 the gate cannot be evaluated
(unknown run, no scores under the current verifier fingerprint: the message names the command
to run) or the input is bad (missing warehouse, bad config, bad threshold).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from flows.runtime.console import console, shown
from gates.rules import GateResult, GateRules
from verifiers.modules import ModulesOption
from warehouse import DEFAULT_DB, Warehouse, WarehouseError

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar="GRADEBOOK_DB", help="DuckDB warehouse file (env GRADEBOOK_DB)."),
]
_OUT = console
_STYLE = {"pass": "bold green", "fail": "bold red", "cannot_evaluate": "bold yellow"}


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _load_modules(modules: list[str] | None, db: Path | None = None) -> None:
    from verifiers.modules import VerifierLoadError, load_modules

    try:
        load_modules(modules)
    except VerifierLoadError as exc:
        raise _fail(str(exc)) from None
    if db is not None:
        rebuild_stored(db)


def rebuild_stored(db: Path) -> None:
    """Rebuild every verifier the warehouse stores a spec of (verifiers.stored); say on
    stderr where a flag given here overrides a stored spec (stdout may be --json)."""
    from verifiers.stored import rebuild

    for note in rebuild(db).overridden.values():
        typer.echo(f"note: {note}", err=True)


def _rules(
    config: Path | None, overrides: dict[str, object], baseline: str | None
) -> tuple[GateRules, str | None, Path | None]:
    """Rules from the defaults, then the sweep config's [gates], then the flags."""
    base: dict[str, object] = {}
    sweep_name, db = None, None
    if config is not None:
        from sweeps.config import ConfigError, load_config

        try:
            cfg = load_config(config)
        except ConfigError as exc:
            raise _fail(str(exc)) from None
        base = cfg.gates.model_dump(exclude_unset=True)
        sweep_name, db = cfg.name, cfg.warehouse
    base.update({k: v for k, v in overrides.items() if v is not None})
    if baseline is not None:
        base["baseline"] = baseline
    try:
        return GateRules(**base), sweep_name, db
    except ValidationError as exc:
        first = exc.errors()[0]
        # the rule as the user wrote it (pydantic's loc adds its validator names, such as
        # "constrained-float", past the field)
        field = str(first["loc"][0]) if first["loc"] else "rules"
        given = overrides.get(field)
        shown_value = f"{given:g}" if isinstance(given, float) else given
        flag = f"--{field.replace('_', '-')}"
        where = f"{flag} {shown_value}" if given is not None else f"[gates] {field}"
        msg = str(first["msg"]).removeprefix("Value error, ")
        value = first.get("input")
        if isinstance(value, int | float) and 1 < value <= 100 and field != "alpha":
            msg += f" (a fraction: {value / 100:g} for {value:g}%)"
        raise _fail(f"gate rule {where}: {msg}") from None


def _print(result: GateResult) -> None:
    title = f"{result.task} · {result.model}" if result.task else result.run_id or "no run"
    _OUT.print(
        f"[{_STYLE[result.verdict]}]{result.verdict.upper().replace('_', ' ')}[/] {shown(title)}"
        + (f"  run {result.run_id}" if result.task else "")
        + (f"  baseline {result.baseline_run_id}" if result.baseline_run_id else "")
    )
    for scorer, m in result.metrics.items():

        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        _OUT.print(
            f"  {shown(scorer)} @ {m['fingerprint'][:12]}: accuracy_strict {fmt(m['accuracy_strict'])}"
            f"  accuracy over scored {fmt(m['accuracy'])}  ({m['n_scored']} scored, "
            f"{m['n_unscored'] + m['n_missing']} unscored, {m['n_error']} errored, "
            f"{m['n_samples']} samples)"
        )
    if result.results:
        table = Table(show_edge=False, pad_edge=False)
        for col in ("rule", "value", "threshold", "result", "detail"):
            table.add_column(col, overflow="fold")
        for r in result.results:
            verdict = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[yellow]n/a[/]"}
            table.add_row(
                shown(r.label),
                "n/a" if r.value is None else f"{r.value:.4g}",
                f"{r.op} {r.threshold:.4g}" if r.threshold is not None else "",
                verdict[r.passed],
                shown(r.detail),
            )
        _OUT.print(table)
    for problem in result.problems:
        _OUT.print(f"  [yellow]cannot evaluate:[/] {shown(problem)}", soft_wrap=True)


def gate(
    run: Annotated[
        list[str] | None, typer.Option("--run", help="Run id (or unique prefix); repeatable.")
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="Gate the newest run of each model x task of this sweep."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Sweep TOML: its \\[gates] section gives the rules."),
    ] = None,
    db: DbOption = Path(DEFAULT_DB),
    max_unscored_rate: Annotated[float | None, typer.Option(help="Max unscored / samples.")] = None,
    max_error_rate: Annotated[float | None, typer.Option(help="Max errored / samples.")] = None,
    min_coverage: Annotated[
        float | None, typer.Option(help="Min samples present / (dataset cut by limit x epochs).")
    ] = None,
    min_accuracy: Annotated[
        float | None, typer.Option(help="Min value of --metric, for every task.")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(help="accuracy_strict (default), accuracy, or pass@K."),
    ] = None,
    max_regression: Annotated[
        float | None, typer.Option(help="Largest tolerated significant drop vs the baseline.")
    ] = None,
    alpha: Annotated[float | None, typer.Option(help="Significance of the McNemar test.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option(help="Baseline run id (default: the last passing run of task x model)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Evaluate without writing a gates row.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    verifier_module: ModulesOption = None,
) -> None:
    """Decide a release: exit 0 pass, 1 fail, 2 cannot evaluate (the message says what to run)."""
    if run and sweep:
        raise _fail("give --run or --sweep, not both")
    _load_modules(verifier_module)
    overrides = {
        "max_unscored_rate": max_unscored_rate,
        "max_error_rate": max_error_rate,
        "min_coverage": min_coverage,
        "min_accuracy": min_accuracy,
        "metric": metric,
        "max_regression": max_regression,
        "alpha": alpha,
    }
    rules, config_sweep, config_db = _rules(config, overrides, baseline)
    if config_db is not None and db == Path(DEFAULT_DB):
        db = config_db
    if not run and sweep is None:
        sweep = config_sweep
    if not run and sweep is None:
        raise _fail("say what to gate: --run RUN_ID, --sweep NAME, or --config SWEEP.toml")
    try:
        Warehouse(db).check()  # a bad --db is one line now, not after the imports below
    except WarehouseError as exc:
        raise _fail(str(exc)) from None
    rebuild_stored(db)  # every verifier it stores a spec of, where the trust rule allows
    # Imported here: the gate stage pulls in Prefect (seconds) that `--help` never needs.
    from gates.evaluate import evaluate_gates, overall_exit_code

    try:
        results = evaluate_gates(db, run or None, rules=rules, sweep=sweep, record=not dry_run)
    except WarehouseError as exc:
        raise _fail(str(exc)) from None
    code = overall_exit_code(results)
    if as_json:
        payload = [json.loads(r.model_dump_json()) | {"exit_code": r.exit_code} for r in results]
        typer.echo(json.dumps({"exit_code": code, "runs": payload}, indent=2))
    else:
        for r in results:
            _print(r)
        word = {0: "PASS", 1: "FAIL", 2: "CANNOT EVALUATE"}[code]
        _OUT.print(f"gate: {word} (exit {code})")
        _print_heal(db, results)
    raise typer.Exit(code)


def _print_heal(db: Path, results: list[GateResult]) -> None:
    """Samples the gated runs hold unscored for a retryable reason: the command that grades
    them again, then this very gate (warehouse.heal)."""
    import sys

    from flows.cli.pipeline import print_heal
    from warehouse.heal import retryable_unscored

    left = [
        u
        for r in results
        for u in retryable_unscored(
            db, {s: m["fingerprint"] for s, m in r.metrics.items()}, [r.run_id]
        )
    ]
    again = sys.argv[1:]  # this command as it was typed
    if again[:1] != ["gate"]:  # called in-process (a test's CliRunner)
        again = ["gate", "--db", str(db), *(a for r in results for a in ("--run", r.run_id))]
    print_heal(db, left, again)


def report(
    out: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path("report.html"),
    db: DbOption = Path(DEFAULT_DB),
    verifier_module: ModulesOption = None,
) -> None:
    """Write one self-contained HTML report: history, gate verdicts, coverage, grade flips."""
    from flows.cli.report.summary import write_report
    from gates.evaluate import current_fingerprints
    from warehouse import Warehouse

    _load_modules(verifier_module, db)
    try:
        # "newest" in the report is the current code's fingerprint, as for the gate (best
        # effort: a report never waits for a writer)
        Warehouse(db).record_current(current_fingerprints(), wait=False)
        path = write_report(db, out)
    except WarehouseError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(
            f"{out}: cannot write the report ({exc.strerror}); choose another --out"
        ) from None
    _OUT.print(f"report written: {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")


def register(app: typer.Typer) -> None:
    """Add `gate` and `report` to the gradebook CLI."""
    app.command("gate")(gate)
    app.command("report")(report)
