"""Release gates: decide from the warehouse, record the verdicts, render them as markdown.

`evaluate_gates` is the plain function; `gradebook gate` calls it, with no Prefect server (and
without importing Prefect, which costs seconds). The same as a Prefect task (the last step of a
sweep, which also publishes the verdicts as a markdown artifact) and a flow for deployments are
in flows/gate_stage.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gates.records import gate_run, newest_runs, sweep_names
from gates.rules import EXIT_CANNOT_EVALUATE, EXIT_FAIL, EXIT_PASS, GateResult, GateRules
from warehouse import Warehouse
from warehouse.error_text import did_you_mean

__all__ = [
    "current_fingerprints",
    "evaluate_gates",
    "gate_markdown",
    "overall_exit_code",
]


def current_fingerprints(scorers: Sequence[str] | None = None) -> dict[str, str]:
    """Scorer name -> fingerprint digest of the verifier code as it is now.

    Args:
        scorers: limit to these names; default every registered verifier.
    """
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import all_verifiers, get_verifier

    names = list(scorers) if scorers is not None else sorted(all_verifiers())
    return {name: fingerprint(get_verifier(name)).digest for name in names}


def _warehouse(db: str | Path | Warehouse) -> Warehouse:
    return db if isinstance(db, Warehouse) else Warehouse(db)


def evaluate_gates(
    db: str | Path | Warehouse,
    run_ids: Sequence[str] | None = None,
    *,
    rules: GateRules | None = None,
    sweep: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
    record: bool = True,
) -> list[GateResult]:
    """Gate the given runs, or the newest run of each task x model (of `sweep`, if given).

    Args:
        db: the warehouse (a path or a `Warehouse`).
        run_ids: runs to gate; None selects the newest run per task x model.
        rules: thresholds; default `GateRules()`.
        sweep: restrict the newest-run selection to this sweep, and record it with each row.
        fingerprints: scorer -> current fingerprint; default computed from the registry (then
            a run scored by a verifier that is not loaded here cannot be evaluated, and the
            problem names the `--verifier-module` to pass).
        record: False for a dry run that writes nothing.

    Returns:
        One result per run; an empty run selection gives one cannot-evaluate result.
    """
    wh = _warehouse(db)
    rules = rules or GateRules()
    unloaded: dict[str, str] = {}
    if fingerprints is None:
        # every loaded verifier; one that scored a run but is not loaded here is a problem
        # that names the flag, not a scorer silently left out of the decision
        from verifiers.stored import unloaded

        unloaded = unloaded(wh.path)
    fps = dict(fingerprints) if fingerprints is not None else current_fingerprints()
    if record:
        # the views' "newest" is the fingerprint the gate decides under
        wh.record_current(fps)
    if run_ids is None:
        with wh.read() as con:
            run_ids = newest_runs(con, sweep=sweep)
            hint = did_you_mean(sweep, sweep_names(con)) if sweep and not run_ids else ""
        if not run_ids:
            from datetime import UTC, datetime

            what = f"sweep {sweep!r}{hint}" if sweep else "the warehouse"
            return [
                GateResult(
                    gate_id="none",
                    created=datetime.now(UTC),
                    run_id="",
                    verdict="cannot_evaluate",
                    rules=rules,
                    sweep=sweep,
                    problems=[f"{what} has no runs: run the sweep or ingest its logs first"],
                )
            ]
    return [
        gate_run(wh, rid, rules, fps, sweep=sweep, record=record, unloaded=unloaded)
        for rid in run_ids
    ]


def overall_exit_code(results: Sequence[GateResult]) -> int:
    """0 if every run passed; 1 if any failed; otherwise 2 (something could not be evaluated)."""
    codes = {r.exit_code for r in results}
    if not codes:
        return EXIT_CANNOT_EVALUATE
    if EXIT_FAIL in codes:
        return EXIT_FAIL
    if EXIT_CANNOT_EVALUATE in codes:
        return EXIT_CANNOT_EVALUATE
    return EXIT_PASS


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def _cell(text: str) -> str:
    # Task names and details can hold any text: keep the markdown table intact.
    return text.replace("|", "\\|").replace("\n", " ")


_BADGE = {"pass": "✅ PASS", "fail": "❌ FAIL", "cannot_evaluate": "⚠️ CANNOT EVALUATE"}


def gate_markdown(results: Sequence[GateResult]) -> str:
    """The verdicts as markdown: one section per run, one table row per rule."""
    code = overall_exit_code(results)
    overall = {0: "pass", 1: "fail", 2: "cannot_evaluate"}[code]
    lines = [f"# Release gate: {_BADGE[overall]} (exit {code})", ""]
    for r in results:
        title = f"{r.task} · {r.model}" if r.task else (r.run_id or "no run")
        lines += [f"## {_cell(title)}: {_BADGE[r.verdict]}", ""]
        if r.run_id:
            lines.append(
                f"run `{r.run_id}`"
                + (f", baseline `{r.baseline_run_id}`" if r.baseline_run_id else "")
            )
        for scorer, m in r.metrics.items():
            lines.append(
                f"- **{_cell(scorer)}** @ `{m['fingerprint'][:12]}`: accuracy_strict "
                f"{_num(m['accuracy_strict'])}, accuracy over scored {_num(m['accuracy'])}; "
                f"{m['n_scored']} scored / {m['n_unscored'] + m['n_missing']} unscored / "
                f"{m['n_error']} errored of {m['n_samples']}"
            )
        for p in r.problems:
            lines.append(f"- ⚠️ {_cell(p)}")
        if r.results:
            lines += ["", "| rule | value | threshold | result | detail |", "|---|---|---|---|---|"]
            for rr in r.results:
                result = {True: "pass", False: "**FAIL**", None: "n/a"}[rr.passed]
                lines.append(
                    f"| {_cell(rr.label)} | {_num(rr.value)} | {rr.op} {_num(rr.threshold)} "
                    f"| {result} | {_cell(rr.detail)} |"
                )
        lines.append("")
    return "\n".join(lines)
