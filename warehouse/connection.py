"""Opening the DuckDB file under its one-writer lock.

DuckDB lets one process hold a file read-write and refuses every other process, even read-only
ones, with "Could not set lock on file ... (PID n)". Writers therefore hold the file only for a
short transaction, and every opener retries briefly before giving up with the holder's PID.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import duckdb

DEFAULT_LOCK_TIMEOUT_S = 5.0
LOCK_TIMEOUT_ENV = "GRADEBOOK_LOCK_TIMEOUT"
_PID = re.compile(r"PID (\d+)")


def default_lock_timeout() -> float:
    """Seconds an open waits for another process's lock: env GRADEBOOK_LOCK_TIMEOUT (every
    command honours it), else DEFAULT_LOCK_TIMEOUT_S; a value that is not a number >= 0 is
    ignored."""
    try:
        value = float(os.environ.get(LOCK_TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT_S
    return value if value >= 0 else DEFAULT_LOCK_TIMEOUT_S


class WarehouseLocked(RuntimeError):
    """Another process holds the database's lock for longer than we were willing to wait."""

    def __init__(self, path: Path, pid: int | None, waited_s: float) -> None:
        holder = f"process {pid}{_describe(pid)}" if pid else "another process"
        super().__init__(
            f"{path} is locked by {holder} (waited {waited_s:.1f}s): retry when it finishes, "
            f"or query a copy of the file"
        )
        self.path = path
        self.pid = pid


def _describe(pid: int | None) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    # one line whatever the command line holds (a `python -c` script has newlines)
    cmd = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    return f" ({cmd[:80]})" if cmd else ""


def _is_lock_error(exc: duckdb.Error) -> bool:
    text = str(exc)
    return "Could not set lock" in text or "Conflicting lock" in text


def connect(
    path: Path, *, read_only: bool, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> duckdb.DuckDBPyConnection:
    """Connect, retrying with backoff while another process holds the lock.

    Raises:
        WarehouseLocked: the lock was still held after `timeout_s` seconds.
    """
    start = time.monotonic()
    delay = 0.02
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise
            waited = time.monotonic() - start
            if waited >= timeout_s:
                match = _PID.search(str(exc))
                raise WarehouseLocked(
                    path, int(match.group(1)) if match else None, waited
                ) from None
            time.sleep(min(delay, max(timeout_s - waited, 0.01)))
            delay = min(delay * 2, 0.25)


def one(result: duckdb.DuckDBPyConnection) -> tuple | None:
    """The first row of an executed query, fully consuming the result.

    DuckDB 2.0 refuses further `con.sql(...)` on a connection whose last `execute()` result was
    not read to the end, and `fetchone()` does not finish it.
    """
    rows = result.fetchall()
    return rows[0] if rows else None
