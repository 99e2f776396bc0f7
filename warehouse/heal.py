"""The one command that heals samples a grader outage left unscored, as commands print it.

A sample is unscored for a retryable reason when grading did not happen (the judge did not
answer, the sandbox was down, the verifier timed out or its worker died:
`warehouse.schema.RETRYABLE_REASONS`). Every command that leaves such samples (`sweep`,
`score`, `rescore`, `gate`) ends by saying how many, why, and the command that grades exactly
those again once the cause is fixed: `gradebook rescore --retry-unscored --scorer NAME`, which
rebuilds each verifier from the spec the warehouse stores (verifiers.stored) and grades
from the saved transcripts, with no call to the model under test; then the gate to run again.
Both lines run as printed (warehouse.commands).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.commands import command
from warehouse.schema import RETRYABLE_REASONS

# more workspace store directories (workspaces.restore.STORES_ENV, a floor above: named here)
WORKSPACE_STORES_ENV = "GRADEBOOK_WORKSPACE_STORES"

__all__ = ["Unscored", "heal_lines", "retryable_unscored", "unscored_in_rows"]

# why each retryable reason happens, and when grading again will work: what to do, never the
# reason's name again (tests/test_heal_lines.py holds every retryable reason to that)
_CAUSE = {
    "grader_failed": ("the judge did not answer", "once it answers"),
    "sandbox_unavailable": (
        "the Docker sandbox was not available",
        "once it is up (`make services`: Docker Engine + the sandbox image)",
    ),
    "timeout": (
        "the verifier ran past its time limit",
        "once it is faster, or given a longer time limit",
    ),
    "verifier_error": (
        "the verifier or its worker process failed (the traceback: the score row's "
        "metadata->>'traceback')",
        "once it is fixed",
    ),
    # the restore names the stores it looked in, in each sample's explanation
    "workspace_missing": (
        "the sandbox workspace archives their logs name are in no workspace store looked in "
        "(each sample's explanation lists those)",
        f"once a store this host can reach holds them (mount a directory where the logs say, "
        f"or name another directory or s3:// prefix in {WORKSPACE_STORES_ENV}; a store in a "
        "bucket needs this host's AWS credentials and AWS_ENDPOINT_URL; if no store has them "
        "any more, re-run their generation)",
    ),
}


@dataclass(frozen=True)
class Unscored:
    """Samples of one run whose latest attempt under a scorer's current fingerprint is
    unscored for a retryable reason."""

    run_id: str
    scorer: str
    reason: str
    samples: int


def retryable_unscored(
    db: str | Path, fingerprints: Mapping[str, str], run_ids: Iterable[str] | None = None
) -> list[Unscored]:
    """The retryable unscored samples under each scorer's current fingerprint (`fingerprints`:
    scorer -> digest), per run and reason; in `run_ids` only, when given.

    Empty when the warehouse cannot be read (the command reported that already)."""
    import duckdb

    from warehouse import Warehouse, WarehouseError

    runs = None if run_ids is None else sorted(set(run_ids))
    if not fingerprints or runs == [] or not Path(db).exists():
        return []
    try:
        with Warehouse(db).read() as con:
            rows = con.execute(
                "SELECT c.run_id, c.scorer, c.reason, count(*) FROM current_scores c "
                "JOIN (SELECT unnest($scorers::VARCHAR[]) AS scorer, "
                "      unnest($digests::VARCHAR[]) AS fingerprint) k USING (scorer, fingerprint) "
                "WHERE c.status = 'unscored' AND list_contains($reasons::VARCHAR[], c.reason) "
                "AND ($runs IS NULL OR list_contains($runs::VARCHAR[], c.run_id)) "
                "GROUP BY ALL ORDER BY ALL",
                {
                    "scorers": list(fingerprints),
                    "digests": list(fingerprints.values()),
                    "reasons": list(RETRYABLE_REASONS),
                    "runs": runs,
                },
            ).fetchall()
    except (WarehouseError, duckdb.Error):
        return []
    return [Unscored(r, s, why, int(n)) for r, s, why, n in rows]


def unscored_in_rows(rows: Iterable[Any]) -> list[Unscored]:
    """The retryable unscored samples a sweep's summary rows count (`SummaryRow`)."""
    return [
        Unscored(r.run_id, r.scorer, why, n)
        for r in rows
        if r.run_id and r.scorer
        for why, n in sorted((r.unscored_reasons or {}).items())
        if why in RETRYABLE_REASONS and n
    ]


def heal_lines(
    db: str | Path, unscored: Sequence[Unscored], gate: Sequence[str] | None = None
) -> list[str]:
    """What to print: one line with the counts and the causes, then the command that grades
    exactly those samples again, then (given `gate`, its arguments) the gate to run again.
    Empty when nothing is left unscored for a retryable reason."""
    if not unscored:
        return []
    total = sum(u.samples for u in unscored)
    by_reason: dict[str, int] = {}
    for u in unscored:
        by_reason[u.reason] = by_reason.get(u.reason, 0) + u.samples
    counts = ", ".join(f"{why} {n}" for why, n in sorted(by_reason.items()))
    if len(by_reason) == 1:
        cause, when = _cause(next(iter(by_reason)))
        causes, when = cause, when or "once that is fixed"
    else:  # each cause with when grading again will work
        causes = "; ".join(" — ".join(filter(None, _cause(why))) for why in sorted(by_reason))
        when = "once that is done"
    scorers = sorted({u.scorer for u in unscored})
    heal = ["rescore", "--db", str(db), "--retry-unscored"]
    for name in scorers:
        heal += ["--scorer", name]
    lines = [
        f"{total} sample{'s' if total != 1 else ''} unscored ({counts}): {causes}. "
        f"{when[0].upper()}{when[1:]}, grade exactly those again from the saved transcripts "
        "(no model calls)" + (", then gate again:" if gate else ":"),
        "  " + command(*heal),
    ]
    if gate:
        lines.append("  " + command(*gate))
    return lines


def _cause(reason: str) -> tuple[str, str]:
    """(why samples are unscored for `reason`, when grading them again will work)."""
    return _CAUSE.get(reason, (f"reason {reason} (each sample's explanation says more)", ""))
