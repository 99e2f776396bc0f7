"""Bounded inflation of `.eval` members: a log from elsewhere cannot make ingest inflate
gigabytes (a zip bomb: a 1.5 MB archive whose one member inflates to 1.5 GB of whitespace).

Every member gradebook reads is inflated by `inflate` in chunks, and refused while streaming,
never after: past `InflateLimits.member_bytes`, or past `RATIO_FLOOR` bytes at more than
`InflateLimits.ratio` times the compressed bytes read so far; and a log stops once the members
read from it add up to `InflateLimits.log_bytes` (`LogBudget`). What a member's central
directory entry declares is checked first (`check_declared`), so an honest bomb costs no
inflation at all; a lying one is caught by the streaming checks. The same checks run over
the members Inspect's own reader is about to read (older Inspect versions' logs), since that
reader inflates a member whole.

The limits come from the environment (`GRADEBOOK_MAX_MEMBER_MB`, `GRADEBOOK_MAX_LOG_MB`,
`GRADEBOOK_MAX_INFLATE_RATIO`: every command honours them; the `--max-...` flags and a sweep
config's `[ingest]` table set them), else the defaults, which docs/design/ingest.md explains.
No Inspect import: headers are read through this before Inspect is loaded.
"""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from dataclasses import dataclass, replace
from typing import Any

import zstandard

__all__ = [
    "DEFAULT_LOG_MB",
    "DEFAULT_MEMBER_MB",
    "DEFAULT_RATIO",
    "ENV_LOG_MB",
    "ENV_MEMBER_MB",
    "ENV_RATIO",
    "InflateLimits",
    "InflateRefused",
    "LogBudget",
    "LogTooBig",
    "check_declared",
    "inflate",
]

MB = 1 << 20
DEFAULT_MEMBER_MB = 1024
DEFAULT_LOG_MB = 64 * 1024
DEFAULT_RATIO = 100.0
# Below this many inflated bytes a member's ratio is not checked: degenerate model output
# ("!!!!..." to max_tokens) is legitimately compressible hundreds of times, but never this much.
RATIO_FLOOR = 16 * MB

ENV_MEMBER_MB = "GRADEBOOK_MAX_MEMBER_MB"
ENV_LOG_MB = "GRADEBOOK_MAX_LOG_MB"
ENV_RATIO = "GRADEBOOK_MAX_INFLATE_RATIO"

ZIP_ZSTD = 93  # the zip method id Inspect's writer (zipfile-zstd) uses
_CHUNK = MB  # inflated bytes produced per step
_READ = 64 << 10  # compressed bytes read per step


class InflateRefused(Exception):
    """A member that would inflate past a limit (one line: what, the limit, how to raise it)."""


class LogTooBig(InflateRefused):
    """The members read from one log add up to more than `InflateLimits.log_bytes`."""


@dataclass(frozen=True)
class InflateLimits:
    """How far a log's members may inflate.

    Attributes:
        member_bytes: the most one member may inflate to (a `.json` log counts as one member:
            it is read whole).
        log_bytes: the most all the members read from one log may inflate to, together.
        ratio: past RATIO_FLOOR inflated bytes, the most a member may inflate per compressed
            byte read.
    """

    member_bytes: int = DEFAULT_MEMBER_MB * MB
    log_bytes: int = DEFAULT_LOG_MB * MB
    ratio: float = DEFAULT_RATIO

    @classmethod
    def from_env(cls, base: InflateLimits | None = None) -> InflateLimits:
        """`base` (default: the defaults) with each limit the environment sets instead; a value
        that is not a number above 0 is ignored (the flags that set them check their input)."""
        limits = base or cls()
        member, log, ratio = (_env_number(name) for name in (ENV_MEMBER_MB, ENV_LOG_MB, ENV_RATIO))
        if member is not None:
            limits = replace(limits, member_bytes=int(member * MB))
        if log is not None:
            limits = replace(limits, log_bytes=int(log * MB))
        if ratio is not None:
            limits = replace(limits, ratio=ratio)
        return limits

    def budget(self) -> LogBudget:
        return LogBudget(self)


def _env_number(name: str) -> float | None:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


class LogBudget:
    """The inflated bytes one log's reads have used, against `limits.log_bytes`."""

    def __init__(self, limits: InflateLimits) -> None:
        self.limits = limits
        self.inflated = 0
        self._zstd: zstandard.ZstdDecompressor | None = None

    def zstd(self) -> zstandard.ZstdDecompressor:
        """A decompressor for this log's small members (one: making one costs more than a
        small member's inflation)."""
        if self._zstd is None:
            self._zstd = zstandard.ZstdDecompressor()
        return self._zstd

    def spend(self, n: int, what: str) -> None:
        self.inflated += n
        if self.inflated > self.limits.log_bytes:
            raise LogTooBig(
                f"its members inflate past the {_size(self.limits.log_bytes)} limit per log "
                f"(at {what}); raise --max-log-mb ({ENV_LOG_MB}) if the log is genuine"
            )


def check_declared(info: zipfile.ZipInfo, limits: InflateLimits) -> None:
    """Refuse a member by the sizes its central directory entry declares (no inflation).

    Raises:
        InflateRefused: one line naming the member.
    """
    if info.file_size > limits.member_bytes:
        raise InflateRefused(_too_big(info.filename, info.file_size, limits, declared=True))
    if info.file_size > RATIO_FLOOR and info.file_size > limits.ratio * max(info.compress_size, 1):
        raise InflateRefused(
            _too_compressed(info.filename, info.file_size, info.compress_size, limits, True)
        )


