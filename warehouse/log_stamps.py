"""When a re-ingest may trust a log file's stat instead of hashing it.

Why: the re-ingest of a log that is already in is a no-op, but proving it by sha256 reads the whole
log (tens of MB for a large eval), on every `gradebook score` / `rescore` /
sweep re-run, before any grading starts. A local file whose size, mtime (ns) and inode are the
ones recorded when its sha256 was taken holds the same bytes, with one exception that git's index
handles the same way ("racy" entries): a write within the timestamp granularity of the recorded
mtime can change the content without moving the mtime. So a stamp vouches for the content only
when its mtime was at least RACY_WINDOW_NS older than the moment of the stat, and the stat is
taken before the hash, so every later write moves the mtime away from the recorded one.

The inode tells apart a file replaced by another one (write a copy, rename it over the log) that
kept the size and mtime, as `cp -p` / `rsync -t` into a temporary file would. Remote logs have no
stamp and are always hashed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# Coarser than the mtime granularity of any filesystem a log lives on (FAT's is 2 s).
RACY_WINDOW_NS = 2_000_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

LOG_STAMP_SQL = """
ALTER TABLE wh.runs ADD COLUMN log_mtime_ns BIGINT;
ALTER TABLE wh.runs ADD COLUMN log_inode UBIGINT;
ALTER TABLE wh.runs ADD COLUMN log_seen_at TIMESTAMPTZ;

-- the view lists wh.runs' columns as they were when it was created
CREATE OR REPLACE VIEW runs AS SELECT * FROM wh.runs;
"""


@dataclass(frozen=True)
class LogStamp:
    """A local log file's stat, and when it was taken (`seen_ns`, wall clock)."""

    size: int
    mtime_ns: int
    inode: int
    seen_ns: int

    @property
    def racy(self) -> bool:
        """The file may have been written again without its mtime moving since the stat."""
        return self.mtime_ns > self.seen_ns - RACY_WINDOW_NS

    def same_file(self, other: LogStamp) -> bool:
        return (self.size, self.mtime_ns, self.inode) == (other.size, other.mtime_ns, other.inode)

    def columns(self) -> dict[str, object]:
        """The `wh.runs` values that record this stamp."""
        return {
            "log_mtime_ns": self.mtime_ns,
            "log_inode": self.inode,
            # truncated to DuckDB's microseconds: earlier, so never less racy than the truth
            "log_seen_at": _EPOCH + timedelta(microseconds=self.seen_ns // 1000),
        }

    @classmethod
    def from_row(
        cls, size: int | None, mtime_ns: int | None, inode: int | None, seen_us: int | None
    ) -> LogStamp | None:
        """The stamp stored with a run (`log_size`, `log_mtime_ns`, `log_inode`,
        `epoch_us(log_seen_at)`), or None when none was recorded."""
        if size is None or mtime_ns is None or inode is None or seen_us is None:
            return None
        return cls(size, mtime_ns, inode, seen_us * 1000)


NO_STAMP: dict[str, object] = {"log_mtime_ns": None, "log_inode": None, "log_seen_at": None}


def stamp(path: str) -> LogStamp | None:
    """The stamp of a local log, taken now; None for a URL or a path that cannot be stat'ed
    (the caller hashes it, and that reports the error)."""
    if "://" in path:
        return None
    seen = time.time_ns()  # before the stat, so `racy` errs towards hashing
    try:
        st = os.stat(path)
    except OSError:
        return None
    return LogStamp(st.st_size, st.st_mtime_ns, st.st_ino, seen)


def proves_unchanged(recorded: LogStamp | None, now: LogStamp | None) -> bool:
    """Whether the file stamped `now` is provably the one whose sha256 was recorded with
    `recorded`, so hashing it again is unnecessary."""
    return (
        recorded is not None and now is not None and not recorded.racy and recorded.same_file(now)
    )
