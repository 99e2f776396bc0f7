"""The workspace store: canonical archives by sha256, zstd-compressed, once each, beside the logs.

Layout: `<root>/sha256/<first two hex>/<digest>.tar.zst`, where the root is a local directory
(`WorkspaceStore`) or a bucket prefix such as `s3://bucket/sweep/workspaces` (`BucketStore`);
`open_store` picks by the location. An archive already there is not written again (samples and
epochs whose workspaces end the same share one object). A reader never sees half an object: on
a disk it is written to a temporary file and renamed into place; in a bucket one PUT lands whole
or not at all, and is conditional (`If-None-Match: *`), so two writers of one digest never
replace each other's object. Reading decompresses within the cap and checks the sha256 of what
came out against the address: a replaced or truncated object is refused, never restored.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Any

from warehouse.object_store import (
    ObjectStoreError,
    filesystem,
    is_url,
    local_path,
    one_line_error,
    require_supported,
)

__all__ = [
    "BucketStore",
    "ObjectMissing",
    "ObjectUnusable",
    "WorkspaceStore",
    "default_store",
    "open_store",
    "split_stores",
]

_LEVEL = 3  # zstd's default: capture runs inside every sample's generation
_PUT_ATTEMPTS = 3
_READ_BLOCK = 4 * 1024 * 1024
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


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

    @property
    def location(self) -> str:
        """The store as a log's workspace record names it (an absolute path)."""
        return str(self.root.resolve())

    def path(self, digest: str) -> Path:
        """Where the object with this digest is (or would be)."""
        return self.root / _key(digest)

    def put(self, data: bytes, digest: str) -> int:
        """Store an archive (its sha256 is `digest`) unless it is there already.

        Written to a temporary file and renamed into place: a process killed mid-write leaves
        no object (only a `.tmp` file), never a partial one. Not fsynced: a killed process's
        writes survive in the page cache, and the log naming the object is written after it.

        Returns:
            The compressed size of the stored object.
        """
        target = self.path(digest)
        if target.is_file():
            return target.stat().st_size
        target.parent.mkdir(parents=True, exist_ok=True)
        compressed = _compress(data)
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
        path = self.path(digest)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            raise ObjectMissing(
                f"workspace {digest[:12]} is not in the store {self.root}"
            ) from None
        with f:
            return _inflate_checked(f, digest, max_bytes)

    def has(self, digest: str) -> bool:
        """Whether the store holds this digest."""
        return self.path(digest).is_file()


