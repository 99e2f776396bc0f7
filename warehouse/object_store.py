"""Object storage: which locations are URLs, the filesystem that reaches one, and its errors in
one line.

Logs, scored copies, staged score chunks and workspace objects may live in an S3-compatible
bucket (`s3://bucket/prefix`) instead of on a local disk: a cluster's GPU and CPU workers then
share no path, only the bucket. Everything goes through fsspec, as Inspect's own log functions
do, so a location Inspect can read is one gradebook can read: `s3fs` speaks S3 through
botocore, whose credential chain (environment, profiles, instance roles) and `AWS_ENDPOINT_URL`
(MinIO, Ceph, R2, a local test server) apply unchanged. Credentials are never passed through
here, so they cannot reach a warehouse, a log, a Prefect parameter or a printed line.

`file://` URLs are local paths. Any other scheme is refused by name: a URL is never taken for a
relative local path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMES",
    "ObjectStoreError",
    "UnsupportedLocation",
    "filesystem",
    "is_url",
    "local_path",
    "one_line_error",
    "require_supported",
]

SCHEMES = ("s3",)  # reached through fsspec; `file://` is a local path

# Retries are bounded at two levels, so a store that keeps failing ends in one line, not a hang:
# botocore's "standard" mode sends a request at most ATTEMPTS times on a 500, 502-504, a
# throttle (SlowDown, 429) or a dropped connection, waiting a random 0-2^n s between (at most
# 20 s); s3fs repeats a call whose response body was cut short up to READ_RETRIES times
# (0.1 * 1.7^n s between). So one request is tried at most ATTEMPTS * READ_RETRIES times.
ATTEMPTS = 4
READ_RETRIES = 3
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
_URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://")


class ObjectStoreError(OSError):
    """An object store that cannot be reached or used (the message is one line)."""


class UnsupportedLocation(ValueError):
    """A URL whose scheme gradebook does not handle (the message is one line)."""


def is_url(location: str | Path) -> bool:
    """Whether a location names an object store (`s3://…`), not a local path (`file://` is
    local)."""
    m = _URL.match(str(location))
    return bool(m) and m["scheme"].lower() != "file"


def local_path(location: str | Path) -> Path:
    """A local location as a Path (`file:///x` is `/x`).

    Raises:
        UnsupportedLocation: the location is a URL of an object store.
    """
    text = str(location)
    if text.lower().startswith("file://"):
        return Path(text[len("file://") :])
    if is_url(text):
        raise UnsupportedLocation(f"{text}: an object-store URL where a local path is needed")
    return Path(text)


def require_supported(location: str | Path, what: str = "location") -> str:
    """The location unchanged, if it is a local path or a URL gradebook can use.

    Raises:
        UnsupportedLocation: another scheme (`gs://`, `http://`, a typo).
    """
    text = str(location)
    m = _URL.match(text)
    if m and m["scheme"].lower() not in (*SCHEMES, "file"):
        supported = ", ".join(f"{s}://" for s in (*SCHEMES, "file"))
        raise UnsupportedLocation(
            f"{what} {text}: gradebook reads and writes {supported} URLs and local paths, "
            f"not {m['scheme']}://"
        )
    return text


def filesystem(location: str | Path) -> Any:
    """The fsspec filesystem that holds `location` (local for paths and `file://`).

    s3fs caches listings per instance; callers that need a fresh listing (a watcher polling a
    prefix) call `invalidate_cache()` on it.
    """
    import fsspec

    text = require_supported(location)
    if not is_url(text):
        return fsspec.filesystem("file")
    # fsspec keeps one instance per set of arguments: the endpoint is one of them, so a process
    # whose AWS_ENDPOINT_URL changes (a test's fault-injecting proxy) gets a client for the new one
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    _require_credentials(text)
    fs = fsspec.filesystem(
        _URL.match(text)["scheme"].lower(),
        **({"endpoint_url": endpoint} if endpoint else {}),
        config_kwargs={
            "retries": {"max_attempts": ATTEMPTS, "mode": "standard"},
            "connect_timeout": CONNECT_TIMEOUT_S,
            "read_timeout": READ_TIMEOUT_S,
        },
    )
    fs.retries = READ_RETRIES
    return fs


_FOUND_CREDENTIALS: set[tuple[str | None, ...]] = set()


def _require_credentials(location: str) -> None:
    """s3fs falls back to anonymous requests when the chain finds no credentials, and a private
    bucket then reads as "no such bucket": say what is missing instead."""
    key = tuple(os.environ.get(v) for v in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_CONFIG_FILE"))
    if key in _FOUND_CREDENTIALS:
        return
    import botocore.session

    if botocore.session.get_session().get_credentials() is None:
        raise ObjectStoreError(
            one_line_error(location, ObjectStoreError("Unable to locate credentials"))
        )
    _FOUND_CREDENTIALS.add(key)


def one_line_error(location: str, exc: BaseException) -> str:
    """What went wrong reaching `location`, in words that say what to do; no credential appears.

    botocore's and s3fs's messages carry a request id, the operation name and sometimes the
    whole endpoint; the user needs the cause and the setting to change.
    """
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if (
        name in {"NoCredentialsError", "PartialCredentialsError"}
        or "Unable to locate credentials" in text
    ):
        return (
            f"{location}: no credentials for the object store: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (and AWS_ENDPOINT_URL for a store other than AWS)"
        )
    if name in {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"} or (
        "Could not connect to the endpoint" in text or "Cannot connect to host" in text
    ):
        return (
            f"{location}: the object store does not answer ({_endpoint_hint()}): "
            "check that it is up and that AWS_ENDPOINT_URL points at it"
        )
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return f"{location}: no such bucket: create it, or check the URL"
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return f"{location}: access denied by the object store: check the credentials' permissions"
    if isinstance(exc, FileNotFoundError):
        return f"{location}: no such object: check the URL"
    return f"{location}: object store error ({name}: {text[:200]})"


def _endpoint_hint() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f"endpoint {endpoint}" if endpoint else "AWS's default endpoint"
