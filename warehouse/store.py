"""The `Warehouse`: one DuckDB file, one writer, short transactions.

Every write opens the file, runs one transaction and closes it, so `gradebook sql` (or any
reader) gets in between a sweep's writes. Rows go in as Arrow tables through DuckDB's Arrow scan
with an anti-join on the key: idempotent, and ~1000x faster than `executemany` here.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.commands import command
from warehouse.connection import (
    WarehouseError,
    WarehouseLocked,
    WarehouseUnusable,
    connect,
    default_lock_timeout,
    one,
    os_errno_of,
    sql_str,
    unusable,
)
from warehouse.ingest import Ingest
from warehouse.migrations import SCHEMA_VERSION, check_not_newer, current_version, migrate
from warehouse.newest_fingerprint import CHANGED_SQL, RECORD_CURRENT_SQL
from warehouse.schema import (
    RETRYABLE_REASONS,
    SAMPLES_TO_SCORE_SCHEMA,
    WORKER_DIED,
    RetryScope,
    conform_scores,
)
from warehouse.score_inserts import _append_scores
from warehouse.stored_specs import store_spec
from warehouse.task_state_columns import STATE_JSON_SQL, STATE_RUNS_SQL

DEFAULT_DB = "gradebook.duckdb"
_STAGED_DONE = "loaded"


class WarehouseMissing(WarehouseError, FileNotFoundError):
    """A read was asked of a database file that does not exist."""


class Warehouse(Ingest):
    """A gradebook DuckDB file.

    Args:
        path: the database file (created on first write).
        lock_timeout_s: how long an open waits for another process's lock before raising
            `WarehouseLocked`; None: env GRADEBOOK_LOCK_TIMEOUT, else 5 s.
    """

    def __init__(
        self,
        path: str | Path = DEFAULT_DB,
        *,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.lock_timeout_s = default_lock_timeout() if lock_timeout_s is None else lock_timeout_s
        self._schema_ok = False

    # -- connections ---------------------------------------------------------------------------

    def _ensure_schema(self, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Migrate the file to this gradebook's schema, on `con` (read-write) if given."""
        if self._schema_ok:
            return
        own = con is None
        con = con or connect(self.path, read_only=False, timeout_s=self.lock_timeout_s)
        try:
            migrate(con, str(self.path))
        finally:
            if own:
                con.close()
        self._schema_ok = True

    @contextmanager
    def read(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection, open only for the block.

        Raises:
            WarehouseMissing: the file does not exist.
            WarehouseLocked: a writer held the file for longer than `lock_timeout_s`.
            SchemaTooNew: the file was written by a newer gradebook.
        """
        if not self.path.exists():
            raise WarehouseMissing(
                f"{self.path}: no warehouse here: run `{command('ingest', '--db', self.path)} "
                "LOG...` first, or pass --db / set GRADEBOOK_DB"
            )
        con = connect(self.path, read_only=True, timeout_s=self.lock_timeout_s)
        try:
            version = current_version(con)
            check_not_newer(version, str(self.path))
            if version < SCHEMA_VERSION:
                # upgrading needs the write lock: step out, migrate, come back
                con.close()
                self._ensure_schema()
                con = connect(self.path, read_only=True, timeout_s=self.lock_timeout_s)
            yield con
        finally:
            con.close()

    @contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection inside ONE transaction, committed when the block ends.

        An exception rolls the transaction back. The file lock is held only for the block.
        """
        con = connect(self.path, read_only=False, timeout_s=self.lock_timeout_s)
        try:
            try:
                # on this connection: a connect (~20-40 ms here) fewer per Warehouse
                self._ensure_schema(con)
                con.execute("BEGIN TRANSACTION")
            except duckdb.Error as exc:
                raise _write_error(self.path, exc) from None
            try:
                yield con
            except BaseException as exc:
                _rollback(con)
                if isinstance(exc, duckdb.Error) and os_errno_of(exc) is not None:
                    raise _write_error(self.path, exc) from None
                raise
            try:
                con.execute("COMMIT")
            except duckdb.Error as exc:
                # a full disk or a read-only file system: the transaction is not in the file
                raise _write_error(self.path, exc) from None
        finally:
            con.close()

    def check(self) -> None:
        """Cheaply check that the file can be this command's warehouse, before long work.

        An existing file must open as a gradebook warehouse (a lock held by another process
        is fine: the work waits for it as usual); a new one needs a writable directory.

        Raises:
            WarehouseUnusable: not a DuckDB file, a missing or read-only directory.
            SchemaTooNew: written by a newer gradebook.
        """
        if not self.path.exists():
            parent = self.path.parent
            if not parent.is_dir():
                raise WarehouseUnusable(
                    f"{self.path}: cannot create the warehouse: no such directory {parent}; "
                    "create it, or pass --db another path"
                )
            if not os.access(parent, os.W_OK):
                raise WarehouseUnusable(
                    f"{self.path}: cannot create the warehouse: {parent} is not writable; "
                    "pass --db a file in a writable directory"
                )
            return
        try:
            con = connect(self.path, read_only=True, timeout_s=0)
        except WarehouseLocked:
            return
        try:
            check_not_newer(current_version(con), str(self.path))
        finally:
            con.close()

    def schema_version(self) -> int:
        with self.read() as con:
            return current_version(con)

    # -- verifiers and scores ------------------------------------------------------------------

    def register_verifier(self, fp: Any, *, current: bool = False) -> bool:
        """Record a verifier fingerprint (`scorers.identity.fingerprint.VerifierFingerprint`).

        Args:
            fp: the fingerprint.
            current: it is the fingerprint of the verifier's code as it is now: also record
                that (`record_current`), in the same transaction.

        Returns:
            True when this (name, digest) was not known before.
        """
        params = fp.params if not is_dataclass(fp.params) else asdict(fp.params)
        spec = getattr(fp, "spec", None)
        with self.write() as con:
            if current:
                _record_current(con, {fp.name: fp.digest})
            if spec:
                # the spec that rebuilds it in any later command, sealed as this user's
                store_spec(con, fp.name, fp.digest, spec)
            known = one(
                con.execute(
                    "SELECT count(*) FROM wh.verifiers WHERE name = ? AND fingerprint = ?",
                    [fp.name, fp.digest],
                )
            )
            if known and known[0]:
                return False
            con.execute(
                "INSERT INTO wh.verifiers (name, fingerprint, label, source, params, first_seen, "
                "module, spec) VALUES (?, ?, ?, ?, ?, now(), ?, ?)",
                [
                    fp.name,
                    fp.digest,
                    fp.label,
                    fp.source,
                    json.dumps(params, sort_keys=True),
                    getattr(fp, "module", None) or None,
                    json.dumps(spec, sort_keys=True) if spec else None,
                ],
            )
            return True

    def record_current(self, fingerprints: Mapping[str, str], *, wait: bool = True) -> list[str]:
        """Record that these are the verifiers' fingerprints now (scorer -> digest of its code
        as it is now), so the views' "newest" (`current_verifiers`) is the current code's.

        Appends a `fingerprint_changes` row for each scorer whose last recorded fingerprint is
        another (or none); asks read-only first, so the usual "nothing changed" takes no write
        lock. A missing warehouse is not created.

        Args:
            fingerprints: scorer -> current digest.
            wait: False for a command that only reads: skip the record (the next command that
                writes makes it) rather than wait for another process's write lock.

        Returns:
            The scorers whose change was recorded.
        """
        if not fingerprints or not self.path.exists():
            return []
        params = {"scorers": list(fingerprints), "fingerprints": list(fingerprints.values())}
        try:
            with self.read() as con:
                if not con.execute(CHANGED_SQL, params).fetchall():
                    return []
        except WarehouseLocked:
            if wait:
                raise
            return []
        if wait:
            with self.write() as con:
                return _record_current(con, fingerprints)
        try:
            con = connect(self.path, read_only=False, timeout_s=0)
        except WarehouseLocked:
            return []
        try:
            self._ensure_schema(con)
            con.execute("BEGIN TRANSACTION")
            changed = _record_current(con, fingerprints)
            con.execute("COMMIT")
            return changed
        finally:
            con.close()

    def samples_to_score(
        self,
        scorer: str,
        digest: str,
        *,
        run_ids: Sequence[str] | None = None,
        retry: RetryScope | None = None,
        max_attempt: int | None = None,
        skip_reasons: Sequence[str] = (),
        state: bool = False,
        regrade: Sequence[tuple[str, str, int]] = (),
    ) -> pa.Table:
        """Samples to grade under (scorer, digest), as Arrow (SAMPLES_TO_SCORE_SCHEMA).

        Args:
            scorer: the verifier name.
            digest: its fingerprint digest.
            run_ids: restrict to these runs (default: every run).
            retry: also the samples whose latest attempt under (scorer, digest) is `unscored`
                with a reason in RETRYABLE_REASONS ("all") or an infrastructure failure
                ("infrastructure", see RetryScope); never scored rows, errored generations, or
                other unscored reasons.
            max_attempt: with `retry`, no retry is written as an attempt above this (a sample
                whose latest attempt is `max_attempt` or more is left as it is).
            skip_reasons: with `retry`, unscored reasons not to retry this time.
            state: also the `state` column, what a rebuilt Inspect TaskState needs (one JSON
                document per sample: warehouse.task_state_columns.STATE_JSON_SQL); else NULL.
            regrade: also these (run_id, sample_id, epoch) keys, graded before: their
                verdicts' task image was rebuilt (`image_verdicts`), so they are graded again
                as the next attempt.

        Returns:
            The samples with no score row for (scorer, digest), and with `retry` the retryable
            ones; `attempt` is the attempt number their grading must be written as.
        """
        if not self.path.exists() or (run_ids is not None and not run_ids):
            return SAMPLES_TO_SCORE_SCHEMA.empty_table()
        sql, params = _to_score_sql(
            scorer, digest, run_ids, retry, max_attempt, skip_reasons, state, regrade
        )
        with self.read() as con:
            table = con.sql(sql, params=params).to_arrow_table()
        return table.cast(SAMPLES_TO_SCORE_SCHEMA)

    def count_to_score(
        self,
        scorer: str,
        digest: str,
        *,
        run_ids: Sequence[str] | None = None,
        retry: RetryScope | None = None,
        max_attempt: int | None = None,
        skip_reasons: Sequence[str] = (),
    ) -> int:
        """How many samples `samples_to_score` would return with these arguments, counted
        without reading them (what a stopped stage leaves to the next one)."""
        if not self.path.exists() or (run_ids is not None and not run_ids):
            return 0
        sql, params = _to_score_sql(
            scorer, digest, run_ids, retry, max_attempt, skip_reasons, False
        )
        with self.read() as con:
            return int(con.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()[0])

    def image_verdicts(
        self, scorer: str, digest: str, run_ids: Sequence[str] | None = None
    ) -> list[tuple[str, str, int, str | None, str | None]]:
        """The current verdicts under (scorer, digest) graded in a task image (`image_id`),
        with what decides whether that image is still the one to grade in.

        Returns:
            (run_id, sample_id, epoch, the verdict's metadata, the sample's workspace record)
            rows, both JSON text (the record None when the sample has none).
        """
        if not self.path.exists() or (run_ids is not None and not run_ids):
            return []
        params: dict[str, Any] = {"scorer": scorer, "digest": digest}
        in_runs = ""
        if run_ids is not None:
            in_runs = "AND c.run_id IN (SELECT unnest($runs::VARCHAR[]))"
            params["runs"] = list(run_ids)
        sql = f"""
            SELECT c.run_id, c.sample_id, c.epoch, c.metadata::VARCHAR,
                   (s.store->'$.gradebook_workspace')::VARCHAR
            FROM current_scores c
            JOIN wh.samples s USING (run_id, sample_id, epoch)
            WHERE c.scorer = $scorer AND c.fingerprint = $digest AND c.image_id IS NOT NULL
              AND c.status <> 'unscored' {in_runs}
            ORDER BY 1, 2, 3
        """
        with self.read() as con:
            return [(r, i, int(e), m, w) for r, i, e, m, w in con.execute(sql, params).fetchall()]

    def unscored_to_retry(
        self, scorer: str, digest: str, retry: RetryScope
    ) -> list[tuple[str, str, int, int]]:
        """Samples whose latest attempt under (scorer, digest) is unscored and retryable under
        `retry` (what `samples_to_score` would grade again), counted without reading them.

        Returns:
            (run_id, reason, latest attempt, samples) rows, sorted.
        """
        if not self.path.exists():
            return []
        params: dict[str, Any] = {"scorer": scorer, "digest": digest}
        sql = f"""
            SELECT c.run_id, c.reason, c.attempt, count(*)
            FROM current_scores c
            JOIN wh.samples s USING (run_id, sample_id, epoch)
            WHERE c.scorer = $scorer AND c.fingerprint = $digest AND c.status = 'unscored'
              AND {_retryable_sql(retry, params)} AND s.error IS NULL
            GROUP BY ALL ORDER BY ALL
        """
        with self.read() as con:
            return [
                (r, why, int(a), int(n)) for r, why, a, n in con.execute(sql, params).fetchall()
            ]

    def write_scores(self, rows: pa.Table) -> int:
        """Append score rows (SCORE_SCHEMA); rows whose key is already stored, or repeated
        within `rows`, are skipped. One transaction.

        A row with attempt n > 1 (a retry) is stored only when attempt n - 1 of its key is
        stored and unscored with a retryable reason, or was graded in a task image and this
        row in another one (`image_id`: a rebuilt image); otherwise it is skipped, so no other
        scored row or generation error is ever superseded.

        Returns:
            The number of rows actually inserted.
        """
        table = conform_scores(rows)
        if table.num_rows == 0:
            return 0
        with self.write() as con:
            return _append_scores(con, table)

    def load_staged(self, directory: Path) -> int:
        """Load every `*.parquet` that `stage_scores` wrote into `directory`, in one transaction.

        Loaded files are then moved to `directory/loaded/`. A crash between the commit and the
        move only means the next call finds rows it already has: nothing is doubled.

        Returns:
            Rows inserted.
        """
        directory = Path(directory)
        files = sorted(p for p in directory.glob("*.parquet") if p.is_file())
        if not files:
            return 0
        table = pa.concat_tables(
            [conform_scores(pq.read_table(f)) for f in files], promote_options="default"
        )
        with self.write() as con:
            inserted = _append_scores(con, table) if table.num_rows else 0
        done = directory / _STAGED_DONE
        done.mkdir(exist_ok=True)
        for f in files:
            os.replace(f, done / f.name)
        return inserted

    # -- export --------------------------------------------------------------------------------

    def export_parquet(self, directory: Path) -> dict[str, Path]:
        """Write every view of the warehouse (the documented interface: runs, samples, scores,
        run_metrics, grade_flips, gates, ...) to `directory/<view>.parquet`.

        Each file appears whole (written under a temporary name, then renamed).

        Returns:
            view name -> file written, in name order.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = {}
        with self.read() as con:
            views = [
                name
                for (name,) in con.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_catalog = current_database() AND table_schema = 'main' "
                    "AND table_type = 'VIEW' ORDER BY table_name"
                ).fetchall()
            ]
            for view in views:
                target = directory / f"{view}.parquet"
                tmp = directory / f".{view}.{uuid.uuid4().hex}.parquet.tmp"
                try:
                    con.execute(
                        f"COPY (SELECT * FROM \"{view}\") TO '{sql_str(tmp)}' (FORMAT parquet)"
                    )
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                os.replace(tmp, target)
                written[view] = target
        return written


def stage_scores(rows: pa.Table, directory: Path) -> Path:
    """Write score rows as one Parquet file for a later `Warehouse.load_staged` (no DB access).

    The file appears atomically (written under a temporary name, fsynced, then renamed), so a
    loader never sees half a file and a killed worker leaves at most an ignored `.tmp`.
    """
    table = conform_scores(rows)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"scores-{uuid.uuid4().hex}.parquet"
    tmp = directory / f".{name}.tmp"
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    final = directory / name
    os.replace(tmp, final)
    return final


def _record_current(con: duckdb.DuckDBPyConnection, fingerprints: Mapping[str, str]) -> list[str]:
    params = {"scorers": list(fingerprints), "fingerprints": list(fingerprints.values())}
    return [r[0] for r in con.execute(RECORD_CURRENT_SQL, params).fetchall()]


def _write_error(path: Path, exc: duckdb.Error) -> Exception:
    """A failed write as the one-line error a user acts on when the OS refused it (full disk,
    read-only file system); any other DuckDB error is left as it is."""
    if os_errno_of(exc) is None:
        return exc
    return unusable(path, exc, doing="write")


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass  # the failed statement already ended the transaction (or invalidated the file)


def _to_score_sql(
    scorer: str,
    digest: str,
    run_ids: Sequence[str] | None,
    retry: RetryScope | None,
    max_attempt: int | None,
    skip_reasons: Sequence[str],
    state: bool,
    regrade: Sequence[tuple[str, str, int]] = (),
) -> tuple[str, dict[str, Any]]:
    """The query (and its parameters) of `Warehouse.samples_to_score`."""
    params: dict[str, Any] = {"scorer": scorer, "digest": digest}
    in_runs = ""
    if run_ids is not None:
        # composed, not `$runs IS NULL OR ...`: that OR would turn the semi-join into a
        # mark join over every sample
        in_runs = "AND {col} IN (SELECT unnest($runs::VARCHAR[]))"
        params["runs"] = list(run_ids)
    state_col, runs_join = "NULL::VARCHAR", ""
    if state:
        state_col, runs_join = (
            STATE_JSON_SQL,
            f"LEFT JOIN {STATE_RUNS_SQL} r ON r.run_id = s.run_id",
        )
    if retry is not None or regrade:
        retryable = _retryable_sql(retry, params) if retry is not None else "FALSE"
        regrade_join, regraded = "", "FALSE"
        if regrade:
            regrade = list(dict.fromkeys((str(r), str(i), int(e)) for r, i, e in regrade))
            regrade_join = """LEFT JOIN (SELECT unnest($rg_run::VARCHAR[]) AS run_id,
                                     unnest($rg_sample::VARCHAR[]) AS sample_id,
                                     unnest($rg_epoch::INTEGER[]) AS epoch) g
              ON g.run_id = s.run_id AND g.sample_id = s.sample_id AND g.epoch = s.epoch"""
            regraded = "(g.run_id IS NOT NULL AND c.status <> 'unscored' AND s.error IS NULL)"
            params["rg_run"], params["rg_sample"], params["rg_epoch"] = (
                [k[0] for k in regrade],
                [k[1] for k in regrade],
                [k[2] for k in regrade],
            )
        if max_attempt is not None:
            retryable += " AND c.attempt < $max_attempt"
            params["max_attempt"] = max_attempt
        if skip_reasons:
            retryable += " AND NOT list_contains($skip::VARCHAR[], c.reason)"
            params["skip"] = list(skip_reasons)
        if state:
            state_col = _with_replay(state_col)
        sql = f"""
            WITH cur AS (
                SELECT run_id, sample_id, epoch, max(attempt) AS attempt,
                       arg_max(status, attempt) AS status, arg_max(reason, attempt) AS reason,
                       arg_max(explanation, attempt) AS explanation,
                       arg_max(metadata, attempt) AS metadata
                FROM wh.scores
                WHERE scorer = $scorer AND fingerprint = $digest {in_runs.format(col="run_id")}
                GROUP BY run_id, sample_id, epoch
            )
            SELECT s.run_id, s.sample_id, s.epoch, s.completion, s.target,
                   s.metadata::VARCHAR AS metadata, s.error,
                   (coalesce(c.attempt, 0) + 1)::INTEGER AS attempt, {state_col} AS state
            FROM wh.samples s
            LEFT JOIN cur c
              ON c.run_id = s.run_id AND c.sample_id = s.sample_id AND c.epoch = s.epoch
            {runs_join}
            {regrade_join}
            WHERE (c.attempt IS NULL
                   OR (c.status = 'unscored' AND {retryable} AND s.error IS NULL)
                   OR {regraded})
              {in_runs.format(col="s.run_id")}
            ORDER BY s.run_id, s.sample_id, s.epoch
        """
    else:
        sql = f"""
            SELECT s.run_id, s.sample_id, s.epoch, s.completion, s.target,
                   s.metadata::VARCHAR AS metadata, s.error, 1::INTEGER AS attempt,
                   {state_col} AS state
            FROM wh.samples s {runs_join}
            WHERE NOT EXISTS (
                SELECT 1 FROM wh.scores c
                WHERE c.scorer = $scorer AND c.fingerprint = $digest
                  AND c.run_id = s.run_id AND c.sample_id = s.sample_id AND c.epoch = s.epoch
            ) {in_runs.format(col="s.run_id")}
            ORDER BY s.run_id, s.sample_id, s.epoch
        """
    return sql, params


def _with_replay(state_sql: str) -> str:
    """The state of a retried sample whose last attempt (`c`) was left unscored by its judge
    (`grader_failed`) with its sandbox calls recorded: those calls join the state as
    `sandbox_replay`, and a sandbox scorer is judged again from them, with no container
    (workspaces.restore)."""
    return f"""CASE WHEN c.reason = 'grader_failed' AND json_exists(c.metadata, '$.sandbox.calls')
        THEN json_merge_patch({state_sql}::JSON,
                              json_object('sandbox_replay', c.metadata->'$.sandbox'))::VARCHAR
        ELSE {state_sql} END"""


def _retryable_sql(retry: RetryScope, params: dict[str, Any]) -> str:
    """The condition on an unscored score row `c` that `retry` grades again (adds its params)."""
    if retry == "all":
        params["reasons"] = list(RETRYABLE_REASONS)
        return "list_contains($reasons::VARCHAR[], c.reason)"
    params["died"] = WORKER_DIED
    return (
        "(c.reason IN ('sandbox_unavailable', 'grader_failed') OR "
        "(c.reason = 'verifier_error' AND starts_with(c.explanation, $died)))"
    )
