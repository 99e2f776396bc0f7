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
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import warehouse.log_stamps as log_stamps
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
from warehouse.inflate import InflateLimits
from warehouse.metric_views import flip_pairs_select
from warehouse.migrations import SCHEMA_VERSION, check_not_newer, current_version, migrate
from warehouse.newest_fingerprint import CHANGED_SQL, RECORD_CURRENT_SQL
from warehouse.prefetch import prefetch
from warehouse.schema import (
    RETRYABLE_REASONS,
    SAMPLES_TO_SCORE_SCHEMA,
    WORKER_DIED,
    RetryScope,
    conform_scores,
)
from warehouse.score_values import dict_key_rows
from warehouse.stored_specs import store_spec
from warehouse.task_state_columns import STATE_JSON_SQL

if TYPE_CHECKING:
    import warehouse.logs as logs

DEFAULT_DB = "gradebook.duckdb"
_STAGED_DONE = "loaded"


class WarehouseMissing(WarehouseError, FileNotFoundError):
    """A read was asked of a database file that does not exist."""


# Unreadable samples named per log, one line each; past this many, one line says how many more.
NAMED_BAD_SAMPLES = 50


@dataclass(frozen=True)
class IngestResult:
    """What ingesting one log did.

    `error` is a one-line message when the log was not ingested, or not completely: then
    `bad_samples` names each sample that could not be read (the others were stored).
    `samples_cancelled`: samples of the log read this time that were cancelled in flight
    (its eval was stopped): not generated, so not stored (`SampleColumns.skips`).
    """

    path: str
    run_id: str | None
    task: str | None
    model: str | None
    status: str | None
    samples_added: int
    samples_total: int
    error: str | None = None
    bad_samples: tuple[str, ...] = ()
    samples_cancelled: int = 0

    def problems(self) -> list[str]:
        """What to tell the user, one line each: the unreadable samples, then `error`."""
        lines = list(self.bad_samples[:NAMED_BAD_SAMPLES])
        if len(self.bad_samples) > NAMED_BAD_SAMPLES:
            more = len(self.bad_samples) - NAMED_BAD_SAMPLES
            lines.append(f"{self.path}: ... and {more} more unreadable samples")
        return lines + ([self.error] if self.error else [])


@dataclass(frozen=True)
class _StoredRun:
    """What a re-ingest compares a log with: the run's stored file identity and state."""

    sha256: str | None
    size: int | None
    state: str | None
    n_samples: int
    stamp: log_stamps.LogStamp | None
    path: str | None = None


