"""Ingest: Inspect logs into the warehouse, idempotent, a grown log adding only its new samples.

The `Warehouse`'s ingest methods (`Warehouse.ingest_logs`), kept apart from its connection and
score handling: a mixin over the same file, locks and short transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

import warehouse.log_copies as log_copies
import warehouse.log_spill as log_spill
import warehouse.log_stamps as log_stamps
from warehouse.connection import (
    WarehouseError,
    connect,
    one,
)
from warehouse.inflate import InflateLimits
from warehouse.prefetch import prefetch
from warehouse.score_inserts import _append_scores, _scalar

if TYPE_CHECKING:
    import warehouse.logs as logs


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
    copy_known: bool = False  # the location read now is recorded with the stored bytes


class Ingest:
    """Ingesting logs (mixed into `warehouse.store.Warehouse`, which gives it `path`, `read()`,
    `write()` and `_ensure_schema()`)."""

    path: Path

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
        # logs in object storage: the next one is fetched while this one is read
        log_spill.expect([str(p) for p in paths])
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
        stored = self._stored_run(spec.eval_id, path)
        prior = stored if stored is not None and stored.state == "complete" else None
        # (not complete: an interrupted or damaged ingest, finished whatever the file says)
        if prior is not None and log_stamps.proves_unchanged(prior.stamp, stamp):
            if not prior.copy_known:  # the same file under another name (moved, linked)
                self._record_copy(spec.eval_id, path, prior.sha256, prior.size)
            return result(0, prior.n_samples)
        try:
            sha256, size = logs.file_digest(path)
        except logs.LogReadError as exc:
            return IngestResult(path, None, None, None, None, 0, 0, str(exc))
        if stamp is not None and stamp.size != size:
            stamp = None  # written while it was hashed: this stat is not of the bytes hashed
        if prior is not None and (prior.sha256, prior.size) == (sha256, size):
            if not prior.copy_known:  # a copy of the stored log, seen here for the first time
                self._record_copy(spec.eval_id, path, sha256, size)
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
        stored = self._stored_run(run_id, path)
        if stored is None or stored.state != "complete" or not stored.copy_known:
            return None
        if not log_stamps.proves_unchanged(stored.stamp, stamp):
            return None
        return IngestResult(
            path, run_id, spec.get("task"), spec.get("model"), raw.get("status"),  # type: ignore[union-attr]
            0, stored.n_samples,
        )  # fmt: skip

    def _stored_run(self, run_id: str, path: str) -> _StoredRun | None:
        """The run's stored row, and whether `path` is recorded as a copy of its bytes."""
        if not self.path.exists():
            return None
        with self.read() as con:
            row = one(
                con.execute(
                    "SELECT log_sha256, log_size, ingest_state, n_samples, log_mtime_ns, "
                    f"log_inode, epoch_us(log_seen_at), log_path, {log_copies.KNOWN_SQL} "
                    "FROM wh.runs WHERE run_id = ?",
                    [log_copies.location_of(path), run_id],
                )
            )
        if row is None:
            return None
        sha256, size, state, n_samples, mtime_ns, inode, seen_us, log_path, known = row
        stamp = log_stamps.LogStamp.from_row(size, mtime_ns, inode, seen_us)
        return _StoredRun(sha256, size, state, n_samples or 0, stamp, log_path, bool(known))

    def _record_copy(self, run_id: str, path: str, sha256: str | None, size: int | None) -> None:
        """Record a location where the stored log was seen (warehouse.log_copies): a real
        record, so it waits for the write lock as any write does."""
        if sha256 is None:
            return
        with self.write() as con:
            log_copies.record_copy(con, run_id, path, sha256, size)

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
        if state == "complete":  # every sample of this file is in: a copy of the run's log
            log_copies.record_copy(
                con, run.run_id, run.values["log_path"], run.values["log_sha256"],
                run.values["log_size"],
            )  # fmt: skip


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
