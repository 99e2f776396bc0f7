"""The samples a scoring stage grades, as the warehouse hands them over, and the score rows it
writes back.

`Samples` holds the `samples_to_score` columns as Arrow (no Python dict per row: building them
would delay every worker's first chunk); `scores_table` turns graded results into SCORE_SCHEMA
rows; `RunScore` counts what a stage wrote per (run, verifier).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from scorers.workers.pool import ResultRow, SampleRow

__all__ = ["RunScore", "Samples", "scores_table"]


@dataclass
class RunScore:
    """What the stage wrote for one (run, scorer)."""

    run_id: str
    scorer: str
    fingerprint: str
    written: int = 0
    scored: int = 0
    correct: int = 0
    unscored: int = 0
    error: int = 0
    retried: int = 0  # rows written as a retry (attempt > 1) of an unscored sample
    reasons: dict[str, int] = field(default_factory=dict)
    # samples not written: the verifier's code kept changing while they were graded
    # (CODE_PASSES passes); the next stage grades them under the fingerprint current then
    stale: int = 0

    def add(self, row: dict[str, Any]) -> None:
        """Count one written row (a dict with status, value, reason and attempt)."""
        self.count(row["status"], row["value"], row["reason"], row.get("attempt"))

    def count(self, status: str, value: float | None, reason: str, attempt: int | None) -> None:
        """Count one written row."""
        self.written += 1
        self.retried += (attempt or 1) > 1
        if status == "scored":
            self.scored += 1
            self.correct += value == 1.0
        elif status == "unscored":
            self.unscored += 1
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        else:
            self.error += 1


_KEY_COLUMNS = ["run_id", "sample_id", "epoch", "attempt"]


def scores_table(keys: pa.Table, results: list[ResultRow], scorer: str, digest: str) -> pa.Table:
    """Score rows (SCORE_SCHEMA) from sample keys and their results, in the same order.

    Args:
        keys: run_id, sample_id, epoch and attempt columns (`Samples.keys`), one row per
            result; a null attempt is written as 1 (`samples_to_score` gives the attempt a
            grading must be written as).
        results: what the verifier gave, per key.
        scorer: the verifier's name.
        digest: its fingerprint.
    """
    from warehouse import SCORE_SCHEMA

    n = keys.num_rows
    cols = list(zip(*results, strict=True)) if results else [()] * 7

    def same(value: Any, name: str) -> pa.Array:
        # one scalar repeated: Arrow converts a list of tz-aware datetimes one by one, slowly
        return pa.repeat(pa.scalar(value, SCORE_SCHEMA.field(name).type), n)

    return pa.Table.from_pydict(
        {
            "run_id": keys.column("run_id"),
            "sample_id": keys.column("sample_id"),
            "epoch": keys.column("epoch").cast(pa.int32()),
            "scorer": same(scorer, "scorer"),
            "fingerprint": same(digest, "fingerprint"),
            "status": list(cols[0]),
            "value": list(cols[1]),
            "answer": list(cols[2]),
            "explanation": list(cols[3]),
            "reason": list(cols[4]),
            "metadata": list(cols[5]),
            "scored_at": same(datetime.now(UTC), "scored_at"),
            "duration_s": list(cols[6]),
            "attempt": pc.fill_null(keys.column("attempt").cast(pa.int32()), 1),
            "image_id": pa.nulls(n, pa.string()),  # read from metadata (conform_scores)
        },
        schema=SCORE_SCHEMA,
    )


class Samples:
    """Samples to grade: the `samples_to_score` columns, without a Python dict per row
    (building them would delay every worker's first chunk).

    The rows a verifier reads are built per chunk (`rows_at`), as the chunk goes to a worker:
    built all at once, up front, they held back the first chunk of a 200,000-sample stage by
    about half a second of one core while the workers waited.
    """

    def __init__(self, table: pa.Table) -> None:
        from warehouse import SAMPLES_TO_SCORE_SCHEMA

        for name in ("attempt", "state"):
            if name not in table.column_names:
                kind = SAMPLES_TO_SCORE_SCHEMA.field(name).type
                table = table.append_column(name, pa.nulls(table.num_rows, kind))
        self.table = table.select(SAMPLES_TO_SCORE_SCHEMA.names).cast(SAMPLES_TO_SCORE_SCHEMA)
        # what a verifier may read of each sample (SampleRow), as whole columns
        self._columns = self.table.select(list(_SAMPLE_COLUMNS)).combine_chunks()
        self.errors: list[str | None] = self.table.column("error").to_pylist()

    @classmethod
    def from_dicts(cls, rows: list[dict[str, Any]]) -> Samples:
        """From dicts with the samples_to_score columns (attempt may be missing)."""
        from warehouse import SAMPLES_TO_SCORE_SCHEMA

        return cls(pa.Table.from_pylist(rows, schema=SAMPLES_TO_SCORE_SCHEMA))

    def __len__(self) -> int:
        return self.table.num_rows

    def run_id(self, index: int) -> str:
        return self.table.column("run_id")[index].as_py()

    def rows_at(self, indices: Sequence[int]) -> list[SampleRow]:
        """What a verifier may read (SampleRow) of these samples, in order."""
        part = self._columns.take(_positions(indices))
        return list(zip(*(part.column(c).to_pylist() for c in _SAMPLE_COLUMNS), strict=True))

    def subset(self, indices: list[int]) -> Samples:
        """These samples (indices into this one), in order."""
        return Samples(self.table.take(_positions(indices)))

    def keys(self, indices: list[int]) -> pa.Table:
        """The key columns (run_id, sample_id, epoch, attempt) of these samples, in order."""
        return self.table.select(_KEY_COLUMNS).take(_positions(indices))


def _positions(indices: Sequence[int]) -> pa.Array:
    # Not pa.array(list): pyarrow imports pandas on its first conversion of a Python list
    # (0.2-0.3 s of CPU), which here would stand between the stage and its first chunk.
    buffer = pa.py_buffer(array.array("q", indices))
    return pa.Array.from_buffers(pa.int64(), len(indices), [None, buffer])


_SAMPLE_COLUMNS = ("completion", "target", "metadata", "sample_id", "state")
