"""The cluster's staging location: where generate manifests, score chunks (Parquet in) and staged
score files (Parquet out) pass between the dispatcher and the workers.

It is a bucket prefix (`s3://bucket/prefix`: hosts share nothing but the bucket) or a directory
every host sees. Either way each file appears whole or not at all: on a disk it is written under
a temporary name and renamed; in a bucket one PUT lands whole or not at all. Only the dispatcher
opens the warehouse (principle 8): it downloads the staged score files to a local directory of
its own and loads them with `Warehouse.load_staged` (idempotent: a file loaded twice, after a
crash between the load and the move, adds no row).

Credentials and the endpoint come from the standard AWS chain on each host (warehouse.
object_store); what travels in a Prefect parameter is only the URL.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from warehouse.object_store import (
    ObjectStoreError,
    filesystem,
    is_url,
    local_path,
    one_line_error,
)

__all__ = [
    "check_reachable",
    "join",
    "load_staged",
    "read_bytes",
    "read_json",
    "read_parquet",
    "remove",
    "stage_scores",
    "write_json",
    "write_parquet",
]

SCORES, LOADED = "scores", "loaded"


def join(location: str | Path, *parts: str) -> str:
    """`location/part/...` for a URL or a path (as text: it travels in a Prefect parameter)."""
    if is_url(location):
        return "/".join([str(location).rstrip("/"), *parts])
    return str(local_path(location).joinpath(*parts))


def _put_whole(location: str, data: bytes) -> None:
    if is_url(location):
        try:
            filesystem(location).pipe_file(location, data)
        except OSError as exc:
            raise ObjectStoreError(one_line_error(location, exc)) from None
        return
    path = local_path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_bytes(location: str | Path) -> bytes:
    """The whole file or object.

    Raises:
        FileNotFoundError: there is none (a run that never wrote it).
        ObjectStoreError: the bucket cannot be read (one line).
    """
    if not is_url(location):
        return local_path(location).read_bytes()
    try:
        return filesystem(location).cat_file(str(location))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ObjectStoreError(one_line_error(str(location), exc)) from None


def remove(location: str | Path) -> None:
    """Remove a file or object if it is there."""
    if not is_url(location):
        local_path(location).unlink(missing_ok=True)
        return
    try:
        filesystem(location).rm_file(str(location))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ObjectStoreError(one_line_error(str(location), exc)) from None


def write_json(location: str | Path, payload: Any) -> None:
    _put_whole(str(location), json.dumps(payload, indent=1).encode())


def read_json(location: str | Path) -> Any:
    return json.loads(read_bytes(location))


def write_parquet(table: Any, location: str | Path) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf)
    _put_whole(str(location), buf.getvalue())


def read_parquet(location: str | Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_url(location):
        return pq.read_table(str(local_path(location)))
    return pq.read_table(pa.BufferReader(read_bytes(location)))


def stage_scores(table: Any, staging: str | Path) -> str:
    """Stage score rows for the dispatcher's `load_staged` (no database access); returns where.

    Raises:
        ObjectStoreError: the bucket refused the write (one line).
    """
    from warehouse import stage_scores as stage_to_dir
    from warehouse.schema import conform_scores

    if not is_url(staging):
        return str(stage_to_dir(table, local_path(staging)))
    target = join(staging, f"scores-{uuid.uuid4().hex}.parquet")
    write_parquet(conform_scores(table), target)
    return target


def load_staged(warehouse: Any, staging: str | Path) -> int:
    """Load every score file staged at `staging` into the warehouse (this process is its only
    writer); returns rows inserted.

    From a bucket: each object is downloaded to a local directory of this process, the lot is
    loaded in one transaction, and only then are the objects moved under `loaded/`. A crash
    in between leaves them to be loaded again, which adds no row.

    Raises:
        ObjectStoreError: the bucket cannot be read (one line).
    """
    if not is_url(staging):
        return warehouse.load_staged(local_path(staging))
    fs = filesystem(staging)
    prefix = str(staging).rstrip("/")
    try:
        fs.invalidate_cache(prefix)
        names = sorted(
            p.rsplit("/", 1)[-1] for p in fs.ls(prefix, detail=False) if p.endswith(".parquet")
        )
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise ObjectStoreError(one_line_error(prefix, exc)) from None
    if not names:
        return 0
    with tempfile.TemporaryDirectory(prefix="gradebook-staged-") as tmp:
        for name in names:
            Path(tmp, name).write_bytes(read_bytes(f"{prefix}/{name}"))
        inserted = warehouse.load_staged(Path(tmp))
    for name in names:
        try:
            fs.mv(f"{prefix}/{name}", f"{prefix}/{LOADED}/{name}")
        except OSError as exc:
            raise ObjectStoreError(one_line_error(f"{prefix}/{name}", exc)) from None
    return inserted


def check_reachable(location: str | Path, what: str) -> None:
    """Fail now, in one line, when a bucket location cannot be used from this host (no
    credentials, no endpoint, no bucket); a local path is not checked.

    Raises:
        ObjectStoreError: why, naming `what` and what to set.
    """
    if not is_url(location):
        return
    text = str(location)
    try:
        fs = filesystem(text)
        bucket = text.split("://", 1)[1].split("/", 1)[0]
        fs.ls(bucket, detail=False)
    except ObjectStoreError as exc:
        raise ObjectStoreError(f"{what}: {exc}") from None
    except OSError as exc:
        raise ObjectStoreError(f"{what}: {one_line_error(text, exc)}") from None
