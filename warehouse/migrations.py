"""Forward-only schema migrations, applied when a warehouse is opened.

The schema version is the number of migrations applied; adding a migration means appending one
`Migration` to `MIGRATIONS`. A file is upgraded in place inside one transaction per migration, and
a file whose version is newer than this code knows is refused (an older gradebook must never
write into a schema it does not understand).

Tables live in the `wh` schema; users query the documented views in `main`
(docs/reference/warehouse.md), so a table can change shape behind a stable view.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from warehouse.connection import WarehouseError, one
from warehouse.gate_schema import GATES_TABLE_SQL, PASS_AT_K_SQL
from warehouse.judge_usage import JUDGE_USAGE_SQL
from warehouse.log_copies import LOG_COPIES_SQL
from warehouse.log_stamps import LOG_STAMP_SQL
from warehouse.metric_views import QUERY_VIEWS_SQL
from warehouse.newest_fingerprint import NEWEST_FINGERPRINT_SQL
from warehouse.score_attempts import IMAGE_ATTEMPTS_SQL, RETRY_ATTEMPTS_SQL
from warehouse.stored_specs import VERIFIER_MODULE_SQL, VERIFIER_SPECS_SQL
from warehouse.task_state_columns import TASK_STATE_SQL
from warehouse.workspace_views import WORKSPACE_VIEWS_SQL


@dataclass(frozen=True)
class Migration:
    description: str
    sql: str


class SchemaTooNew(WarehouseError, RuntimeError):
    """The database was written by a newer gradebook than this one."""


_V1_TABLES = """
CREATE SCHEMA IF NOT EXISTS wh;

CREATE TABLE wh.runs (
    run_id VARCHAR NOT NULL,          -- Inspect eval_id: stable across re-reads and resumes
    inspect_run_id VARCHAR,
    task VARCHAR,
    task_id VARCHAR,
    task_version VARCHAR,
    task_args JSON,
    model VARCHAR,
    model_args JSON,
    created TIMESTAMPTZ,
    status VARCHAR,
    epochs INTEGER,
    dataset_samples INTEGER,
    total_samples INTEGER,
    n_samples INTEGER,
    n_errors INTEGER,
    ingest_state VARCHAR,             -- 'partial' until every sample of the log is stored
    log_path VARCHAR,
    log_sha256 VARCHAR,
    log_size BIGINT,
    inspect_version VARCHAR,
    eval_spec JSON,
    first_ingested_at TIMESTAMPTZ,
    ingested_at TIMESTAMPTZ
);

CREATE TABLE wh.samples (
    run_id VARCHAR NOT NULL,
    sample_id VARCHAR NOT NULL,
    epoch INTEGER NOT NULL,
    uuid VARCHAR,
    input VARCHAR,
    target VARCHAR[],
    completion VARCHAR,
    error VARCHAR,
    error_traceback VARCHAR,
    output JSON,
    metadata JSON,
    store JSON,
    model_usage JSON,
    input_tokens BIGINT,
    output_tokens BIGINT,
    total_tokens BIGINT,
    total_time DOUBLE,
    working_time DOUBLE,
    started_at TIMESTAMPTZ,
    completed_at TIMESTAMPTZ,
    n_messages INTEGER,
    ingested_at TIMESTAMPTZ
);

CREATE TABLE wh.messages (
    run_id VARCHAR NOT NULL,
    sample_id VARCHAR NOT NULL,
    epoch INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    role VARCHAR,
    text VARCHAR,
    tool_calls JSON,
    tool_call_id VARCHAR,
    function VARCHAR,
    tool_error VARCHAR
);

CREATE TABLE wh.verifiers (
    name VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    label VARCHAR,
    source VARCHAR,
    params JSON,
    first_seen TIMESTAMPTZ NOT NULL
);

-- Append-only. Uniqueness of (run_id, sample_id, epoch, scorer, fingerprint) is enforced by the
-- single write path (anti-join + in-batch dedupe), not by a PRIMARY KEY: an ART index over tens
-- of millions of rows would cost more on every append than the anti-join does.
CREATE TABLE wh.scores (
    run_id VARCHAR NOT NULL,
    sample_id VARCHAR NOT NULL,
    epoch INTEGER NOT NULL,
    scorer VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    value DOUBLE,
    answer VARCHAR,
    explanation VARCHAR,
    reason VARCHAR,
    metadata JSON,
    scored_at TIMESTAMPTZ,
    duration_s DOUBLE
);

