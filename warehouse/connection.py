"""Opening the DuckDB file under its one-writer lock.

DuckDB lets one process hold a file read-write and refuses every other process, even read-only
ones, with "Could not set lock on file ... (PID n)". Writers therefore hold the file only for a
short transaction, and every opener retries briefly before giving up with the holder's PID.

gradebook attaches the file under one fixed catalog name, CATALOG, rather than opening it as
DuckDB's default database: that one is named after the file, and a file called `wh.duckdb`
(or `information_schema.duckdb`) then names a catalog that clashes with the `wh` schema the
tables live in ("Ambiguous reference to catalog or schema"). Under CATALOG every file name
works, and the file itself is unchanged (no migration).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import time
from pathlib import Path

import duckdb

DEFAULT_LOCK_TIMEOUT_S = 5.0
CATALOG = "gradebook"
LOCK_TIMEOUT_ENV = "GRADEBOOK_LOCK_TIMEOUT"
_PID = re.compile(r"PID (\d+)")
# What the operating system said when DuckDB could not write or open the file, as DuckDB words
# it ("... : No space left on device"): the cause a user can act on.
_OS_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.ENOENT: "no such directory",
    errno.EISDIR: "it is a directory",
}
_FIXES = {
    errno.ENOSPC: "free some space, or pass --db a file on another disk",
    errno.EDQUOT: "free some space, or pass --db a file on another disk",
    errno.EROFS: "pass --db a file on a writable file system",
    errno.EACCES: "fix its permissions, or pass --db a file you can write",
    errno.ENOENT: "create the directory, or pass --db another path",
    errno.EISDIR: "pass --db the path of a file",
}


class WarehouseError(Exception):
    """A warehouse the command cannot use as asked; the message is one line naming the file
    and what to do (the CLI prints it and exits 2)."""


def default_lock_timeout() -> float:
    """Seconds an open waits for another process's lock: env GRADEBOOK_LOCK_TIMEOUT (every
    command honours it), else DEFAULT_LOCK_TIMEOUT_S; a value that is not a number >= 0 is
    ignored."""
    try:
        value = float(os.environ.get(LOCK_TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT_S
    return value if value >= 0 else DEFAULT_LOCK_TIMEOUT_S


class WarehouseLocked(WarehouseError, RuntimeError):
    """Another process holds the database's lock for longer than we were willing to wait."""

    def __init__(self, path: Path, pid: int | None, waited_s: float) -> None:
        holder = f"process {pid}{_describe(pid)}" if pid else "another process"
        super().__init__(
            f"{path} is locked by {holder} (waited {waited_s:.1f}s): retry when it finishes, "
            f"or query a copy of the file"
        )
        self.path = path
        self.pid = pid


class WarehouseUnusable(WarehouseError, OSError):
    """The file cannot be opened or written: not a DuckDB file, a full disk, a read-only file
    system, a missing directory. `.os_errno` is the operating system's error when known."""

    def __init__(self, message: str, os_errno: int | None = None) -> None:
        super().__init__(message)
        self.os_errno = os_errno

    def __str__(self) -> str:
        return str(self.args[0])


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


def os_errno_of(exc: BaseException) -> int | None:
    """The OS error behind a DuckDB (or OS) error, from its message when DuckDB wrapped it."""
    if isinstance(exc, OSError) and exc.errno in _OS_CAUSES:
        return exc.errno
    text = str(exc)
    for code in _OS_CAUSES:
        if os.strerror(code) in text:
            return code
    return None


def os_cause(exc: BaseException) -> str | None:
    """The OS error behind `exc` in a few words ("no space left on device"), or None."""
    code = os_errno_of(exc)
    return None if code is None else _OS_CAUSES[code]


def unusable(path: Path, exc: BaseException, *, doing: str) -> WarehouseUnusable:
    """One line for a DuckDB or OS error that stopped `doing` ("open", "open for writing",
    "write") the warehouse at `path`."""
    code = os_errno_of(exc)
    if code is not None:
        verb, _, rest = doing.partition(" ")
        # a failed write is rolled back: say so, the user's worry is the history already there
        kept = "; what it held before is kept" if verb == "write" and path.exists() else ""
        return WarehouseUnusable(
            f"{path}: cannot {verb} the warehouse{' ' + rest if rest else ''}: "
            f"{_OS_CAUSES[code]}{kept}; {_FIXES[code]}",
            code,
        )
    text = " ".join(str(exc).split())
    if "not a valid DuckDB database file" in text:
        return WarehouseUnusable(
            f"{path}: not a DuckDB database file: pass --db a gradebook warehouse, "
            "or a new file name to start one"
        )
    return WarehouseUnusable(
        f"{path}: DuckDB cannot {doing} it ({text[:200] or type(exc).__name__}): pass --db "
        "another file"
    )


def connect(
    path: Path, *, read_only: bool, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> duckdb.DuckDBPyConnection:
    """Connect, retrying with backoff while another process holds the lock.

    The file is attached as catalog CATALOG and made the default, so queries name its tables
    and views as usual whatever the file is called.

    Raises:
        WarehouseLocked: the lock was still held after `timeout_s` seconds.
        WarehouseUnusable: the file is not a DuckDB database, or cannot be opened (a missing
            directory, a read-only file system, ...).
    """
    path = Path(path)
    start = time.monotonic()
    delay = 0.02
    attach = f"ATTACH IF NOT EXISTS '{sql_str(path)}' AS {CATALOG}" + (
        " (READ_ONLY)" if read_only else ""
    )
    # One named in-memory database per (file, mode) in this process: connections opened while
    # another is open share it and its attachment, as DuckDB shares the database of a file
    # opened twice (a second, separate attachment of the same file is refused). When the last
    # connection closes, the file is detached and its lock released.
    mode = "ro" if read_only else "rw"
    resolved = path.resolve()
    key = hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
    while True:
        # spills go where DuckDB puts them for a database file: next to it, not into the cwd
        con = duckdb.connect(
            f":memory:gradebook-{mode}-{key}", config={"temp_directory": f"{resolved}.tmp"}
        )
        try:
            con.execute(attach)
            con.execute(f"USE {CATALOG}")
            return con
        except duckdb.Error as exc:
            con.close()
            if not (isinstance(exc, duckdb.IOException) and _is_lock_error(exc)):
                raise unusable(
                    path, exc, doing="open" if read_only else "open for writing"
                ) from None
            waited = time.monotonic() - start
            if waited >= timeout_s:
                match = _PID.search(str(exc))
                raise WarehouseLocked(
                    path, int(match.group(1)) if match else None, waited
                ) from None
            time.sleep(min(delay, max(timeout_s - waited, 0.01)))
            delay = min(delay * 2, 0.25)


def sql_str(path: Path | str) -> str:
    """`path` inside a single-quoted SQL string literal."""
    return str(path).replace("'", "''")


def one(result: duckdb.DuckDBPyConnection) -> tuple | None:
    """The first row of an executed query, fully consuming the result.

    DuckDB 2.0 refuses further `con.sql(...)` on a connection whose last `execute()` result was
    not read to the end, and `fetchone()` does not finish it.
    """
    rows = result.fetchall()
    return rows[0] if rows else None