class Warehouse:
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

    # -- ingest --------------------------------------------------------------------------------

    def ingest_logs(
        self,
        paths: Sequence[str | Path],
        *,
        progress: bool = False,
        batch_size: int | None = None,
        direct_read: bool = True,
        limits: InflateLimits | None = None,
    ) -> list[IngestResult]:
        """Ingest Inspect logs; idempotent, and a log that grew adds only its new samples.

        Samples are keyed on (eval_id, sample id, epoch). Each batch of samples is written with
        its messages in one transaction; the run is marked `ingest_state = 'complete'` only once
        all its samples are in, so an interrupted ingest is finished by running it again.

        Args:
            paths: `.eval` / `.json` logs, local paths or fsspec URLs Inspect can read.
            progress: show a rich progress bar.
            batch_size: samples per write transaction (default: 500 through Inspect's reader,
                up to 5,000 or 64 MB of sample JSON through the direct archive reader).
            direct_read: read `.eval` logs written by the installed Inspect version straight
                from the archive (same rows, 15-25x faster in benchmarks/warehouse.py);
                False always uses Inspect's readers.
            limits: how far a log's members may inflate (default: InflateLimits.from_env(),
                the environment's GRADEBOOK_MAX_* or docs/design/ingest.md's defaults). A
                sample over them is refused as a damaged one is; a header, or a log whose
                members add up past its limit, refuses the log (what was read is kept).

        Returns:
            One result per path, in order; a bad log gives `error` set and the others go on.
        """
        limits = limits or InflateLimits.from_env()
        results: list[IngestResult] = []
        if not progress:
            for p in paths:
                results.append(self._ingest_one(str(p), batch_size, None, direct_read, limits))
            return results
        from rich.progress import Progress

        with Progress(transient=False) as bar:
            overall = bar.add_task("ingest", total=len(paths))
            for p in paths:
                results.append(
                    self._ingest_one(str(p), batch_size, (bar, overall), direct_read, limits)
                )
                bar.advance(overall)
        return results

    def _ingest_one(
        self,
        path: str,
        batch_size: int | None,
        bar: Any,
        direct_read: bool,
        limits: InflateLimits,
    ) -> IngestResult:
        unchanged = self._in_already(path, limits)
        if unchanged is not None:
            return unchanged
        # Imported here: reading logs pulls in inspect_ai (seconds), which `gradebook sql`, the
        # score writers and a re-run over logs already in never need.
        import warehouse.logs as logs

        try:
            logs.check_log_path(path)
            header = logs.read_header(path, fast=direct_read, limits=limits)
        except logs.LogReadError as exc:
            return IngestResult(path, None, None, None, None, 0, 0, str(exc))
        spec = header.eval

        cancelled = 0

        def result(added: int, total: int, error: str | None = None) -> IngestResult:
            return IngestResult(
                path, spec.eval_id, spec.task, spec.model, header.status, added, total, error,
                samples_cancelled=cancelled,
            )  # fmt: skip

        # The common re-run: this exact file is in already. Asked on a read-only connection, so
        # a no-op takes no write lock and no transaction; and when the file's stat proves it is
        # the one hashed last time (warehouse.log_stamps), without reading the file again.
        stamp = log_stamps.stamp(path)  # before hashing: it vouches only for what is read after
        stored = self._stored_run(spec.eval_id)
        prior = stored if stored is not None and stored.state == "complete" else None
        # (not complete: an interrupted or damaged ingest, finished whatever the file says)
        if prior is not None and log_stamps.proves_unchanged(prior.stamp, stamp):
            return result(0, prior.n_samples)
        try:
            sha256, size = logs.file_digest(path)
        except logs.LogReadError as exc:
            return IngestResult(path, None, None, None, None, 0, 0, str(exc))
        if stamp is not None and stamp.size != size:
            stamp = None  # written while it was hashed: this stat is not of the bytes hashed
        if prior is not None and (prior.sha256, prior.size) == (sha256, size):
            if stamp is not None and not stamp.racy:
                self._remember_stamp(spec.eval_id, sha256, stamp)
            return result(0, prior.n_samples)
        run = logs.run_row(header, path, sha256, size, stamp)
        with self.write() as con:
            have = {
                (sid, ep)
                for sid, ep in con.execute(
                    "SELECT sample_id, epoch FROM wh.samples WHERE run_id = ?", [run.run_id]
                ).fetchall()
            }
            if stored is None:
                # a new run: its row names this file from the start (partial until done)
                self._upsert_run(con, run, "partial")
        # A run already stored keeps its row (which file, its state) until this file has been
        # read without a fault: a damaged copy adds what it can and changes nothing else.

        added, total = 0, None
        bad: list[logs.BadSample] = []
        try:
            batches = logs.iter_sample_columns(
                path, header, run.run_id, have, batch_size=batch_size, fast=direct_read,
                limits=limits,
            )  # fmt: skip
            server = logs.server_of(header)
            for samples, messages, last, batch_bad, recorded, batch_cancelled in prefetch(
                (*c.tables(server), c.last, c.bad, c.recorded, c.cancelled) for c in batches
            ):
                bad.extend(batch_bad)
                cancelled += batch_cancelled
                completes = last and not bad
                if not samples.num_rows and not completes:
                    continue  # nothing to write (e.g. a damaged copy of a stored log)
                with self.write() as con:
                    added += _append_samples(con, samples, messages)
                    if recorded:  # the scores the log holds: history (warehouse.recorded_scores)
                        _append_recorded(con, header, run.run_id, recorded)
                    # a batch known to be the log's last also completes the run: one
                    # transaction (a connect and a checkpoint) fewer per log
                    if completes:
                        self._upsert_run(con, run, "complete")
                        total = _count_samples(con, run.run_id)
                    else:
                        _refresh_run_counts(con, run.run_id)
                if bar is not None:
                    bar[0].update(bar[1], description=f"ingest {Path(path).name}: {added}")
        except logs.LogReadError as exc:
            # e.g. past the log's inflate limit: what was read is stored, the run stays partial
            with self.read() as con:
                total = _count_samples(con, run.run_id)
            lines = tuple(b.line(path) for b in bad)
            return IngestResult(
                path, spec.eval_id, spec.task, spec.model, header.status, added, total,
                str(exc), lines,
            )  # fmt: skip

        if bad:
            with self.read() as con:
                total = _count_samples(con, run.run_id)
            refused = sum(b.refused for b in bad)
            what = f"{len(bad)} unreadable sample(s)"
            if refused:  # over the inflate limits (warehouse.inflate)
                kind = "refused" if refused == len(bad) else "unreadable or refused"
                what = f"{len(bad)} {kind} sample(s)"
            if stored is not None:
                error = (
                    f"{path}: {what}; {added} new sample(s) stored, "
                    f"nothing else changed (the run keeps {stored.path}, {stored.state})"
                )
            else:
                fix = "ingest an undamaged copy of the log to complete it"
                if refused:
                    fix = "if they are genuine, raise the limit named above and ingest it again"
                error = f"{path}: {what}; {total} stored, the run stays partial: {fix}"
            lines = tuple(b.line(path) for b in bad)
            return IngestResult(
                path, spec.eval_id, spec.task, spec.model, header.status, added, total, error,
                lines, cancelled,
            )  # fmt: skip
        if total is None:
            with self.write() as con:
                self._upsert_run(con, run, "complete")
                total = _count_samples(con, run.run_id)
        return result(added, total)

    def _in_already(self, path: str, limits: InflateLimits) -> IngestResult | None:
        """The no-op result for a local `.eval` log stored complete whose file its stat proves
        unchanged, decided from the archive's header member alone: a re-run over logs already
        in (`gradebook score` after a sweep) does not import Inspect for nothing. None: read
        the log the whole way (which also words any error)."""
        if not path.endswith(".eval"):
            return None
        stamp = log_stamps.stamp(path)  # before the header: it vouches only for what is read after
        if stamp is None:
            return None
        from warehouse.zip_members import header_json

        raw = header_json(path, limits)
        spec = raw.get("eval") if raw is not None else None
        run_id = spec.get("eval_id") if isinstance(spec, dict) else None
        if not isinstance(run_id, str) or not run_id:
            return None
        stored = self._stored_run(run_id)
        if stored is None or stored.state != "complete":
            return None
        if not log_stamps.proves_unchanged(stored.stamp, stamp):
            return None
        return IngestResult(
            path, run_id, spec.get("task"), spec.get("model"), raw.get("status"),  # type: ignore[union-attr]
            0, stored.n_samples,
        )  # fmt: skip

    def _stored_run(self, run_id: str) -> _StoredRun | None:
        if not self.path.exists():
            return None
        with self.read() as con:
            row = one(
                con.execute(
                    "SELECT log_sha256, log_size, ingest_state, n_samples, log_mtime_ns, "
                    "log_inode, epoch_us(log_seen_at), log_path FROM wh.runs WHERE run_id = ?",
                    [run_id],
                )
            )
        if row is None:
            return None
        sha256, size, state, n_samples, mtime_ns, inode, seen_us, log_path = row
        stamp = log_stamps.LogStamp.from_row(size, mtime_ns, inode, seen_us)
        return _StoredRun(sha256, size, state, n_samples or 0, stamp, log_path)

    def _remember_stamp(self, run_id: str, sha256: str, stamp: log_stamps.LogStamp) -> None:
        """Record that `stamp` vouches for the stored sha256, so the next re-ingest of the file
        skips the hash (a log ingested within RACY_WINDOW_NS of its last write, or touched).

        Only a cache: it never waits for the write lock (a reader elsewhere keeps the no-op
        lock-free) and is skipped when the lock is taken; the next hashed no-op tries again.
        """
        try:
            con = connect(self.path, read_only=False, timeout_s=0)
        except WarehouseError:  # locked, or not writable: the next real write says so
            return
        try:
            self._ensure_schema(con)
            values = stamp.columns()
            # guarded on the sha256: another process may have re-ingested since we read the row
            con.execute(
                f"UPDATE wh.runs SET {', '.join(f'{k} = ?' for k in values)} "
                "WHERE run_id = ? AND log_sha256 = ? AND log_size = ? AND ingest_state = 'complete'",
                [*values.values(), run_id, sha256, stamp.size],
            )
        finally:
            con.close()

    def _upsert_run(self, con: duckdb.DuckDBPyConnection, run: logs.RunRow, state: str) -> None:
        first = one(
            con.execute("SELECT first_ingested_at FROM wh.runs WHERE run_id = ?", [run.run_id])
        )
        con.execute("DELETE FROM wh.runs WHERE run_id = ?", [run.run_id])
        values = dict(run.values, ingest_state=state, n_samples=0, n_errors=0)
        names = list(values)
        con.execute(
            f"INSERT INTO wh.runs ({', '.join(names)}, first_ingested_at, ingested_at) "
            f"VALUES ({', '.join('?' for _ in names)}, coalesce(?, now()), now())",
            [*values.values(), first[0] if first else None],
        )
        _refresh_run_counts(con, run.run_id, state)

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

        Returns:
            The samples with no score row for (scorer, digest), and with `retry` the retryable
            ones; `attempt` is the attempt number their grading must be written as.
        """
        if not self.path.exists() or (run_ids is not None and not run_ids):
            return SAMPLES_TO_SCORE_SCHEMA.empty_table()
        sql, params = _to_score_sql(
            scorer, digest, run_ids, retry, max_attempt, skip_reasons, state
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
        stored and unscored with a retryable reason; otherwise it is skipped, so a scored row
        or a generation error is never superseded.

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
        state_col, runs_join = STATE_JSON_SQL, "LEFT JOIN wh.runs r ON r.run_id = s.run_id"
    if retry is not None:
        retryable = _retryable_sql(retry, params)
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
            WHERE (c.attempt IS NULL
                   OR (c.status = 'unscored' AND {retryable} AND s.error IS NULL))
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
        # retries only supersede a stored retryable unscored attempt (see write_scores); the
        # check costs a join only for a batch that holds retries
        retries = pc.max(table.column("attempt")).as_py() > 1
        only_valid_retries = (
            f"""
              AND (b.attempt = 1 OR EXISTS (
                SELECT 1 FROM wh.scores p
                WHERE p.run_id = b.run_id AND p.sample_id = b.sample_id AND p.epoch = b.epoch
                  AND p.scorer = b.scorer AND p.fingerprint = b.fingerprint
                  AND p.attempt = b.attempt - 1 AND p.status = 'unscored'
                  AND p.reason IN ({", ".join(f"'{r}'" for r in RETRYABLE_REASONS)})
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


def _append_recorded(
    con: duckdb.DuckDBPyConnection, header: Any, run_id: str, recorded: list[Any]
) -> None:
    # imported here: it reads Inspect's models, which `gradebook sql` never needs
    import warehouse.recorded_scores as recorded_scores

    scorers = recorded_scores.recorded_scorers(header, (r[2] for r in recorded))
    recorded_scores.register_recorded(con, scorers.values())
    created = next(iter(scorers.values())).first_seen
    table = recorded_scores.recorded_table(run_id, recorded, scorers, created)
    if table.num_rows:
        _append_scores(con, table)


def _append_samples(con: duckdb.DuckDBPyConnection, samples: pa.Table, messages: pa.Table) -> int:
    con.register("_incoming_samples", samples)
    con.register("_incoming_messages", messages)
    try:
        # messages first: the anti-join against wh.samples then still sees these samples as new
        con.execute(
            """
            INSERT INTO wh.messages SELECT * FROM _incoming_messages m
            WHERE NOT EXISTS (
                SELECT 1 FROM wh.samples s
                WHERE s.run_id = m.run_id AND s.sample_id = m.sample_id AND s.epoch = m.epoch
            )
            """
        )
        inserted = one(
            con.execute(
                """
            INSERT INTO wh.samples SELECT * FROM (
                SELECT DISTINCT ON (run_id, sample_id, epoch) * FROM _incoming_samples
            ) b
            WHERE NOT EXISTS (
                SELECT 1 FROM wh.samples s
                WHERE s.run_id = b.run_id AND s.sample_id = b.sample_id AND s.epoch = b.epoch
            )
            """
            )
        )
        return int(inserted[0]) if inserted else 0
    finally:
        con.unregister("_incoming_samples")
        con.unregister("_incoming_messages")


def _refresh_run_counts(
    con: duckdb.DuckDBPyConnection, run_id: str, state: str | None = None
) -> None:
    """Recount the run's samples; set its ingest state too, unless None (kept)."""
    con.execute(
        """
        UPDATE wh.runs SET
            n_samples = (SELECT count(*) FROM wh.samples WHERE run_id = $1),
            n_errors = (SELECT count(*) FROM wh.samples WHERE run_id = $1 AND error IS NOT NULL),
            ingest_state = coalesce($2, ingest_state),
            ingested_at = now()
        WHERE run_id = $1
        """,
        [run_id, state],
    )


def _count_samples(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    return _scalar(con, "SELECT count(*) FROM wh.samples WHERE run_id = ?", [run_id])


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> int:
    row = one(con.execute(sql, params or []))
    return int(row[0]) if row and row[0] is not None else 0
