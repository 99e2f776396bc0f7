"""Score rows into `wh.scores`: appended with an anti-join on the key (idempotent), the
dict-valued scores' key rows beside them, and the grade flips a batch makes recorded.

Shared by the scoring stage's writes (warehouse.store) and ingest's recorded scores
(warehouse.ingest).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from warehouse.connection import (
    one,
)
from warehouse.metric_views import flip_pairs_select
from warehouse.schema import (
    RETRYABLE_REASONS,
)
from warehouse.score_values import dict_key_rows


def _append_scores(con: duckdb.DuckDBPyConnection, table: pa.Table) -> int:
    # a dict-valued Inspect score is also a row per key (warehouse.score_values); the count
    # returned is of the rows given (a key row is new exactly when its score's row is)
    given = table.num_rows
    keys = dict_key_rows(table)
    if keys is not None:
        table = pa.concat_tables([table, keys])
    return min(given, _insert_scores(con, table))


def _insert_scores(con: duckdb.DuckDBPyConnection, table: pa.Table) -> int:
    con.register("_incoming_scores", table)
    try:
        # Duplicate keys inside one batch are collapsed explicitly to one row each (which one is
        # unspecified: the same verifier fingerprint on the same sample gives the same verdict),
        # then the batch is anti-joined against what is stored. DISTINCT ON doubles the cost of
        # a large write, so it runs only when the key hashes say there may be duplicates
        # (distinct hashes prove distinct keys; a collision only costs the DISTINCT ON).
        maybe_dupes = one(
            con.execute(
                "SELECT count(*) - count(DISTINCT hash(run_id, sample_id, epoch, scorer, "
                "fingerprint, attempt)) FROM _incoming_scores"
            )
        )
        batch = (
            "(SELECT DISTINCT ON (run_id, sample_id, epoch, scorer, fingerprint, attempt) * "
            "FROM _incoming_scores)"
            if maybe_dupes and maybe_dupes[0]
            else "_incoming_scores"
        )
        # retries only supersede a stored retryable unscored attempt, or one graded in another
        # task image than theirs (see write_scores); the check costs a join only for a batch
        # that holds retries
        retries = pc.max(table.column("attempt")).as_py() > 1
        only_valid_retries = (
            f"""
              AND (b.attempt = 1 OR EXISTS (
                SELECT 1 FROM wh.scores p
                WHERE p.run_id = b.run_id AND p.sample_id = b.sample_id AND p.epoch = b.epoch
                  AND p.scorer = b.scorer AND p.fingerprint = b.fingerprint
                  AND p.attempt = b.attempt - 1
                  AND ((p.status = 'unscored'
                        AND p.reason IN ({", ".join(f"'{r}'" for r in RETRYABLE_REASONS)}))
                       OR (p.image_id IS NOT NULL AND b.image_id IS NOT NULL
                           AND p.image_id <> b.image_id))
              ))"""
            if retries
            else ""
        )
        new_rows = f"""
            SELECT * FROM {batch} b
            WHERE NOT EXISTS (
                SELECT 1 FROM wh.scores s
                WHERE s.run_id = b.run_id AND s.sample_id = b.sample_id AND s.epoch = b.epoch
                  AND s.scorer = b.scorer AND s.fingerprint = b.fingerprint
                  AND s.attempt = b.attempt
            ){only_valid_retries}
        """
        with_stored, within_batch = _flip_sources(con, table)
        if not (with_stored or within_batch):
            inserted = one(con.execute(f"INSERT INTO wh.scores {new_rows}"))
            return int(inserted[0]) if inserted else 0
        # grade_flips reads wh.flip_pairs: add the pairs these rows form, before they are stored
        # (so a pair among stored rows is never added twice) and in the same transaction
        con.execute(f"CREATE OR REPLACE TEMP TABLE _new_scores AS {new_rows}")
        try:
            if with_stored:
                con.execute(
                    "INSERT INTO wh.flip_pairs "
                    + flip_pairs_select("_new_scores", "wh.scores", both_orientations=True)
                )
            if within_batch:
                con.execute(
                    "INSERT INTO wh.flip_pairs "
                    + flip_pairs_select("_new_scores", "_new_scores", both_orientations=False)
                )
            inserted = one(con.execute("INSERT INTO wh.scores SELECT * FROM _new_scores"))
        finally:
            con.execute("DROP TABLE IF EXISTS _new_scores")
        return int(inserted[0]) if inserted else 0
    finally:
        con.unregister("_incoming_scores")


def _flip_sources(con: duckdb.DuckDBPyConnection, table: pa.Table) -> tuple[bool, bool]:
    """Whether rows of `table` may form flip pairs (with stored rows, within the batch).

    A pair needs two fingerprints of one scorer on one run. Both are False for the common
    first scoring of a run, which then costs no join at all.
    """
    per_scorer = table.group_by(["scorer", "fingerprint"]).aggregate([])
    within_batch = per_scorer.num_rows != pc.count_distinct(per_scorer.column("scorer")).as_py()
    found = one(
        con.execute(
            """
            SELECT EXISTS (
                SELECT 1 FROM wh.scores s
                JOIN (SELECT unnest($1::VARCHAR[]) AS scorer, unnest($2::VARCHAR[]) AS fp) b
                  ON s.scorer = b.scorer AND s.fingerprint <> b.fp
                WHERE s.run_id IN (SELECT unnest($3::VARCHAR[]))
            )
            """,
            [
                per_scorer.column("scorer").to_pylist(),
                per_scorer.column("fingerprint").to_pylist(),
                pc.unique(table.column("run_id")).to_pylist(),
            ],
        )
    )
    return bool(found and found[0]), within_batch


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> int:
    row = one(con.execute(sql, params or []))
    return int(row[0]) if row and row[0] is not None else 0
