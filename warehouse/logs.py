"""Reading Inspect logs into Arrow batches (no database access here).

A local `.eval` written by the installed Inspect version is read directly from its archive
(warehouse.eval_archive). Every other log goes through Inspect's own readers, so every log
version Inspect can read is readable here. For those `.eval` logs the archive's directory says
which (id, epoch) members exist; only the ones the warehouse lacks are then read, in batches
through `read_eval_log_samples_by_id` (one shared zip reader: `read_eval_log_samples` reopens the
archive for every sample). A `.json` log is one JSON document, so it is read whole.

Both readers read sample by sample as far as damage goes: one unreadable sample is reported
(`SampleColumns.bad`) and the others are still read. Neither inflates a member past the ingest
limits (warehouse.inflate): Inspect's reader inflates a member whole, so every member it is
about to read is first inflated here within the limits and dropped, and a `.json` log over the
per-member limit is refused (it is read whole).
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
from inspect_ai.log import (
    EvalLog,
    EvalSample,
    read_eval_log,
)

import warehouse.eval_archive as eval_archive
from warehouse.inflate import InflateLimits, InflateRefused, LogTooBig, inflate
from warehouse.log_spill import SpillError, local_copy
from warehouse.log_stamps import NO_STAMP, LogStamp
from warehouse.object_store import (
    ObjectStoreError,
    UnsupportedLocation,
    filesystem,
    is_url,
    one_line_error,
    require_supported,
)
from warehouse.sample_rows import (
    BadSample,
    SampleColumns,
    canonical_json,
    timestamp,
)

SAMPLE_BATCH = 500
SampleKey = tuple[str, int]


class LogReadError(Exception):
    """A path that is missing, not an Inspect log, or unreadable (message is one line)."""


def is_remote(path: str) -> bool:
    """Whether `path` is an object-store URL (`s3://…`); `file://` is local."""
    return is_url(path)


def local_log(path: str) -> str:
    """A path the local readers can open for the log at `path`: itself, or for a URL its
    local copy (warehouse.log_spill: fetched once per command).

    Raises:
        LogReadError: an unsupported URL, or the object could not be fetched (one line).
    """
    try:
        require_supported(path, "log")
        return local_copy(path)
    except (UnsupportedLocation, SpillError) as exc:
        raise LogReadError(str(exc)) from exc


def _named(exc: Exception, local: str, path: str) -> str:
    """An error about the local copy of a log, naming the log's URL instead."""
    return str(exc).replace(local, path)


def expand_log_paths(paths: Iterable[str | Path]) -> list[str]:
    """`find_logs(paths)`'s logs."""
    return find_logs(paths)[0]


# an Inspect JSON log starts with its format version and status (EvalLog's first fields)
_JSON_LOG_START = re.compile(rb'\A\s*\{\s*"version"\s*:\s*\d+\s*,\s*"status"\s*:')
_NOT_REPORTED = ("logs.json",)  # Inspect's own listing of a log dir


def find_logs(paths: Iterable[str | Path]) -> tuple[list[str], list[str]]:
    """Paths with each local directory replaced by the Inspect logs under it (recursively), in
    path order, and the files under those directories that were skipped as not being logs.

    A directory's logs are what Inspect's own `list_eval_logs` finds (`.eval` files, `.json`
    files named like Inspect's logs) and every other `.json` file whose content starts as an
    Inspect log does (`{"version": N, "status": ...`): a log renamed by hand is still a log.
    Other paths pass unchanged; a log named twice (a file and its directory) is kept once.

    Raises:
        LogReadError: a directory holds no Inspect log.
    """
    from inspect_ai.log import list_eval_logs

    out: list[str] = []
    skipped: list[str] = []
    for p in paths:
        path = str(p)
        if path.lower().startswith("file://"):
            path = path[len("file://") :]
        if is_remote(path):
            out.extend(_remote_logs(path, skipped))
            continue
        if not Path(path).is_dir():
            try:
                require_supported(path, "log")
            except UnsupportedLocation as exc:
                raise LogReadError(str(exc)) from None
            out.append(path)
            continue
        found = {
            str(Path(info.name.removeprefix("file://")))
            for info in list_eval_logs(path, recursive=True, descending=False)
        }
        # Inspect names them absolute; a directory given relative lists its files relative
        listed = {Path(f).resolve() for f in found}
        for file in sorted(Path(path).rglob("*")):
            if not file.is_file() or file.resolve() in listed or _hidden(file, Path(path)):
                continue
            if file.suffix == ".json" and _looks_like_json_log(file):
                found.add(str(file))
            elif file.name not in _NOT_REPORTED:
                skipped.append(str(file))
        if not found:
            raise LogReadError(
                f"{path}: no Inspect logs in this directory (.eval files, or .json logs); "
                "pass a log directory or log files"
            )
        out.extend(sorted(found))
    return list(dict.fromkeys(out)), skipped


