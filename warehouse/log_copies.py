"""Where each log was seen: every location (a local path, an `s3://` URL) an ingest read a run's
log from, with the bytes it held there.

Why: a run is keyed by its eval_id, not by where its log lives, so the same log ingested from a
local path and later from its copy in a bucket is one run (`runs.log_path` names the last file
ingested). Which copies exist, and that they held the same bytes, is what a user moving logs to
object storage (or auditing one) asks; this table answers it in SQL.

Append-only (principle 7): one row per (run, location, content), written the first time an
ingest reads that content there, never updated. So a re-ingest over logs already recorded takes
no write lock (warehouse.ingest's no-op path), and a location whose log grew or was replaced
keeps a row per version.
"""

from __future__ import annotations

import os

import duckdb

from warehouse.object_store import is_url

LOG_COPIES_SQL = """
CREATE TABLE wh.log_copies (
    run_id VARCHAR NOT NULL,
    location VARCHAR NOT NULL,       -- an absolute local path, or the URL as given
    log_sha256 VARCHAR NOT NULL,
    log_size BIGINT,
    first_seen TIMESTAMPTZ NOT NULL
);

-- what an older warehouse knew: the file each run was last ingested from
INSERT INTO wh.log_copies
SELECT run_id, log_path, log_sha256, log_size, coalesce(ingested_at, first_ingested_at, now())
FROM wh.runs
WHERE log_path IS NOT NULL AND log_sha256 IS NOT NULL AND ingest_state = 'complete';

CREATE VIEW log_copies AS SELECT * FROM wh.log_copies;
"""

# whether the content a run was stored from (runs.log_sha256) is recorded at a location
KNOWN_SQL = (
    "EXISTS (SELECT 1 FROM wh.log_copies c WHERE c.run_id = wh.runs.run_id "
    "AND c.location = ? AND c.log_sha256 = wh.runs.log_sha256)"
)


def location_of(path: str) -> str:
    """How a log's location is recorded: a URL unchanged, a local path absolute (`file://`
    stripped), so the same file named from two working directories is one location."""
    if is_url(path):
        return path
    return os.path.abspath(path.removeprefix("file://"))


def record_copy(
    con: duckdb.DuckDBPyConnection, run_id: str, path: str, sha256: str, size: int | None
) -> None:
    """Record that `path` held the log of `run_id` with these bytes (once; inside the caller's
    transaction)."""
    location = location_of(path)
    con.execute(
        "INSERT INTO wh.log_copies SELECT $1, $2, $3, $4, now() WHERE NOT EXISTS ("
        "SELECT 1 FROM wh.log_copies WHERE run_id = $1 AND location = $2 AND log_sha256 = $3)",
        [run_id, location, sha256, size],
    )