def inflate(
    f: Any, info: zipfile.ZipInfo, budget: LogBudget, *, keep: bool = True
) -> bytes | bytearray:
    """A member's inflated bytes (Zstandard, deflate or stored: what Inspect writes), checked
    against `budget`'s limits while they stream and against the member's CRC at the end.

    Args:
        f: the archive, open for binary reading and seekable.
        info: the member's central directory entry (`header_offset`, sizes, CRC).
        budget: the log's budget; the member's inflated size is spent from it.
        keep: False only checks (returns b""): what is inflated is dropped chunk by chunk.

    Raises:
        InflateRefused: past a limit (LogTooBig: the log's); one line naming the member.
        zipfile.BadZipFile: a bad local header, a CRC mismatch, an unknown method.
        zstandard.ZstdError, zlib.error: the member's bytes do not decompress.
    """
    limits = budget.limits
    check_declared(info, limits)
    source = _Compressed(f, info)
    if info.file_size <= _CHUNK and info.compress_size <= _CHUNK:
        # the common sample member, a few KB: inflated in one call, bounded by what its entry
        # declares (which check_declared accepted); anything unexpected streams below instead
        small = _inflate_small(source, info, budget)
        if small is not None:
            budget.spend(len(small), info.filename)
            return small if keep else b""
        source = _Compressed(f, info)
    inflated = bytearray()  # grown in place: no second copy of a big member at the end
    crc, size = 0, 0
    for chunk in _stream(source, info.compress_type):
        size += len(chunk)
        if size > limits.member_bytes:
            raise InflateRefused(_too_big(info.filename, size, limits, declared=False))
        if size > RATIO_FLOOR and size > limits.ratio * max(source.read_bytes, 1):
            raise InflateRefused(_too_compressed(info.filename, size, source.read_bytes, limits))
        budget.spend(len(chunk), info.filename)
        crc = zlib.crc32(chunk, crc)
        if keep:
            inflated += chunk
    if crc != info.CRC:
        raise zipfile.BadZipFile(f"CRC mismatch in {info.filename}")
    return inflated


_LOCAL_HEADER_SIZE = 30


class _Compressed(io.RawIOBase):
    """A member's stored bytes, read from the archive in place; counts what has been read."""

    def __init__(self, f: Any, info: zipfile.ZipInfo) -> None:
        f.seek(info.header_offset)
        header = f.read(_LOCAL_HEADER_SIZE)
        if len(header) != _LOCAL_HEADER_SIZE or header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"bad local header for {info.filename}")
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
        if f.read(name_len) != info.filename.encode():
            raise zipfile.BadZipFile(f"bad local header for {info.filename}")
        self._f = f
        self._at = info.header_offset + _LOCAL_HEADER_SIZE + name_len + extra_len
        self._left = info.compress_size
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._left)
        if n <= 0:
            return 0
        self._f.seek(self._at)  # the archive's position is shared with other readers
        data = self._f.read(n)
        buffer[: len(data)] = data
        self._at += len(data)
        self._left -= len(data)
        self.read_bytes += len(data)
        return len(data)


def _inflate_small(source: _Compressed, info: zipfile.ZipInfo, budget: LogBudget) -> bytes | None:
    """A small member inflated in one call, or None: not exactly the size and CRC its entry
    declares (a lying entry, a multi-frame or damaged member), or a method this does not do."""
    data = source.read(info.compress_size)
    size = info.file_size
    try:
        if info.compress_type == ZIP_ZSTD:
            # a frame header that states its size is decoded to that size, whatever the bound
            if zstandard.frame_content_size(data) not in (size, -1):
                return None
            out = budget.zstd().decompress(data, max_output_size=size)
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            inflater = zlib.decompressobj(-15)
            out = inflater.decompress(data, size + 1)
            if not inflater.eof:
                return None
        elif info.compress_type == zipfile.ZIP_STORED:
            out = data
        else:
            return None
    except (zstandard.ZstdError, zlib.error):
        return None
    return out if len(out) == size and zlib.crc32(out) == info.CRC else None


def _stream(source: _Compressed, method: int) -> Any:
    """The member's inflated bytes, at most _CHUNK at a time whatever the input holds."""
    if method == ZIP_ZSTD:
        # read_across_frames: Inspect writes a big member as several frames
        reader = zstandard.ZstdDecompressor().stream_reader(
            source, read_size=_READ, read_across_frames=True, closefd=False
        )
        while chunk := reader.read(_CHUNK):
            yield chunk
    elif method == zipfile.ZIP_DEFLATED:
        inflater = zlib.decompressobj(-15)
        while not inflater.eof:
            data = inflater.unconsumed_tail or source.read(_READ)
            if not data:
                raise zlib.error("the deflate stream ends early")
            chunk = inflater.decompress(data, _CHUNK)
            if chunk:
                yield chunk
    elif method == zipfile.ZIP_STORED:
        while chunk := source.read(_CHUNK):
            yield chunk
    else:
        raise zipfile.BadZipFile(f"unsupported compression {method}")


def _size(n: float) -> str:
    return f"{n / MB:,.0f} MB" if n >= MB else f"{n / 1024:,.1f} KB"


def _too_big(name: str, size: int, limits: InflateLimits, *, declared: bool) -> str:
    says = f"declares {_size(size)} inflated, over" if declared else "inflates past"
    return (
        f"{name} {says} the {_size(limits.member_bytes)} limit per member; raise "
        f"--max-member-mb ({ENV_MEMBER_MB}) if the log is genuine"
    )


def _too_compressed(
    name: str, size: int, compressed: int, limits: InflateLimits, declared: bool = False
) -> str:
    says = f"declares {_size(size)} inflated" if declared else f"inflates to {_size(size)}"
    return (
        f"{name} {says} from {_size(compressed)}, over {limits.ratio:g}x (a zip bomb?); "
        f"raise --max-inflate-ratio ({ENV_RATIO}) if the log is genuine"
    )