def _remote_logs(url: str, skipped: list[str]) -> list[str]:
    """The Inspect logs at a URL: the object itself when it is named `.eval`/`.json`, else every
    `.eval` and `.json` log under the prefix, listed like a directory (recursively, in key
    order). Other objects are added to `skipped`.

    Raises:
        LogReadError: an unsupported scheme, a store that cannot be listed, or no logs there.
    """
    try:
        require_supported(url, "log")
        if url.endswith((".eval", ".json")):
            return [url]
        fs = filesystem(url)
        root = url.rstrip("/")
        fs.invalidate_cache()  # a listing is always fresh: a watcher polls the same prefix
        keys = sorted(fs.find(root))
    except UnsupportedLocation as exc:
        raise LogReadError(str(exc)) from None
    except ObjectStoreError as exc:
        raise LogReadError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - whatever the store said, one line
        raise LogReadError(one_line_error(url, exc)) from None
    scheme = url.split("://", 1)[0]
    found: list[str] = []
    prefix = root.split("://", 1)[1]
    for key in keys:
        rel = key[len(prefix) :].lstrip("/") if key.startswith(prefix) else key
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        name = rel.rsplit("/", 1)[-1]
        if name.endswith(".eval") or (name.endswith(".json") and name not in _NOT_REPORTED):
            found.append(f"{scheme}://{key}")
        elif name not in _NOT_REPORTED:
            skipped.append(f"{scheme}://{key}")
    if not found:
        raise LogReadError(
            f"{url}: no Inspect logs under this prefix (.eval files, or .json logs); "
            "pass a prefix that holds logs, or the URL of a log"
        )
    return found


def _hidden(file: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in file.relative_to(root).parts)


def _looks_like_json_log(file: Path) -> bool:
    try:
        with open(file, "rb") as f:
            return bool(_JSON_LOG_START.match(f.read(4096)))
    except OSError:
        return False


def server_of(header: EvalLog) -> str:
    """What a run's generation talked to, for error messages: "<model> at <base url>"."""
    spec = header.eval
    return f"{spec.model} at {spec.model_base_url}" if spec.model_base_url else spec.model


def check_log_path(path: str) -> None:
    """Fail early, in one line, on a path that cannot be an Inspect log."""
    try:
        require_supported(path, "log")
    except UnsupportedLocation as exc:
        raise LogReadError(str(exc)) from None
    if not path.endswith((".eval", ".json")):
        raise LogReadError(f"{path}: not an Inspect log (expected a .eval or .json file)")
    if not is_remote(path) and not Path(path).is_file():
        raise LogReadError(f"{path}: no such file: check the path")


