"""The scores a log already holds, kept as history: recorded rows.

Why: a team that points gradebook at months of old logs must get their score history, not an
empty `scores` table. Ingest stores every score a sample carries as a `scores` row attributed to
its origin: the scorer's name (the sample's score key, as Inspect wrote it), a fingerprint that
says "recorded in the log by Inspect <version> with these options" (RECORDED_PREFIX; one per
scorer name, options and Inspect version) and `scored_at` from the log. Values are read as a
score gradebook computes is (warehouse.score_values), so `grade_flips` between a recorded row
and gradebook's own re-score of the sample shows where today's scorer disagrees with what was
recorded then.

A recorded row is never overwritten: its fingerprint is never a verifier's current one, so no
re-score or retry writes under it, and history is append-only. Re-scoring does not pick up
runs that only have recorded rows (`gradebook rescore` and the watcher re-score what gradebook
scored before); `gradebook score LOG` scores them with the task's own scorers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from scorers.inspect_scorers.names import RESERVED_NAMES, stored_name, variant_name
from warehouse.sample_rows import canonical_json, repaired, timestamp
from warehouse.schema import RECORDED_PREFIX, SCORE_SCHEMA
from warehouse.score_values import metadata_json, score_fields

__all__ = [
    "RECORDED_PREFIX",
    "RESERVED_NAMES",
    "RecordedScorer",
    "recorded_scorers",
    "recorded_table",
    "inspect_names",
    "stored_name",
    "variant_name",
]


@dataclass(frozen=True)
class RecordedScorer:
    """One scorer whose scores a log holds: the name its rows are stored under, and the
    recorded fingerprint (with what a `verifiers` row says about it)."""

    name: str
    fingerprint: str
    label: str
    source: str
    options: dict[str, Any]
    spec: dict[str, Any]
    first_seen: datetime


def _options_by_name(header: Any) -> dict[str, dict[str, Any]]:
    """The scorer options a log header records, by the key its samples' scores have."""
    found: dict[str, dict[str, Any]] = {}
    spec = header.eval
    for scorer in spec.scorers or []:
        base = scorer.name.rsplit("/", 1)[-1]
        key, n = base, 1
        while (
            key in found
        ):  # Inspect names a second scorer of one name "name1" (unique_scorer_name)
            key, n = f"{base}{n}", n + 1
        found[key] = {"scorer": scorer.name, "options": dict(scorer.options or {})}
    if header.results is not None:
        for score in header.results.scores:
            found.setdefault(
                score.name, {"scorer": score.scorer, "options": dict(score.params or {})}
            )
    return found


def inspect_names(header: Any) -> dict[str, str]:
    """The name gradebook stores each of a log's own scorers under -> the key Inspect gives its
    scores in the log (`match[numeric=true]` -> `match`): what a scored copy names them by."""
    out: dict[str, str] = {}
    for key, info in _options_by_name(header).items():
        options = info["options"]
        out.setdefault(_stored_as(key, info["scorer"], options), key)
    return out


def _stored_as(key: str, scorer: str, options: dict[str, Any]) -> str:
    short = scorer.rsplit("/", 1)[-1]
    return variant_name(stored_name(short if options else key, scorer), options)


def recorded_scorers(header: Any, keys: Iterable[str]) -> dict[str, RecordedScorer]:
    """Score key -> its RecordedScorer, for the keys the samples of a log hold."""
    version = (header.eval.packages or {}).get("inspect_ai") or "unknown"
    created = timestamp(header.eval.created) or datetime.now(UTC)
    known = _options_by_name(header)
    out: dict[str, RecordedScorer] = {}
    for key in dict.fromkeys(keys):
        info = known.get(key, {"scorer": key, "options": {}})
        options = info["options"]
        options_json = canonical_json(options)
        digest = hashlib.sha256(
            canonical_json({"scorer": info["scorer"], "options": options}).encode()
        ).hexdigest()[:12]
        # a variant with params: its own name, as gradebook's re-score of it is stored
        name = _stored_as(key, info["scorer"], options)
        out[key] = RecordedScorer(
            name=name,
            fingerprint=f"{RECORDED_PREFIX}inspect_ai-{version}:{digest}",
            label=f"recorded in the log by Inspect {version}",
            source=(
                f"# recorded scores: {info['scorer']} with options {options_json}, as Inspect "
                f"{version} wrote them in the log (not computed by gradebook)"
            ),
            options=options,
            spec={
                "kind": "recorded",
                "scorer": info["scorer"],
                "options": options,
                "inspect_version": version,
            },
            first_seen=created,
        )
    return out


def recorded_table(
    run_id: str,
    recorded: list[tuple[str, int, str, Any, datetime | None]],
    scorers: dict[str, RecordedScorer],
    fallback_time: datetime,
) -> pa.Table:
    """Score rows (SCORE_SCHEMA, attempt 1) of the scores samples hold.

    Args:
        run_id: the run.
        recorded: (sample_id, epoch, score key, Score or its dict, completed_at) per score.
        scorers: `recorded_scorers` of the log, for every key in `recorded`.
        fallback_time: `scored_at` of a sample with no completion time (the log's).
    """
    cols: dict[str, list[Any]] = {f.name: [] for f in SCORE_SCHEMA}
    for sample_id, epoch, key, score, completed in recorded:
        scorer = scorers[key]
        # the score's own row; a dict value's key rows are added where every write adds
        # them (Warehouse.write_scores: warehouse.score_values.dict_key_rows)
        for row in score_fields(score)[:1]:
            name = scorer.name
            for column, value in (
                ("run_id", run_id),
                ("sample_id", sample_id),
                ("epoch", epoch),
                ("scorer", name),
                ("fingerprint", scorer.fingerprint),
                ("status", row.status),
                ("value", row.value),
                ("answer", row.answer),
                ("explanation", row.explanation),
                ("reason", row.reason),
                ("metadata", metadata_json(row.metadata)),
                ("scored_at", completed or fallback_time),
                ("duration_s", None),
                ("attempt", 1),
                ("image_id", None),
            ):
                cols[column].append(value)
    try:
        return pa.table(cols, schema=SCORE_SCHEMA)
    except UnicodeEncodeError:  # a lone surrogate in model text: stored as U+FFFD
        return pa.table(repaired(cols), schema=SCORE_SCHEMA)


def register_recorded(con: Any, scorers: Iterable[RecordedScorer]) -> None:
    """Add a `verifiers` row for each recorded fingerprint not registered yet (in the caller's
    transaction); first_seen is the log's creation time, so a re-score by gradebook is the
    newer fingerprint in `grade_flips`."""
    for s in scorers:
        con.execute(
            "INSERT INTO wh.verifiers (name, fingerprint, label, source, params, first_seen, "
            "module, spec) SELECT ?, ?, ?, ?, ?, ?, NULL, ? WHERE NOT EXISTS ("
            "SELECT 1 FROM wh.verifiers WHERE name = ? AND fingerprint = ?)",
            [
                s.name,
                s.fingerprint,
                s.label,
                s.source,
                canonical_json(s.options),
                s.first_seen,
                canonical_json(s.spec),
                s.name,
                s.fingerprint,
            ],
        )
