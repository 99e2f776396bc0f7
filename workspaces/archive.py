"""Workspace archives: a tar stream made canonical and safe, and put back inside a container.

An archive is written by a model-driven agent's sandbox, so it is hostile input twice: when it
is captured (whatever the agent left in its workspace) and when it is restored (a stored object
may have been replaced). Both go through `canonical`, which never writes a file: it reads the
tar stream member by member, within a byte and a member budget, and writes a new tar of only

- directories and regular files (a hard link becomes a copy of the file it names),
- symbolic links that stay inside the same workspace root, read as text and followed as the
  kernel would through the archive's own links (workspaces.symlinks),
- members whose path is relative, has no `..`, lies under one of the workspace roots, and is
  not below a symbolic link (kept or not),

with permissions reduced to 0755 / 0644 (no set-uid, set-gid or sticky bit), owner 0, one fixed
modification time, sorted by path. Everything else (device files, FIFOs, absolute paths, `..`,
links that point outside) is left out and named in `Canonical.skipped`. The same workspace thus
gives the same bytes, whichever sample or epoch it came from, and its sha256 is its address in
the store (workspaces.store). Reading is bounded: a stream longer than the cap, a header that
claims more, or more members than allowed stops with `ArchiveTooLarge` before it is read.

`EXTRACT` is the program that unpacks a canonical archive inside a restore container, as the
sandbox uid, into the workspace roots only (checked again there, with the same link rule:
symbolic links made last, once every link of the archive is known).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from workspaces import symlinks
from workspaces.symlinks import root_of

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EXTRACT",
    "MAX_MEMBERS",
    "ArchiveError",
    "ArchiveTooLarge",
    "Canonical",
    "Skipped",
    "canonical",
    "check_roots",
]

# The cap on one workspace archive (uncompressed tar, headers included). It matches the 64 MB
# work dir of a sandbox container: a bigger workspace could not be restored into one.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_MEMBERS = 20_000  # files, directories and links in one archive
MAX_PATH = 4096  # characters in a member's path (a link's target: symlinks.MAX_TARGET)
# what a tar writer adds beyond the members themselves (end blocks, record padding)
_SLACK = 1024 * 1024
FIXED_MTIME = 946_684_800  # 2000-01-01: every member the same time (the digest must not vary)
MAX_SKIPPED = 20  # skipped members named one by one; the rest are counted

# Directories a workspace may not be restored over: the container's own system.
_SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys",
           "/usr", "/var")  # fmt: skip


class ArchiveError(ValueError):
    """A workspace archive that cannot be used (the message says why, in one line)."""


class ArchiveTooLarge(ArchiveError):
    """The archive (or a header in it) is larger than its cap, or has too many members."""


@dataclass(frozen=True)
class Skipped:
    """A member left out, and why (e.g. "device file", "link pointing outside")."""

    path: str
    why: str


@dataclass(frozen=True)
class Canonical:
    """A canonical workspace archive.

    Attributes:
        data: the tar bytes (uncompressed).
        digest: their sha256, hex: the archive's address in the store.
        files: regular files in it.
        skipped: members of the input left out (at most MAX_SKIPPED named, then one
            "... n more" entry).
    """

    data: bytes
    digest: str
    files: int
    skipped: tuple[Skipped, ...]


class _Bounded(io.RawIOBase):
    """A read-only stream that refuses to read past `limit` bytes in total: a tar header that
    claims gigabytes fails here, before anything is allocated for it."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self._left + 1
        if size > self._left:
            # read what is left: an honest stream ends within it, a longer one is too large
            data = self._raw.read(self._left + 1)
            if len(data) > self._left:
                raise ArchiveTooLarge("the archive is larger than its cap")
            self._left -= len(data)
            return data
        data = self._raw.read(size)
        self._left -= len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def check_roots(roots: Sequence[str]) -> list[str]:
    """Workspace roots as absolute, normalised paths (none the filesystem root, none a system
    directory, none inside another).

    Raises:
        ArchiveError: a root that is not such a path.
    """
    out: list[str] = []
    for root in roots:
        if not isinstance(root, str) or not root.startswith("/") or "\x00" in root:
            raise ArchiveError(f"workspace path {root!r} is not an absolute path")
        norm = posixpath.normpath(root)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        if norm == "/" or any(norm == s or norm.startswith(s + "/") for s in _SYSTEM):
            raise ArchiveError(f"workspace path {root!r} is the root or a system directory")
        out.append(norm)
    out = sorted(set(out))
    for a in out:
        for b in out:
            if a != b and b.startswith(a + "/"):
                raise ArchiveError(f"workspace paths {a!r} and {b!r} overlap; give one of them")
    if not out:
        raise ArchiveError("no workspace path given")
    return out


def _member_path(name: str) -> tuple[str | None, str]:
    """(the member's path relative to /, or None when it must be left out; why)."""
    if "\x00" in name or len(name) > MAX_PATH:
        return None, "unusable path"
    if name.startswith("/"):
        return None, "absolute path"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None, "'..' in path"
    return "/".join(parts), ""


