"""Logs in object storage, read as local files: each one fetched once per command into a
bounded local spill directory, the next one fetched in the background meanwhile.

Why a local copy: a `.eval` is a zip read member by member; over S3 every member read would be
a ranged GET, and the fast archive reader (warehouse.eval_archive) reads local files only. A
whole-object download over one connection then local reads keeps scoring from a bucket at the
local-disk rate (benchmarks/s3_scoring.py).

Where: `$GRADEBOOK_SPILL_DIR`, else the cache directory's `spill/` (scorers.identity.cache:
`GRADEBOOK_CACHE_DIR` > `XDG_CACHE_HOME/gradebook` > `~/.cache/gradebook`), never beside the
logs. Its size is capped by `GRADEBOOK_SPILL_MB` (default 4096): past it, the least recently
used copies are removed, never one this process is using (so one log bigger than the cap still
gets its copy, alone).

A copy is keyed by the URL, the object's ETag and its size: a replaced object is a new copy, and
an unchanged one is not downloaded again by the next command. The download reads the object
with `If-Match` on its ETag (s3fs sends it on every ranged read), so an object replaced mid-read
fails instead of mixing two versions; it is written under a temporary name and renamed only
once it has all `size` bytes, so a copy cut short is never taken for a log.

The background fetch runs on a daemon thread: a command that ends (or fails) while a download is
in flight does not wait for bytes nobody will read. At exit its temporary file is removed, and
the thread, told to stop, neither creates another nor renames one into place.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from warehouse.object_store import filesystem, is_url, one_line_error

__all__ = [
    "SpillError",
    "expect",
    "local_copy",
    "object_identity",
    "spill_cap_bytes",
    "spill_dir",
]

_DEFAULT_CAP_MB = 4096
_BLOCK = 16 << 20  # bytes per ranged GET while downloading


_REPLACED = (
    "{location}: replaced while it was read (its ETag changed): run the command again to read "
    "the new version"
)


class SpillError(OSError):
    """An object that could not be copied locally (the message is one line naming the URL)."""


@dataclass(frozen=True)
class ObjectIdentity:
    """What names one version of an object: its ETag and size."""

    etag: str
    size: int


def spill_dir() -> Path:
    """Where local copies of remote logs go (`GRADEBOOK_SPILL_DIR`, else the cache's spill/)."""
    explicit = os.environ.get("GRADEBOOK_SPILL_DIR")
    if explicit:
        return Path(explicit)
    from scorers.identity.cache import cache_dir

    return cache_dir() / "spill"


def spill_cap_bytes() -> int:
    """The spill directory's size cap (`GRADEBOOK_SPILL_MB`, default 4096 MB)."""
    raw = os.environ.get("GRADEBOOK_SPILL_MB", "")
    try:
        mb = float(raw) if raw else _DEFAULT_CAP_MB
    except ValueError:
        mb = _DEFAULT_CAP_MB
    return int(max(mb, 0) * (1 << 20))


# URL -> its local copy, for this process: a command reads each log's bytes once, and every
# step of it (header, digest, samples, the scored copy) reads the same version
_COPIES: dict[str, tuple[Path, ObjectIdentity]] = {}
_PENDING: dict[str, Future] = {}
_ORDER: list[str] = []  # the URLs a command will read, in order (`expect`)
_LOCK = threading.Lock()
# the background fetches, one at a time, on one daemon thread (started on first use)
_QUEUE: queue.SimpleQueue[tuple[str, Future]] = queue.SimpleQueue()
_FETCHER: threading.Thread | None = None
# the process is exiting: no download starts, none is renamed into place (under _LOCK)
_EXITING = False
_PARTIALS: set[Path] = set()  # temporary files being written now (under _LOCK)


def expect(locations: list[str]) -> None:
    """Say which logs this command reads next, in order: while one is read, the next remote one
    is fetched in the background (one ahead, so the spill holds at most two of them)."""
    urls = [loc for loc in locations if is_url(loc)]
    with _LOCK:
        _ORDER[:] = urls
    if urls:
        _ahead(urls[0])


def local_copy(location: str) -> str:
    """`location` unchanged if it is local; for a URL, the path of a complete local copy of the
    object (fetched now, or by the background fetch `expect` started).

    Raises:
        SpillError: the object could not be fetched (one line naming the URL and the cause).
    """
    if not is_url(location):
        return location.removeprefix("file://")
    with _LOCK:
        known = _COPIES.get(location)
        pending = _PENDING.get(location)
    if known is not None and known[0].exists():
        _next_after(location)
        return str(known[0])
    if pending is not None:
        try:
            path = pending.result()
        except SpillError as exc:
            with _LOCK:
                _PENDING.pop(location, None)
            _next_after(location)
            raise SpillError(str(exc)) from exc  # raised in this thread, as if fetched here
        _next_after(location)
        return str(path)
    path = _fetch(location)
    _next_after(location)
    return str(path)


def object_identity(location: str) -> ObjectIdentity | None:
    """The ETag and size of the copy this process read of `location` (None: not read yet)."""
    with _LOCK:
        known = _COPIES.get(location)
    return known[1] if known is not None else None


def _next_after(location: str) -> None:
    with _LOCK:
        try:
            at = _ORDER.index(location)
        except ValueError:
            return
        following = _ORDER[at + 1] if at + 1 < len(_ORDER) else None
    if following is not None:
        _ahead(following)


def _ahead(location: str) -> None:
    global _FETCHER
    with _LOCK:
        if _EXITING or location in _COPIES or location in _PENDING:
            return
        future: Future = Future()
        _PENDING[location] = future
        _QUEUE.put((location, future))
        if _FETCHER is None:
            # a daemon: a ThreadPoolExecutor's thread would be joined at exit, so a command
            # failing early would first wait for a download whose result nobody reads
            _FETCHER = threading.Thread(target=_fetch_queued, name="gradebook-spill", daemon=True)
            _FETCHER.start()


def _fetch_queued() -> None:
    while True:
        location, future = _QUEUE.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(_fetch(location))
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, as an executor does
            future.set_exception(exc)


@atexit.register
def _drop_partials() -> None:
    """At exit: no download is finished or started any more, and the temporary files of those
    in flight are removed (the daemon thread writing one is not waited for)."""
    global _EXITING
    with _LOCK:
        _EXITING = True
        for partial in _PARTIALS:
            partial.unlink(missing_ok=True)
        _PARTIALS.clear()


def _fetch(location: str) -> Path:
    try:
        fs = filesystem(location)
        fs.invalidate_cache(location)
        info = fs.info(location)
    except FileNotFoundError as exc:
        raise SpillError(_missing(fs, location)) from exc
    except Exception as exc:  # noqa: BLE001 - any failure reaching the store is this one line
        raise SpillError(one_line_error(location, exc)) from exc
    ident = ObjectIdentity(str(info.get("ETag") or info.get("etag") or ""), int(info["size"]))
    name = Path(location.rstrip("/")).name
    key = hashlib.sha256(f"{location}\0{ident.etag}\0{ident.size}".encode()).hexdigest()[:24]
    directory = spill_dir()
    target = directory / f"{key}-{name}"
    with _LOCK:
        in_use = {p for p, _ in _COPIES.values()} | {target}
    if target.exists() and target.stat().st_size == ident.size:
        os.utime(target)  # most recently used
    else:
        directory.mkdir(parents=True, exist_ok=True)
        _evict(directory, spill_cap_bytes() - ident.size, in_use)
        _download(fs, location, ident, target)
    with _LOCK:
        _COPIES[location] = (target, ident)
        _PENDING.pop(location, None)
    return target


def _missing(fs: object, location: str) -> str:
    """A 404 on an object: its bucket gone (deleted mid-run), or only the object."""
    scheme, rest = location.split("://", 1)
    try:
        fs.invalidate_cache()  # type: ignore[attr-defined]
        bucket_there = fs.exists(f"{scheme}://{rest.split('/', 1)[0]}")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the object's own 404 is what is known
        bucket_there = True
    if not bucket_there:
        return f"{location}: no such bucket: create it, or check the URL"
    return f"{location}: no such object: check the URL"


def _download(fs: object, location: str, ident: ObjectIdentity, target: Path) -> None:
    partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
    got = 0
    try:
        # `size=` is not given, so s3fs sends If-Match with the ETag it just read on every range
        with fs.open(location, "rb", block_size=_BLOCK, cache_type="none") as src:  # type: ignore[attr-defined]
            if ident.etag and getattr(src, "details", {}).get("ETag", ident.etag) != ident.etag:
                raise SpillError(_REPLACED.format(location=location))
            with _LOCK:  # created only while the exit handler can still remove it
                if _EXITING:
                    raise SpillError(f"{location}: not fetched: the command is exiting")
                out = open(partial, "wb")  # closed by the `with` below
                _PARTIALS.add(partial)
            with out:
                while chunk := src.read(_BLOCK):
                    if _EXITING:
                        raise SpillError(f"{location}: not fetched: the command is exiting")
                    out.write(chunk)
                    got += len(chunk)
        if got != ident.size:
            raise SpillError(
                f"{location}: unreadable Inspect log (cut short while read: {got} of "
                f"{ident.size} bytes arrived); run the command again"
            )
        # not every store honours If-Match on a ranged GET: the object's ETag after the read
        # must still be the one before it, or the bytes may be of two versions
        fs.invalidate_cache(location)  # type: ignore[attr-defined]
        after = fs.info(location)  # type: ignore[attr-defined]
        if str(after.get("ETag") or "") != ident.etag or int(after["size"]) != ident.size:
            raise SpillError(_REPLACED.format(location=location))
        with _LOCK:  # never a rename after the exit handler removed the file
            if _EXITING:
                raise SpillError(f"{location}: not fetched: the command is exiting")
            os.replace(partial, target)
    except SpillError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line naming the URL
        text = " ".join(str(exc).split())
        if type(exc).__name__ == "FileExpired" or "PreconditionFailed" in text or "412" in text:
            raise SpillError(_REPLACED.format(location=location)) from exc
        raise SpillError(one_line_error(location, exc)) from exc
    finally:
        with _LOCK:
            _PARTIALS.discard(partial)
        partial.unlink(missing_ok=True)


def _evict(directory: Path, budget: int, keep: set[Path]) -> None:
    """Remove the least recently used copies until the others fit in `budget` bytes."""
    entries = []
    for p in directory.iterdir():
        if p.name.startswith("."):
            # another process's download in flight: left alone unless it is an hour stale
            try:
                if time.time() - p.stat().st_mtime > 3600:
                    p.unlink(missing_ok=True)
            except OSError:
                pass
            continue
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries):
        if total <= budget:
            break
        if p in keep:
            continue
        p.unlink(missing_ok=True)
        total -= size
