"""Telling from the warehouse alone that `gradebook score` has nothing to do.

Re-running `score` on logs that are in the warehouse, unchanged, and graded under every
verifier's current fingerprint writes nothing; finding that out through the flow costs a Prefect
flow run, Inspect's imports and reading the logs (seconds). Here it costs a stat per log and a
few queries on a read-only connection, with neither Prefect nor Inspect loaded. When anything is
uncertain (a log not recorded with the same stat, a verifier this process does not know, samples
left to grade) the answer is "there is work", and the command runs its flow as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["nothing_to_score"]


def nothing_to_score(
    logs: Sequence[Path],
    db: Path,
    verifiers: Sequence[str] | None,
    *,
    retry_unscored: bool = False,
) -> str | None:
    """One line saying what was found when scoring `logs` would write nothing, else None.

    Args:
        logs: the logs `gradebook score` was given.
        db: the warehouse.
        verifiers: the names given with --verifier (default: those each log records).
        retry_unscored: --retry-unscored: samples left unscored for a retryable reason count as
            work.
    """
    from scorers.identity.fingerprint import fingerprint
    from scorers.inspect_scorers.specs import SpecError
    from scorers.registry import all_verifiers
    from verifiers.specs import names_for_entries
    from warehouse import Warehouse
    from warehouse.log_stamps import LogStamp, proves_unchanged, stamp
    from workspaces.image_regrade import rebuilt_image_samples

    if not db.exists() or not logs:
        return None
    if verifiers:
        # as given: a registered name, or an Inspect scorer spec (`file.py@scorer`), which
        # the command resolved already: its registered name is what the rows are under
        try:
            verifiers = names_for_entries(verifiers, trusted=True)
        except SpecError:
            return None
    wh = Warehouse(db)
    plan: dict[str, list[str]] = {}  # verifier -> runs
    with wh.read() as con:
        for log in logs:
            now = stamp(str(log))
            if now is None:
                return None
            row = con.execute(
                "SELECT run_id, log_path, eval_spec, log_sha256, log_size, log_mtime_ns, "
                "log_inode, epoch_us(log_seen_at) FROM wh.runs WHERE ingest_state = 'complete' "
                "AND log_size = ? AND log_mtime_ns = ? AND log_inode = ?",
                [now.size, now.mtime_ns, now.inode],
            ).fetchone()
            if row is None or not _same_path(row[1], log):
                return None
            if not proves_unchanged(LogStamp.from_row(*row[4:]), now) and _sha256(log) != row[3]:
                # the stat alone cannot vouch for the content (written within the racy
                # window of its ingest, as a sweep's logs are), so the bytes must match
                return None
            names = list(verifiers or _recorded_verifiers(row[2]))
            if not names:
                return None  # the flow says what to do about a log that names none
            for name in names:
                plan.setdefault(name, []).append(row[0])
    known = all_verifiers()
    found = []
    for name, run_ids in plan.items():
        if name not in known:
            return None
        digest = fingerprint(known[name]).digest
        todo = wh.samples_to_score(
            name,
            digest,
            run_ids=run_ids,
            retry="all" if retry_unscored else None,
            regrade=rebuilt_image_samples(wh, known[name], digest, run_ids),
        )
        if todo.num_rows:
            return None
        with wh.read() as con:
            graded, unscored = con.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'unscored') FROM current_scores "
                "WHERE scorer = ? AND fingerprint = ? AND run_id IN (SELECT unnest(?::VARCHAR[]))",
                [name, digest, run_ids],
            ).fetchone()
        part = f"{graded:,} samples already scored by {name}@{digest[:8]}"
        if unscored:
            part += f" ({unscored:,} unscored: --retry-unscored grades those again)"
        found.append(part)
    return "nothing to score: " + "; ".join(found)


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _same_path(recorded: str | None, log: Path) -> bool:
    if recorded is None:
        return False
    if recorded == str(log):
        return True
    try:
        return Path(recorded).resolve() == log.resolve()
    except OSError:
        return False


def _recorded_verifiers(eval_spec: str | None) -> list[str]:
    """The verifiers gradebook's generate stage recorded in the log (its eval metadata)."""
    try:
        names = (json.loads(eval_spec or "{}").get("metadata") or {}).get("verifiers") or []
    except (ValueError, AttributeError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []
