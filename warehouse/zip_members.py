"""Members of a local zip archive (a `.eval` log) read without opening it with `zipfile`.

`zipfile` parses every central-directory entry (0.1-0.2 s for a 20,000-sample log, more for a
ZIP64 one); the few entries a reader needs are found by searching the directory's bytes. No
Inspect import: a command reads a log's header this way before it has loaded Inspect
(`header_json`).
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from typing import Any

import zstandard

from warehouse.inflate import ZIP_ZSTD, InflateLimits, InflateRefused, LogBudget, inflate

__all__ = ["ZIP_ZSTD", "central_entries", "header_json", "header_member", "member_data"]

_CENTRAL_ENTRY = struct.Struct("<4s6H3L5H2L")  # zip central directory entry, 46 bytes
_END_RECORD = struct.Struct("<4s4H2LH")  # zip end of central directory record, 22 bytes
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # ZIP64 end of central directory locator, 20 bytes
_ZIP64_END_RECORD = struct.Struct("<4sQ2H2L4Q")  # ZIP64 end of central directory record, 56


def central_entries(f: Any, names: tuple[bytes, ...]) -> dict[bytes, zipfile.ZipInfo] | None:
    """The last central-directory entry of each of `names` that the archive has (None: not a
    zip this reader understands). ZIP64 archives (a log of more than 65,535 samples is one)
    are read too."""
    f.seek(0, 2)
    size = f.tell()
    tail_len = min(size, _END_RECORD.size + 0xFFFF)  # the record plus the longest comment
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _END_RECORD.size > len(tail):
        return None
    end = _END_RECORD.unpack_from(tail, at)
    entries_total, cd_size, cd_offset = end[4], end[5], end[6]
    if 0xFFFF in (entries_total,) or 0xFFFFFFFF in (cd_size, cd_offset):
        found64 = _zip64_directory(f, tail, at)
        if found64 is None:
            return None
        cd_size, cd_offset = found64
    f.seek(cd_offset)
    directory = f.read(cd_size)
    found: dict[bytes, zipfile.ZipInfo] = {}
    for name in names:
        # a repeated name resolves to its last entry, as zipfile and Inspect's reader do
        pos = directory.rfind(name)
        while pos >= 0:
            start = pos - _CENTRAL_ENTRY.size
            if start >= 0 and directory[start : start + 4] == b"PK\x01\x02":
                entry = _CENTRAL_ENTRY.unpack_from(directory, start)
                if entry[10] == len(name):
                    info = zipfile.ZipInfo(name.decode())
                    info.compress_type, info.compress_size = entry[4], entry[8]
                    info.CRC = entry[7]
                    info.file_size, info.header_offset = entry[9], entry[16]
                    extra = directory[pos + len(name) : pos + len(name) + entry[11]]
                    if not _zip64_sizes(info, extra):
                        return None
                    found[name] = info
                    break
            pos = directory.rfind(name, 0, pos)
    return found


def _zip64_directory(f: Any, tail: bytes, end_at: int) -> tuple[int, int] | None:
    """(size, offset) of a ZIP64 archive's central directory, from the ZIP64 end record that
    the locator just before the end record points at (None: not there, or not as expected)."""
    at = end_at - _ZIP64_LOCATOR.size
    if at < 0 or tail[at : at + 4] != b"PK\x06\x07":
        return None
    record_offset = _ZIP64_LOCATOR.unpack_from(tail, at)[2]
    f.seek(record_offset)
    raw = f.read(_ZIP64_END_RECORD.size)
    if len(raw) != _ZIP64_END_RECORD.size or raw[:4] != b"PK\x06\x06":
        return None
    record = _ZIP64_END_RECORD.unpack(raw)
    return record[8], record[9]


def _zip64_sizes(info: zipfile.ZipInfo, extra: bytes) -> bool:
    """Fill in the sizes and offset an entry keeps in its ZIP64 extra field (those its
    central entry holds as 0xFFFFFFFF); False when one is needed and not found."""
    wanted = [
        attr
        for attr in ("file_size", "compress_size", "header_offset")
        if getattr(info, attr) == 0xFFFFFFFF
    ]
    if not wanted:
        return True
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        if tag == 0x0001:  # the ZIP64 extended information field, values in this order
            values = extra[pos + 4 : pos + 4 + length]
            if len(values) < 8 * len(wanted):
                return False
            for i, attr in enumerate(wanted):
                setattr(info, attr, struct.unpack_from("<Q", values, 8 * i)[0])
            return True
        pos += 4 + length
    return False


def member_data(f: Any, info: zipfile.ZipInfo, budget: LogBudget) -> bytes | bytearray:
    """A member's uncompressed bytes (Zstandard, deflate or stored: what Inspect has written),
    inflated within `budget`'s limits (warehouse.inflate) and CRC-checked.

    Raises:
        InflateRefused: past a limit, one line naming the member.
    """
    return inflate(f, info, budget)


# A command asks for a log's header at several steps (the early start, ingest, planning): it is
# read from the file once per process while the file is unchanged (path, inode, mtime, size).
_HEADERS: dict[tuple[Any, ...], Any] = {}
_HEADERS_KEPT = 64


def header_member(path: str, limits: InflateLimits | None = None) -> Any:
    """The `header.json` member of a local `.eval` log, parsed (None: no such member, or not
    an archive this reader understands), read from the file once per process while the file
    is unchanged; the value is shared between callers, so treat it as read-only.

    Raises:
        InflateRefused: the member inflates past `limits` (default: InflateLimits.from_env()).
        OSError, ValueError, ...: an unreadable file or member.
    """
    limits = limits or InflateLimits.from_env()
    try:
        st = os.stat(path)
        key: tuple[Any, ...] | None = (path, st.st_ino, st.st_mtime_ns, st.st_size, limits)
    except OSError:
        key = None
    if key is not None and key in _HEADERS:
        return _HEADERS[key]
    with open(path, "rb") as f:
        entries = central_entries(f, (b"header.json",))
        if not entries:
            return None
        # stdlib json, as Inspect's reader: it accepts the NaN/Infinity pydantic may write
        value = json.loads(member_data(f, entries[b"header.json"], limits.budget()))
    if key is not None:
        if len(_HEADERS) >= _HEADERS_KEPT:
            del _HEADERS[next(iter(_HEADERS))]
        _HEADERS[key] = value
    return value


def header_json(path: str, limits: InflateLimits | None = None) -> dict[str, Any] | None:
    """The `header.json` member of a local `.eval` log, parsed (`header_member`); None: no
    such member, over the inflate limits, or not an archive this reader understands (Inspect's
    reader words any real error, and warehouse.logs.read_header refuses a header over the
    limits)."""
    try:
        value = header_member(path, limits)
    except (
        OSError, ValueError, zipfile.BadZipFile, zstandard.ZstdError, zlib.error, struct.error,
        InflateRefused,
    ):  # fmt: skip
        return None
    return value if isinstance(value, dict) else None
