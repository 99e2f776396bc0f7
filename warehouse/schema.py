"""Arrow schemas of what crosses the warehouse boundary (score rows, samples to score)."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from warehouse.verdict_images import image_ids

# A score is one grading attempt of one sample by one verifier version; attempt 1 is the first
# grading, n > 1 a retry of an unscored attempt n - 1 (docs/reference/warehouse.md: current_scores).
SCORE_KEY = ("run_id", "sample_id", "epoch", "scorer", "fingerprint", "attempt")

# Unscored reasons that say nothing about the answer, only that grading did not happen (the
# sandbox was down, the stage's time limit hit, the verifier or its worker process failed, the
# judge did not answer, the workspace store was not there), so grading the saved transcript
# again may succeed. Generation errors are never retried: the sample has no answer to grade.
# Nor is a judge reply with no verdict (`verdict_unparseable`): the same reply parses the same
# way; nor a workspace that was never captured or is damaged (`workspace_not_captured`,
# `workspace_unusable`): it stays so.
RETRYABLE_REASONS = (
    "sandbox_unavailable",
    "timeout",
    "verifier_error",
    "grader_failed",
    "workspace_missing",
)

# Which unscored samples a retry grades again: "all" retryable reasons (what a user asks for
# with --retry-unscored once the cause is fixed), or only "infrastructure" failures, where the
# scoring machinery failed rather than the verifier on this input: the sandbox was unreachable,
# the judge's calls failed (grader_failed), or the grading worker process died (a verifier_error whose explanation starts with
# WORKER_DIED, as scorers.workers.pool writes it). The sweep retries those by itself.
RetryScope = Literal["all", "infrastructure"]
WORKER_DIED = "scoring worker died"

SCORE_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("scorer", pa.string(), nullable=False),
        pa.field("fingerprint", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("answer", pa.string()),
        pa.field("explanation", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("scored_at", pa.timestamp("us", tz="UTC")),
        pa.field("duration_s", pa.float64()),
        pa.field("attempt", pa.int32()),  # null or missing means 1
        # the task image a sandbox verdict was graded in (warehouse.verdict_images); derived
        # from `metadata` when a writer does not give it
        pa.field("image_id", pa.string()),
    ]
)

SAMPLES_TO_SCORE_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("sample_id", pa.string()),
        pa.field("epoch", pa.int32()),
        pa.field("completion", pa.string()),
        pa.field("target", pa.list_(pa.string())),
        pa.field("metadata", pa.string()),
        pa.field("error", pa.string()),
        pa.field("attempt", pa.int32()),  # the attempt a grading of this sample writes
        # what a rebuilt Inspect TaskState needs (JSON), for verifiers that read it; else null
        pa.field("state", pa.string()),
    ]
)

SCORE_STATUSES = ("scored", "unscored", "error")

# the fingerprint of a score a log already held (warehouse.recorded_scores): never a verifier's
# current one, so nothing re-scores or retries under it
RECORDED_PREFIX = "recorded:"


def conform_scores(rows: pa.Table) -> pa.Table:
    """Cast a score table to SCORE_SCHEMA (column order, types); missing optional columns are
    null, but for `image_id`, which is read from `metadata` when no row gives one.

    Raises:
        ValueError: a key or status column is missing, or a status is not a known one.
    """
    missing = [f.name for f in SCORE_SCHEMA if not f.nullable and f.name not in rows.column_names]
    if missing:
        raise ValueError(f"score rows lack required column(s) {', '.join(missing)}")
    columns = []
    for f in SCORE_SCHEMA:
        if f.name in rows.column_names:
            columns.append(rows.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(rows.num_rows, f.type))
    # rows from before attempts were kept (staged files, callers) have no attempt: their first one
    at = SCORE_SCHEMA.get_field_index("attempt")
    columns[at] = pc.fill_null(columns[at], pa.scalar(1, pa.int32()))
    if pc.any(pc.less(columns[at], 1)).as_py():
        raise ValueError("score attempt must be 1 or more")
    image = SCORE_SCHEMA.get_field_index("image_id")
    if columns[image].null_count == rows.num_rows:
        columns[image] = image_ids(columns[SCORE_SCHEMA.get_field_index("metadata")])
    table = pa.Table.from_arrays(columns, schema=SCORE_SCHEMA)
    bad = pc.invert(pc.is_in(table.column("status"), pa.array(SCORE_STATUSES)))
    if pc.any(bad).as_py():
        first = table.column("status").filter(bad)[0].as_py()
        raise ValueError(f"score status {first!r} is not one of {', '.join(SCORE_STATUSES)}")
    return table