class BucketStore:
    """A bucket prefix of workspace archives, by digest (`s3://bucket/prefix`).

    The client is made on first use and kept (capture stores an archive inside every sample's
    generation); credentials and the endpoint come from the standard AWS chain, never from here.

    Args:
        root: the store's URL.
    """

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/")
        self._fs: Any = None

    @property
    def location(self) -> str:
        """The store as a log's workspace record names it (its URL)."""
        return self.root

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = filesystem(self.root)
        return self._fs

    def url(self, digest: str) -> str:
        """Where the object with this digest is (or would be)."""
        return f"{self.root}/{_key(digest)}"

    def put(self, data: bytes, digest: str) -> int:
        """Store an archive (its sha256 is `digest`) unless it is there already.

        One conditional PUT: a concurrent writer of the same digest that got there first wins
        and this one's PUT is refused (PreconditionFailed), which is "already there" (same
        content, by its address); a PUT never leaves half an object.

        Returns:
            The compressed size of the stored object.

        Raises:
            ObjectStoreError: the store cannot be reached or refuses the write (one line).
        """
        url = self.url(digest)
        try:
            return int(self.fs.info(url)["size"])
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ObjectStoreError(one_line_error(url, exc)) from None
        compressed = _compress(data)
        for attempt in range(_PUT_ATTEMPTS):
            try:
                self.fs.pipe_file(url, compressed, mode="create")
                return len(compressed)
            except FileExistsError:
                return self._size(url)
            except OSError as exc:
                # AWS answers 409 ConditionalRequestConflict to a conditional PUT racing another
                # one on the same key: ask again (the other one will have landed, or failed)
                if "ConditionalRequestConflict" in str(exc) and attempt + 1 < _PUT_ATTEMPTS:
                    continue
                raise ObjectStoreError(one_line_error(url, exc)) from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _size(self, url: str) -> int:
        try:
            self.fs.invalidate_cache(url)
            return int(self.fs.info(url)["size"])
        except OSError as exc:
            raise ObjectStoreError(one_line_error(url, exc)) from None

    def get(self, digest: str, max_bytes: int) -> bytes:
        """The archive with this digest, decompressed (at most `max_bytes`) and verified.

        Raises:
            ObjectMissing: not in this store.
            ObjectUnusable: it inflates past `max_bytes`, is not zstd, or its content does not
                hash to `digest`.
            ObjectStoreError: the store cannot be reached (one line).
        """
        url = self.url(digest)
        try:
            # read in blocks of a few MiB: a hostile object may be large
            f = self.fs.open(url, "rb", block_size=_READ_BLOCK, cache_type="readahead")
            with f:
                return _inflate_checked(f, digest, max_bytes)
        except FileNotFoundError:
            raise ObjectMissing(
                f"workspace {digest[:12]} is not in the store {self.root}"
            ) from None
        except (ObjectUnusable, ObjectMissing):
            raise
        except OSError as exc:
            raise ObjectStoreError(one_line_error(url, exc)) from None

    def has(self, digest: str) -> bool:
        """Whether the store holds this digest."""
        try:
            return bool(self.fs.exists(self.url(digest)))
        except OSError as exc:
            raise ObjectStoreError(one_line_error(self.url(digest), exc)) from None


def open_store(location: str | Path) -> WorkspaceStore | BucketStore:
    """The store at `location`: a bucket store for an `s3://` URL, else a directory store
    (`file://` URLs too). Bucket stores of one process share one client (fsspec keeps one
    filesystem per endpoint).

    Raises:
        UnsupportedLocation: a URL of another scheme (one line).
    """
    require_supported(location, "workspace store")
    if is_url(location):
        return BucketStore(str(location))
    return WorkspaceStore(local_path(location))


def split_stores(text: str) -> list[str]:
    """The stores a `GRADEBOOK_WORKSPACE_STORES` value names: separated by os.pathsep, where a
    URL's own `scheme://` is not a separator (`/a:s3://b/ws` is `/a` and `s3://b/ws`)."""
    parts = text.split(os.pathsep)
    out: list[str] = []
    for part in parts:
        if out and part.startswith("//") and _SCHEME.match(out[-1]):
            out[-1] = f"{out[-1]}:{part}"
        else:
            out.append(part)
    return [p for p in out if p]


def default_store(log_dir: str | Path) -> str | Path:
    """The workspace store of a sweep that names none: `workspaces/` in its log directory (a
    log directory in a bucket: the same prefix there)."""
    if is_url(log_dir):
        return f"{str(log_dir).rstrip('/')}/workspaces"
    return Path(log_dir) / "workspaces"


def _key(digest: str) -> str:
    """An object's address under a store's root."""
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise ObjectUnusable(f"{digest!r} is not a sha256 digest")
    return f"sha256/{digest[:2]}/{digest}.tar.zst"


def _compress(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=_LEVEL).compress(data)


def _inflate_checked(f: IO[bytes], digest: str, max_bytes: int) -> bytes:
    """What the zstd stream `f` inflates to, within `max_bytes`, if it hashes to `digest`."""
    import zstandard

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
        raise ObjectUnusable(f"workspace {digest[:12]} is not a zstd object: {exc}") from None
    if len(data) > max_bytes:
        raise ObjectUnusable(f"workspace {digest[:12]} inflates past its cap of {max_bytes} bytes")
    if hashlib.sha256(data).hexdigest() != digest:
        raise ObjectUnusable(f"workspace {digest[:12]} does not match its digest")
    return data