CREATE VIEW runs AS SELECT * FROM wh.runs;
CREATE VIEW samples AS SELECT * FROM wh.samples;
CREATE VIEW messages AS SELECT * FROM wh.messages;
CREATE VIEW verifiers AS SELECT * FROM wh.verifiers;
CREATE VIEW scores AS SELECT * FROM wh.scores;
"""

# v2: the analysis views. A v1 file (tables only) gains them in place.
_V2_VIEWS = """
CREATE OR REPLACE VIEW samples AS
SELECT s.*, r.task, r.model
FROM wh.samples s LEFT JOIN wh.runs r USING (run_id);

-- When a fingerprint was first seen: the verifiers table when registered, else its first score.
CREATE OR REPLACE VIEW fingerprint_order AS
WITH seen AS (
    SELECT scorer, fingerprint, min(scored_at) AS first_scored
    FROM wh.scores GROUP BY ALL
)
SELECT seen.scorer, seen.fingerprint,
       coalesce(v.first_seen, seen.first_scored) AS first_seen, v.label
FROM seen LEFT JOIN wh.verifiers v ON v.name = seen.scorer AND v.fingerprint = seen.fingerprint;

CREATE OR REPLACE VIEW latest_scores AS
WITH newest AS (
    SELECT scorer, arg_max(fingerprint, (first_seen, fingerprint)) AS fingerprint
    FROM fingerprint_order GROUP BY scorer
)
SELECT s.* FROM wh.scores s SEMI JOIN newest n
    ON s.scorer = n.scorer AND s.fingerprint = n.fingerprint;

CREATE OR REPLACE VIEW run_metrics AS
WITH agg AS (
    SELECT run_id, scorer, fingerprint,
           count(*) AS n_rows,
           count(*) FILTER (WHERE status = 'scored') AS n_scored,
           count(*) FILTER (WHERE status = 'unscored') AS n_unscored,
           count(*) FILTER (WHERE status = 'error') AS n_error,
           sum(value) FILTER (WHERE status = 'scored') AS n_correct,
           avg(value) FILTER (WHERE status = 'scored') AS accuracy,
           stddev_samp(value) FILTER (WHERE status = 'scored') AS sd
    FROM wh.scores GROUP BY ALL
),
stored AS (SELECT run_id, count(*) AS n FROM wh.samples GROUP BY run_id)
SELECT agg.run_id, r.task, r.model, r.created, agg.scorer, agg.fingerprint,
       greatest(agg.n_rows, coalesce(stored.n, 0)) AS n_samples,
       agg.n_scored, agg.n_unscored, agg.n_error,
       greatest(coalesce(stored.n, 0) - agg.n_rows, 0) AS n_pending,
       agg.accuracy,
       coalesce(agg.n_correct, 0) / greatest(agg.n_rows, coalesce(stored.n, 0)) AS accuracy_strict,
       agg.sd / sqrt(agg.n_scored) AS stderr
FROM agg
LEFT JOIN wh.runs r ON r.run_id = agg.run_id
LEFT JOIN stored ON stored.run_id = agg.run_id;

CREATE OR REPLACE VIEW grade_flips AS
SELECT o.scorer, o.run_id, o.sample_id, o.epoch,
       o.fingerprint AS old_fingerprint, n.fingerprint AS new_fingerprint,
       o.status AS old_status, n.status AS new_status,
       o.value AS old_value, n.value AS new_value,
       o.answer AS old_answer, n.answer AS new_answer,
       o.explanation AS old_explanation, n.explanation AS new_explanation
FROM wh.scores o
JOIN wh.scores n
  ON o.scorer = n.scorer AND o.run_id = n.run_id
 AND o.sample_id = n.sample_id AND o.epoch = n.epoch
 AND o.fingerprint <> n.fingerprint