def file_digest(path: str) -> tuple[str, int]:
    """sha256 and size of a log (local or any fsspec URL Inspect could read).

    Raises:
        LogReadError: the file could not be read (e.g. it was removed after its header was read).
    """
    local = local_log(path)
    digest = hashlib.sha256()
    size = 0
    try:
        with open(local, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise LogReadError(
            _named(LogReadError(f"{path}: unreadable file ({_one_line(exc)})"), local, path)
        ) from exc
    return digest.hexdigest(), size


# A flow reads each log's header several times (planning, warming the pool, ingest): per process,
# the last few headers are kept while the file's (inode, mtime, size) is unchanged.
_HEADERS: dict[tuple[str, int, int, int], EvalLog] = {}
_HEADERS_KEPT = 64


def read_header(path: str, *, fast: bool = True, limits: InflateLimits | None = None) -> EvalLog:
    """The log's header, equal to `read_eval_log(path, header_only=True)`.

    A local `.eval` is read straight from the archive (warehouse.eval_archive, 25-40x faster on
    big logs); the result is shared between callers in this process, so treat it as read-only.

    Args:
        path: the log.
        fast: False always reads with Inspect's reader, uncached (the reference in tests).
        limits: how far its members may inflate (default: InflateLimits.from_env()).

    Raises:
        LogReadError: the path is not a readable Inspect log, or its header is over the limits.
    """
    if is_remote(path):  # read from its local copy, named by its URL
        local = local_log(path)
        try:
            return read_header(local, fast=fast, limits=limits)
        except LogReadError as exc:
            raise LogReadError(_named(exc, local, path)) from exc
    key = None
    if fast and not is_remote(path):
        try:
            st = Path(path).stat()
            key = (path, st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            pass  # Inspect's reader words the error
    if key is not None and key in _HEADERS:
        return _HEADERS[key]
    limits = limits or InflateLimits.from_env()
    try:
        direct = eval_archive.read_header(path, limits) if fast else None
        if direct is None:
            check_for_inspect(path, limits, _is_header_member)
        header = direct or read_eval_log(path, header_only=True)
    except InflateRefused as exc:
        raise LogReadError(f"{path}: refused ({exc})") from exc
    except Exception as exc:  # any parse failure means the same thing to the user
        raise LogReadError(unreadable_log(path, exc)) from exc
    if key is not None:
        if len(_HEADERS) >= _HEADERS_KEPT:
            del _HEADERS[next(iter(_HEADERS))]
        _HEADERS[key] = header
    return header


def _is_header_member(name: str) -> bool:
    """What Inspect's header-only read may read: the header (or the journal's start record and
    config updates) and reductions; never a sample or the summaries."""
    return not name.startswith(("samples/", "_journal/summaries/")) and name != "summaries.json"


def check_for_inspect(path: str, limits: InflateLimits, members: Any) -> None:
    """Before Inspect's reader reads `path`: a `.json` log must fit the per-member limit (it is
    read whole); each `.eval` member for which `members(name)` is true is inflated within the
    limits and dropped, since that reader inflates a member whole, unchecked.

    Raises:
        InflateRefused: one line naming the member.
        zipfile.BadZipFile, OSError, ...: a member that does not inflate (Inspect's reader
            then words it).
    """
    if path.endswith(".json"):
        with fsspec.open(path, "rb") as f:
            size = f.size if hasattr(f, "size") else f.seek(0, 2)
        if size > limits.member_bytes:
            raise InflateRefused(
                f"a .json log is read whole, and this one is {size / (1 << 20):,.0f} MB, over the "
                f"{limits.member_bytes / (1 << 20):,.0f} MB limit per member; convert it "
                "(`inspect log convert --to eval`) or raise --max-member-mb"
            )
        return
    if not path.endswith(".eval"):
        return
    budget = limits.budget()
    with fsspec.open(path, "rb") as f, zipfile.ZipFile(f) as archive:
        infos = {i.filename: i for i in archive.infolist()}  # the last of a repeated name
        for info in infos.values():
            if members(info.filename):
                inflate(f, info, budget, keep=False)


def unreadable_log(path: str, exc: BaseException) -> str:
    """Why a log could not be read, in words, and what to do: one line."""
    text = str(exc)
    if path.endswith(".eval") and (
        isinstance(exc, zipfile.BadZipFile) or "EOCD" in text or "zip file" in text.lower()
    ):
        # a .eval is a zip: its directory is written last, so a file cut short has none
        return (
            f"{path}: unreadable Inspect log (not a complete .eval archive: it ends before its "
            f"zip directory, so it was cut short while written or copied; {_one_line(exc)}); "
            "copy it again, or re-run its generation; if its eval crashed on this machine, "
            "`inspect log recover --list` tells whether Inspect can rebuild it"
        )
    if path.endswith(".eval") and isinstance(exc, KeyError):
        # a zip, but with neither the header Inspect writes last nor the journal it starts with
        return (
            f"{path}: not an Inspect log (a zip archive without Inspect's header.json or "
            "_journal/start.json); point at the .eval files Inspect wrote"
        )
    if path.endswith(".json") and isinstance(exc, ValueError):
        return (
            f"{path}: unreadable Inspect log (not complete JSON: {_one_line(exc)}); copy it "
            "again, or re-run its generation"
        )
    return (
        f"{path}: unreadable Inspect log ({_one_line(exc)}); check that Inspect wrote it "
        f"(`inspect log dump --header-only {path}` shows what Inspect reads)"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclass(frozen=True)
class RunRow:
    run_id: str
    values: dict[str, Any]


def run_row(
    header: EvalLog, path: str, sha256: str, size: int, stamp: LogStamp | None = None
) -> RunRow:
    """The `wh.runs` row of a log; `stamp` is the file's stat taken before `sha256` was."""
    spec = header.eval
    results = header.results
    return RunRow(
        spec.eval_id,
        {
            "run_id": spec.eval_id,
            "inspect_run_id": spec.run_id,
            "task": spec.task,
            "task_id": spec.task_id,
            "task_version": str(spec.task_version),
            "task_args": _json(spec.task_args),
            "model": spec.model,
            "model_args": _json(spec.model_args),
            "created": timestamp(spec.created),
            "status": header.status,
            "epochs": spec.config.epochs or 1,
            "dataset_samples": spec.dataset.samples,
            "total_samples": results.total_samples if results else None,
            "log_path": path,
            "log_sha256": sha256,
            "log_size": size,
            "inspect_version": spec.packages.get("inspect_ai") if spec.packages else None,
            "eval_spec": spec.model_dump_json(exclude_none=True),
            "plan": header.plan.model_dump_json(exclude_none=True) if header.plan else None,
            **(stamp.columns() if stamp is not None else NO_STAMP),
        },
    )


def iter_sample_columns(
    path: str,
    header: EvalLog,
    run_id: str,
    have: set[SampleKey],
    *,
    batch_size: int | None = None,
    fast: bool = True,
    limits: InflateLimits | None = None,
) -> Iterator[SampleColumns]:
    """Yield the log's samples that are not in `have` as rows, `batch_size` samples at a time.

    A local `.eval` written by the installed Inspect version is read directly from the archive
    (warehouse.eval_archive, 15-25x faster); every other log through Inspect's readers. Both give
    the same rows. A partial (cancelled, interrupted) log yields the samples it holds.

    A sample that cannot be read, or whose member would inflate past `limits` (default:
    InflateLimits.from_env()), is listed in its batch's `bad` (`BadSample`) and the others
    are still yielded; in a `.eval` log the members of the samples in `have` are checked too.

    Args:
        path: the log.
        header: its header (`read_header`), which says who wrote it.
        run_id: the run the rows belong to.
        have: (sample id, epoch) pairs already stored, skipped.
        batch_size: samples per yielded batch; None for each reader's default (500 through
            Inspect, up to 5,000 or 64 MB of sample JSON through the archive).
        fast: False forces Inspect's readers (the reference the direct reader is tested against).
        limits: how far the log's members may inflate.

    Raises:
        LogReadError: the log as a whole cannot be read (its archive, sample list or JSON), or
            is over the limits (the per-log one, or a `.json` log over the per-member one).
    """
    if is_remote(path):  # read from its local copy, named by its URL
        local = local_log(path)
        try:
            yield from iter_sample_columns(
                local, header, run_id, have, batch_size=batch_size, fast=fast, limits=limits
            )
        except LogReadError as exc:
            raise LogReadError(_named(exc, local, path)) from exc
        return
    limits = limits or InflateLimits.from_env()
    try:
        if fast and eval_archive.applies(path, header):
            yield from eval_archive.iter_sample_columns(
                path, run_id, have, batch_size=batch_size or eval_archive.DIRECT_BATCH,
                limits=limits,
            )  # fmt: skip
        elif path.endswith(".eval"):
            yield from _eval_columns(path, run_id, have, batch_size or SAMPLE_BATCH, limits)
        else:
            yield from _json_columns(path, run_id, have, batch_size or SAMPLE_BATCH, limits)
    except LogReadError:
        raise
    except InflateRefused as exc:
        raise LogReadError(f"{path}: refused ({exc})") from exc
    except Exception as exc:
        raise LogReadError(f"{path}: unreadable samples ({_one_line(exc)})") from exc


def _eval_columns(
    path: str, run_id: str, have: set[SampleKey], size: int, limits: InflateLimits
) -> Iterator[SampleColumns]:
    budget = limits.budget()
    with fsspec.open(path, "rb") as f:
        keyed = eval_archive.sample_members(f)
        damaged = eval_archive.stored_damage(f, keyed, have, budget) if have else []
        wanted = [(key, info) for key, info in keyed if key not in have]
        for start in range(0, max(len(wanted), 1), size):
            columns = SampleColumns(run_id)
            if start == 0:
                columns.bad.extend(damaged)
            readable = []
            over: LogTooBig | None = None
            for key, info in wanted[start : start + size]:
                # Inspect's reader inflates a member whole: first within the limits, here
                try:
                    inflate(f, info, budget, keep=False)
                except LogTooBig as exc:
                    over = exc  # what this batch read so far is kept: yielded below
                    break
                except eval_archive.MEMBER_ERRORS as exc:
                    columns.bad.append(eval_archive.bad_sample(key, exc))
                    continue
                readable.append(key)
            # events are the transcript's tracing detail: messages + output carry what scoring
            # needs
            eval_archive.add_via_inspect(path, readable, columns)
            yield columns
            if over is not None:
                raise over


def _json_columns(
    path: str, run_id: str, have: set[SampleKey], size: int, limits: InflateLimits
) -> Iterator[SampleColumns]:
    check_for_inspect(path, limits, lambda name: True)
    log = read_eval_log(path, resolve_attachments=True)
    todo = [s for s in log.samples or [] if (str(s.id), s.epoch) not in have]
    for start in range(0, max(len(todo), 1), size):
        columns = SampleColumns(run_id)
        for sample in todo[start : start + size]:
            mark = columns.mark()
            try:
                columns.add_sample(sample)
            except Exception as exc:  # noqa: BLE001 - any failure is this one sample's
                columns.rollback(mark)
                columns.bad.append(BadSample(str(sample.id), sample.epoch, _one_line(exc)))
        yield columns


def sample_tables(run_id: str, samples: Iterable[EvalSample]) -> tuple[pa.Table, pa.Table]:
    """Arrow tables of samples and of their messages, in the warehouse's column order."""
    columns = SampleColumns(run_id)
    for sample in samples:
        columns.add_sample(sample)
    return columns.tables()


def _json(value: Any) -> str:
    return canonical_json(value)
