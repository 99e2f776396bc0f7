"""What `gradebook rescore` would do, decided from the warehouse alone.

Kept apart from the flows (flows/rescore.py) so that a `rescore` with nothing to do, and
`--dry-run`, answer without loading Prefect (seconds of imports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warehouse.schema import RECORDED_PREFIX, RETRYABLE_REASONS

if TYPE_CHECKING:
    from warehouse.score_batches import RunScore

__all__ = [
    "MAX_FLIPS_SHOWN",
    "RescorePlan",
    "import_verifier_modules",
    "plan_rescore",
    "record_current",
    "unchecked_lines",
]

MAX_FLIPS_SHOWN = 20  # grade flips a command prints; the rest are in the grade_flips view


@dataclass
class RescorePlan:
    """What re-scoring one verifier means.

    Attributes:
        scorer: the verifier name.
        digest: its current fingerprint.
        old_digests: fingerprints it has scored under before.
        run_ids: runs with scores from an older fingerprint and samples not yet scored under
            the current one, and with `retry_unscored` runs with retryable unscored samples
            under the current one (what gets re-scored).
        pending: those samples.
        is_new: the current fingerprint was not registered in the warehouse yet.
        retries: how many of the pending samples are retries of an unscored attempt.
        written: after the pass, what it wrote per (run, verifier).
        flips: after the pass, the samples it graded whose verdict differs from gradebook's
            own under an older fingerprint (the verdicts this pass changed).
        recorded_flips: after the pass, the samples it graded whose verdict differs from the
            score their log recorded (Inspect's, at eval time): reported apart.
        totals: after the pass, where its runs stand under the fingerprint (every sample,
            not only those graded now): scored, unscored, errored, correct, samples.
        left: when a stop (SIGINT, SIGTERM) cut the re-score short, the samples it left
            ungraded (None: it was not stopped, or they were not counted).
        stopped: the signal that stopped it (None: none did).
    """

    scorer: str
    digest: str
    old_digests: list[str]
    run_ids: list[str]
    pending: int
    is_new: bool
    retries: int = 0
    written: list[RunScore] = field(default_factory=list)
    flips: list[dict[str, Any]] = field(default_factory=list)
    recorded_flips: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    left: int | None = None
    stopped: int | None = None

    @property
    def changed(self) -> bool:
        return bool(self.run_ids)

    @property
    def flipped_samples(self) -> int:
        """Samples whose verdict flipped: `flips` has one row per (sample, older fingerprint),
        so a sample graded under two older fingerprints is two rows but one sample."""
        return len({(f["run_id"], f["sample_id"], f["epoch"]) for f in self.flips})

    @property
    def differs_from_recorded(self) -> int:
        """Samples graded now whose verdict differs from the score their log recorded."""
        return len({(f["run_id"], f["sample_id"], f["epoch"]) for f in self.recorded_flips})

    def outcome(self) -> str | None:
        """One line: what this pass wrote, and where its runs stand now (None before it ran)."""
        if not self.totals:
            return None
        wrote = sum(w.written for w in self.written)
        scored = sum(w.scored for w in self.written)
        t = self.totals
        acc = f"{t['correct'] / t['scored']:.1%}" if t["scored"] else "–"
        strict = f"{t['correct'] / t['samples']:.1%}" if t["samples"] else "–"
        runs = len(self.run_ids)
        return (
            f"{self.scorer}: this pass graded {wrote} sample(s) ({scored} scored, "
            f"{wrote - scored} not); its {runs} run{'s' if runs != 1 else ''} now: "
            f"{t['scored']} scored, {t['unscored']} unscored, {t['errored']} errored of "
            f"{t['samples']}, accuracy {acc} (strict {strict})"
        )


def import_verifier_modules(modules: list[str], warehouse: str | Path | None = None) -> None:
    """Load the verifiers the user named (modules, scorer files), and with `warehouse` every
    other verifier it stores a spec of that may be rebuilt here (verifiers.stored)."""
    from verifiers.modules import load_modules
    from verifiers.stored import rebuild

    load_modules(modules)
    if warehouse is not None:
        rebuild(warehouse)


def plan_rescore(
    warehouse: str | Path, scorers: list[str] | None = None, *, retry_unscored: bool = False
) -> list[RescorePlan]:
    """For each verifier (default: every registered one that has scores), what is stale; with
    `retry_unscored` also what is unscored for a retryable reason under its current fingerprint."""
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import all_verifiers, get_verifier
    from warehouse import Warehouse

    wh = Warehouse(warehouse)
    names = scorers if scorers is not None else sorted(all_verifiers())
    plans = []
    with wh.read() as con:
        for name in names:
            fp = fingerprint(get_verifier(name))
            # scores a log held (recorded rows) are history, not a version to re-score:
            # `gradebook score LOG` grades those runs
            rows = con.execute(
                "SELECT fingerprint, list(DISTINCT run_id ORDER BY run_id) FROM scores "
                "WHERE scorer = ? AND fingerprint <> ? AND NOT starts_with(fingerprint, ?) "
                "GROUP BY fingerprint ORDER BY fingerprint",
                [name, fp.digest, RECORDED_PREFIX],
            ).fetchall()
            run_ids = {r for _, runs in rows for r in runs}
            if retry_unscored:
                run_ids.update(
                    r
                    for (r,) in con.execute(
                        "SELECT DISTINCT run_id FROM current_scores WHERE scorer = ? "
                        "AND fingerprint = ? AND status = 'unscored' "
                        "AND list_contains(?::VARCHAR[], reason)",
                        [name, fp.digest, list(RETRYABLE_REASONS)],
                    ).fetchall()
                )
            known = con.execute(
                "SELECT count(*) FROM verifiers WHERE name = ? AND fingerprint = ?",
                [name, fp.digest],
            ).fetchone()[0]
            plans.append(
                RescorePlan(name, fp.digest, [d for d, _ in rows], sorted(run_ids), 0, not known)
            )
    for plan in plans:
        if plan.run_ids:
            todo = wh.samples_to_score(
                plan.scorer,
                plan.digest,
                run_ids=plan.run_ids,
                retry="all" if retry_unscored else None,
            )
            # runs already re-scored keep their old rows but have nothing pending
            plan.run_ids = sorted(set(todo.column("run_id").to_pylist()))
            plan.pending = todo.num_rows
            plan.retries = sum(a > 1 for a in todo.column("attempt").to_pylist())
    return plans


def record_current(warehouse: str | Path, plans: list[RescorePlan]) -> None:
    """Tell the warehouse each verifier's current fingerprint (the views' "newest"), also when
    nothing is left to re-score: a reverted verifier has every sample scored already."""
    from warehouse import Warehouse

    Warehouse(warehouse).record_current({p.scorer: p.digest for p in plans})


def unchecked_lines(db: str | Path, missing: Mapping[str, str], again: Sequence[str]) -> list[str]:
    """What `rescore` prints about the verifiers the warehouse has grades of that it could not
    check, not being loaded here: one line each with what to set or pass, then one saying
    their grades may be stale, then the command that checks them (`again`, this command's
    arguments, with the `--verifier-module` of each whose own command stored it here:
    verifiers.stored.reload_flags). Empty when `missing` is.

    Args:
        db: the warehouse.
        missing: verifier name -> what loads it (verifiers.stored.unloaded).
        again: the arguments of the command that was run (`rescore --db DB ...`).
    """
    from verifiers.stored import reload_flags
    from warehouse.commands import command

    if not missing:
        return []
    lines = [
        f"  not checked: verifier {n!r} is not loaded here: {fix}" for n, fix in missing.items()
    ]
    flags = reload_flags(db, missing)
    them = "it" if len(missing) == 1 else "them"
    head = (
        f"{len(missing)} verifier{'s' if len(missing) != 1 else ''} not checked "
        f"({', '.join(missing)}): {'its' if len(missing) == 1 else 'their'} grades may be stale. "
    )
    config = f"or give the sweep config that names {them} (`rescore --config SWEEP.toml`)"
    if not flags:
        lines.append(f"{head}Do what each line above says, {config}, and run this again.")
        return lines
    others = [n for n in missing if n not in flags]
    which = f"{', '.join(flags)} (and {', '.join(others)} as its line says)" if others else them
    lines.append(f"{head}Check {which} with the code as it is now, {config}:")
    extra = [a for value in flags.values() for a in ("--verifier-module", value)]
    lines.append("  " + command(*again, *extra))
    return lines