def canonical(
    stream: bytes | BinaryIO,
    roots: Sequence[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_members: int = MAX_MEMBERS,
) -> Canonical:
    """The canonical archive of a tar stream, keeping only what lies under `roots`.

    Args:
        stream: an uncompressed tar (bytes or a readable binary stream); member paths are
            relative to / (`tar --directory=/ work` writes `work/...`).
        roots: the workspace's absolute paths (`check_roots`).
        max_bytes: cap on the input stream and on the result.
        max_members: cap on members read.

    Raises:
        ArchiveTooLarge: past a cap.
        ArchiveError: not a tar stream.
    """
    relative_roots = [r.lstrip("/") for r in check_roots(roots)]
    raw = io.BytesIO(stream) if isinstance(stream, bytes | bytearray) else stream
    bounded = io.BufferedReader(_Bounded(raw, max_bytes + _SLACK))
    kept: dict[str, tuple[tarfile.TarInfo, bytes]] = {}
    links: set[str] = set()
    skipped: list[Skipped] = []
    total = 0
    dropped_bits = False
    try:
        with tarfile.open(fileobj=bounded, mode="r|") as tar:
            for count, member in enumerate(tar, start=1):
                if count > max_members:
                    raise ArchiveTooLarge(f"the archive has more than {max_members} members")
                path, why = _member_path(member.name)
                root = root_of(path, relative_roots) if path is not None else None
                if path is None or root is None:
                    if path:  # "." and the like are not worth a line
                        skipped.append(Skipped(member.name, why or "outside the workspace"))
                    elif why:
                        skipped.append(Skipped(member.name, why))
                    continue
                if any(path.startswith(link + "/") for link in links):
                    skipped.append(Skipped(path, "below a symbolic link"))
                    continue
                if member.mode & 0o7000:
                    dropped_bits = True
                info = tarfile.TarInfo(path)
                info.mtime = FIXED_MTIME
                data = b""
                if member.isdir():
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                elif member.isreg():
                    if total + member.size > max_bytes:
                        raise ArchiveTooLarge(
                            f"the workspace is larger than its cap of {max_bytes} bytes"
                        )
                    source = tar.extractfile(member)
                    data = source.read() if source is not None else b""
                    info.type, info.size = tarfile.REGTYPE, len(data)
                    info.mode = 0o755 if member.mode & 0o111 else 0o644
                elif member.islnk():
                    target, _ = _member_path(member.linkname)
                    found = kept.get(target or "")
                    if found is None or found[0].type != tarfile.REGTYPE:
                        skipped.append(Skipped(path, "hard link to a file not in the workspace"))
                        continue
                    if total + len(found[1]) > max_bytes:
                        raise ArchiveTooLarge(
                            f"the workspace is larger than its cap of {max_bytes} bytes"
                        )
                    data = found[1]
                    info.type, info.size, info.mode = tarfile.REGTYPE, len(data), found[0].mode
                elif member.issym():
                    # checked once every link is known (symlinks.refused): where a link leads
                    # depends on the others
                    info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, member.linkname
                    links.add(path)
                else:
                    kind = "device file" if member.ischr() or member.isblk() else "special file"
                    skipped.append(Skipped(path, "FIFO" if member.isfifo() else kind))
                    continue
                total += len(data) + 512
                if total > max_bytes:
                    raise ArchiveTooLarge(
                        f"the workspace is larger than its cap of {max_bytes} bytes"
                    )
                previous = kept.pop(path, None)
                if previous is not None and previous[0].type == tarfile.SYMTYPE:
                    links.discard(path)
                kept[path] = (info, data)
    except ArchiveTooLarge:
        raise
    except (tarfile.TarError, EOFError, OSError, UnicodeError, ValueError) as exc:
        raise ArchiveError(f"not a readable tar archive ({type(exc).__name__}: {exc})") from None
    # a member kept before a symbolic link of one of its parents came later
    for path in [p for p in kept if any(p.startswith(link + "/") for link in links)]:
        del kept[path]
        skipped.append(Skipped(path, "below a symbolic link"))
    targets = {p: info.linkname for p, (info, _) in kept.items() if info.type == tarfile.SYMTYPE}
    for path, why in symlinks.refused(targets, relative_roots).items():
        del kept[path]
        skipped.append(Skipped(path, why))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(kept):
            info, data = kept[path]
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    data = out.getvalue()
    if len(data) > max_bytes + _SLACK:
        raise ArchiveTooLarge(f"the workspace is larger than its cap of {max_bytes} bytes")
    if dropped_bits:
        skipped.append(Skipped("*", "set-uid, set-gid and sticky bits dropped"))
    if len(skipped) > MAX_SKIPPED:
        skipped = [*skipped[:MAX_SKIPPED], Skipped("...", f"{len(skipped) - MAX_SKIPPED} more")]
    files = sum(1 for info, _ in kept.values() if info.type == tarfile.REGTYPE)
    return Canonical(data, hashlib.sha256(data).hexdigest(), files, tuple(skipped))


# Unpacks a canonical archive from stdin into the workspace roots (argv[1:], absolute), as the
# sandbox uid inside the restore container: every check again (the host's were the first line),
# files opened without following links, symbolic links made last, and only those that
# workspaces.symlinks (whose source runs first, in the same program) keeps. Prints the number
# of files.
_EXTRACT_BODY = r"""
import os, sys, tarfile
roots = [r.rstrip("/") for r in sys.argv[1:]]
links, files = {}, 0
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
    for m in tar:
        parts = [p for p in m.name.split("/") if p not in ("", ".")]
        path = "/" + "/".join(parts)  # as the kernel reads it: the links' walks look it up
        root = root_of(path, roots)
        if m.name.startswith("/") or ".." in parts or root is None:
            continue
        if any(path.startswith(l + "/") for l in links):
            continue
        if m.isdir():
            os.makedirs(path, mode=0o755, exist_ok=True)
        elif m.isreg():
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                src = tar.extractfile(m)
                while True:
                    chunk = src.read(1 << 16)
                    if not chunk:
                        break
                    out.write(chunk)
            os.chmod(path, m.mode & 0o755)
            files += 1
        elif m.issym():
            links[path] = m.linkname
bad = refused(links, roots)
for path in sorted(links):
    if path not in bad:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        os.symlink(links[path], path)
print(files)
"""
EXTRACT = Path(symlinks.__file__).read_text(encoding="utf-8") + _EXTRACT_BODY