JOIN fingerprint_order fo ON fo.scorer = o.scorer AND fo.fingerprint = o.fingerprint
JOIN fingerprint_order fn ON fn.scorer = n.scorer AND fn.fingerprint = n.fingerprint
WHERE (fo.first_seen, fo.fingerprint) < (fn.first_seen, fn.fingerprint)
  AND (o.status IS DISTINCT FROM n.status OR o.value IS DISTINCT FROM n.value);

CREATE OR REPLACE VIEW score_history AS
SELECT m.task, m.model, m.scorer, m.fingerprint, fo.label, m.created, m.run_id,
       m.accuracy, m.accuracy_strict, m.stderr,
       m.n_samples, m.n_scored, m.n_unscored, m.n_error, m.n_pending
FROM run_metrics m
LEFT JOIN fingerprint_order fo ON fo.scorer = m.scorer AND fo.fingerprint = m.fingerprint;
"""

MIGRATIONS: list[Migration] = [
    Migration("tables: runs, samples, messages, verifiers, scores", _V1_TABLES),
    Migration("views: run_metrics, latest_scores, grade_flips, score_history", _V2_VIEWS),
    Migration("gates table and latest_gates view", GATES_TABLE_SQL),
    Migration("pass@k: run_pass_at_k view, run_metrics.epochs and .pass_at_k", PASS_AT_K_SQL),
    Migration("run_metrics in one pass; grade_flips from wh.flip_pairs", QUERY_VIEWS_SQL),
    Migration("scores.attempt: retries of unscored samples; current_scores", RETRY_ATTEMPTS_SQL),
    Migration("runs.log_mtime_ns, log_inode, log_seen_at: stat-checked re-ingest", LOG_STAMP_SQL),
    Migration("fingerprint_changes, current_verifiers: newest = current", NEWEST_FINGERPRINT_SQL),
    Migration("verifiers.module: the module that provides each verifier", VERIFIER_MODULE_SQL),
    Migration(
        "samples.choices, samples.messages_json, runs.plan, verifiers.spec: Inspect scorers",
        TASK_STATE_SQL,
    ),
    Migration("judge_usage view: judge calls and tokens per run", JUDGE_USAGE_SQL),
    Migration("verifier_specs: the sealed spec that rebuilds each verifier", VERIFIER_SPECS_SQL),
    Migration(
        "workspaces and sandbox_calls views: agents' workspaces, scorers' calls",
        WORKSPACE_VIEWS_SQL,
    ),
    Migration("log_copies: every location a run's log was seen at", LOG_COPIES_SQL),
    Migration("scores.image_id: a rebuilt task image supersedes its verdicts", IMAGE_ATTEMPTS_SQL),
]

SCHEMA_VERSION = len(MIGRATIONS)


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version of an open database (0 for a new, empty file)."""
    exists = one(
        con.execute(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_schema = 'wh' AND table_name = 'schema_version'"
        )
    )
    if not exists or not exists[0]:
        return 0
    row = one(con.execute("SELECT max(version) FROM wh.schema_version"))
    return int(row[0] or 0) if row else 0


def check_not_newer(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{where} has schema version {version} but this gradebook knows only up to "
            f"{SCHEMA_VERSION}: upgrade gradebook, or point --db/GRADEBOOK_DB at another file"
        )


def migrate(
    con: duckdb.DuckDBPyConnection, where: str, *, target: int = SCHEMA_VERSION
) -> list[int]:
    """Apply every pending migration up to `target`, one transaction each.

    Args:
        con: a read-write connection.
        where: the database path, for messages.
        target: stop at this version (tests build an older file with it).

    Returns:
        The versions applied (empty when already current).
    """
    version = current_version(con)
    check_not_newer(version, where)
    applied = []
    for number in range(version + 1, target + 1):
        migration = MIGRATIONS[number - 1]
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("CREATE SCHEMA IF NOT EXISTS wh")
            con.execute(
                "CREATE TABLE IF NOT EXISTS wh.schema_version ("
                "version INTEGER NOT NULL, description VARCHAR, applied_at TIMESTAMPTZ)"
            )
            con.execute(migration.sql)
            con.execute(
                "INSERT INTO wh.schema_version VALUES (?, ?, now())",
                [number, migration.description],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        applied.append(number)
    return applied
