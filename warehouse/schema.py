"""Arrow schemas of what crosses the warehouse boundary (score rows, samples to score)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

SCORE_KEY = ("run_id", "sample_id", "epoch", "scorer", "fingerprint")

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
    ]
)

SCORE_STATUSES = ("scored", "unscored", "error")


def conform_scores(rows: pa.Table) -> pa.Table:
    """Cast a score table to SCORE_SCHEMA (column order, types); missing optional columns are null.

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
    table = pa.Table.from_arrays(columns, schema=SCORE_SCHEMA)
    bad = pc.invert(pc.is_in(table.column("status"), pa.array(SCORE_STATUSES)))
    if pc.any(bad).as_py():
        first = table.column("status").filter(bad)[0].as_py()
        raise ValueError(f"score status {first!r} is not one of {', '.join(SCORE_STATUSES)}")
    return table
