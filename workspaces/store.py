"""The workspace store: canonical archives by sha256, zstd-compressed, once each, beside the logs.

Layout: `<root>/sha256/<first two hex>/<digest>.tar.zst`. An archive is written to a temporary
file in the same directory and renamed into place, so a reader (or a process killed mid-write)
never sees half an object; an archive already there is not written again (samples and epochs
whose workspaces end the same share one object). Reading decompresses within the cap and checks
the sha256 of what came out against the address: a replaced or truncated object is refused,
never restored.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["ObjectMissing", "ObjectUnusable", "WorkspaceStore", "default_store"]

_LEVEL = 3  # zstd's default: capture runs inside every sample's generation


class ObjectMissing(FileNotFoundError):
    """No object with that digest in the store."""


class ObjectUnusable(ValueError):
    """An object that inflates past its cap, is not zstd, or does not hash to its address."""


class WorkspaceStore:
    """A directory of workspace archives, by digest.

    Args:
        root: the store's directory (created on the first write).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        """Where the object with this digest is (or would be)."""
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ObjectUnusable(f"{digest!r} is not a sha256 digest")
        return self.root / "sha256" / digest[:2] / f"{digest}.tar.zst"

    def put(self, data: bytes, digest: str) -> int:
        """Store an archive (its sha256 is `digest`) unless it is there already.

        Written to a temporary file and renamed into place: a process killed mid-write leaves
        no object (only a `.tmp` file), never a partial one. Not fsynced: a killed process's
        writes survive in the page cache, and the log naming the object is written after it.

        Returns:
            The compressed size of the stored object.
        """
        import zstandard

        target = self.path(digest)
        if target.is_file():
            return target.stat().st_size
        target.parent.mkdir(parents=True, exist_ok=True)
        compressed = zstandard.ZstdCompressor(level=_LEVEL).compress(data)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{digest[:12]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(compressed)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return len(compressed)

    def get(self, digest: str, max_bytes: int) -> bytes:
        """The archive with this digest, decompressed (at most `max_bytes`) and verified.

        Raises:
            ObjectMissing: not in this store.
            ObjectUnusable: it inflates past `max_bytes`, is not zstd, or its content does not
                hash to `digest`.
        """
        import zstandard

        path = self.path(digest)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            raise ObjectMissing(
                f"workspace {digest[:12]} is not in the store {self.root}"
            ) from None
        with f:
            try:
                reader = zstandard.ZstdDecompressor().stream_reader(f)
                data = reader.read(max_bytes + 1)
                # a zstd frame may hand out its content in parts: read to the cap, no further
                while len(data) <= max_bytes:
                    more = reader.read(max_bytes + 1 - len(data))
                    if not more:
                        break
                    data += more
            except zstandard.ZstdError as exc:
                raise ObjectUnusable(
                    f"workspace {digest[:12]} is not a zstd object: {exc}"
                ) from None
        if len(data) > max_bytes:
            raise ObjectUnusable(
                f"workspace {digest[:12]} inflates past its cap of {max_bytes} bytes"
            )
        if hashlib.sha256(data).hexdigest() != digest:
            raise ObjectUnusable(f"workspace {digest[:12]} does not match its digest")
        return data

    def has(self, digest: str) -> bool:
        """Whether the store holds this digest."""
        return self.path(digest).is_file()


def default_store(log_dir: str | Path) -> Path:
    """The workspace store of a sweep that names none: `workspaces/` in its log directory."""
    return Path(log_dir) / "workspaces"
