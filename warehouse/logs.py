"""Reading Inspect logs into Arrow batches (no database access here).

Inspect's own readers do the parsing, so every log version Inspect can read is readable here.
For `.eval` logs the sample summaries say which (id, epoch) members exist; only the ones the
warehouse lacks are then read, in batches through `read_eval_log_samples_by_id` (one shared zip
reader: `read_eval_log_samples` reopens the archive for every sample, ~13 ms each here). A
`.json` log is one JSON document, so it is read whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
from inspect_ai.log import (
    EvalLog,
    EvalSample,
    read_eval_log,
    read_eval_log_sample_summaries,
    read_eval_log_samples_by_id,
)

SAMPLE_BATCH = 500
SampleKey = tuple[str, int]

SAMPLES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("sample_id", pa.string()),
        ("epoch", pa.int32()),
        ("uuid", pa.string()),
        ("input", pa.string()),
        ("target", pa.list_(pa.string())),
        ("completion", pa.string()),
        ("error", pa.string()),
        ("error_traceback", pa.string()),
        ("output", pa.string()),
        ("metadata", pa.string()),
        ("store", pa.string()),
        ("model_usage", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("total_tokens", pa.int64()),
        ("total_time", pa.float64()),
        ("working_time", pa.float64()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("completed_at", pa.timestamp("us", tz="UTC")),
        ("n_messages", pa.int32()),
        ("ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)

MESSAGES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("sample_id", pa.string()),
        ("epoch", pa.int32()),
        ("idx", pa.int32()),
        ("role", pa.string()),
        ("text", pa.string()),
        ("tool_calls", pa.string()),
        ("tool_call_id", pa.string()),
        ("function", pa.string()),
        ("tool_error", pa.string()),
    ]
)


class LogReadError(Exception):
    """A path that is missing, not an Inspect log, or unreadable (message is one line)."""


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def check_log_path(path: str) -> None:
    """Fail early, in one line, on a path that cannot be an Inspect log."""
    if not path.endswith((".eval", ".json")):
        raise LogReadError(f"{path}: not an Inspect log (expected a .eval or .json file)")
    if not is_remote(path) and not Path(path).is_file():
        raise LogReadError(f"{path}: no such file: check the path")


def file_digest(path: str) -> tuple[str, int]:
    """sha256 and size of a log (local or any fsspec URL Inspect could read)."""
    digest = hashlib.sha256()
    size = 0
    with fsspec.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_header(path: str) -> EvalLog:
    try:
        return read_eval_log(path, header_only=True)
    except Exception as exc:  # any parse failure means the same thing to the user
        raise LogReadError(f"{path}: unreadable Inspect log ({_one_line(exc)})") from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclass(frozen=True)
class RunRow:
    run_id: str
    values: dict[str, Any]


def run_row(header: EvalLog, path: str, sha256: str, size: int) -> RunRow:
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
            "created": _timestamp(spec.created),
            "status": header.status,
            "epochs": spec.config.epochs or 1,
            "dataset_samples": spec.dataset.samples,
            "total_samples": results.total_samples if results else None,
            "log_path": path,
            "log_sha256": sha256,
            "log_size": size,
            "inspect_version": spec.packages.get("inspect_ai") if spec.packages else None,
            "eval_spec": spec.model_dump_json(exclude_none=True),
        },
    )


def iter_sample_batches(
    path: str, have: set[SampleKey], *, batch_size: int = SAMPLE_BATCH
) -> Iterator[list[EvalSample]]:
    """Yield the log's samples that are not in `have`, `batch_size` at a time.

    A partial (cancelled, interrupted) log yields the samples it holds.

    Raises:
        LogReadError: the log's samples cannot be read.
    """
    try:
        if path.endswith(".eval"):
            yield from _eval_batches(path, have, batch_size)
        else:
            yield from _json_batches(path, have, batch_size)
    except LogReadError:
        raise
    except Exception as exc:
        raise LogReadError(f"{path}: unreadable samples ({_one_line(exc)})") from exc


def _eval_batches(path: str, have: set[SampleKey], size: int) -> Iterator[list[EvalSample]]:
    wanted = [
        (s.id, s.epoch)
        for s in read_eval_log_sample_summaries(path)
        if (str(s.id), s.epoch) not in have
    ]
    for start in range(0, len(wanted), size):
        # events are the transcript's tracing detail: messages + output carry what scoring needs
        yield read_eval_log_samples_by_id(
            path, wanted[start : start + size], resolve_attachments=True, exclude_fields={"events"}
        )


def _json_batches(path: str, have: set[SampleKey], size: int) -> Iterator[list[EvalSample]]:
    log = read_eval_log(path, resolve_attachments=True)
    todo = [s for s in log.samples or [] if (str(s.id), s.epoch) not in have]
    for start in range(0, len(todo), size):
        yield todo[start : start + size]


def sample_tables(run_id: str, samples: Iterable[EvalSample]) -> tuple[pa.Table, pa.Table]:
    """Arrow tables of samples and of their messages, in the warehouse's column order."""
    now = datetime.now(UTC)
    cols: dict[str, list[Any]] = {name: [] for name in SAMPLES_SCHEMA.names}
    mcols: dict[str, list[Any]] = {name: [] for name in MESSAGES_SCHEMA.names}
    for s in samples:
        sid = str(s.id)
        usage = s.model_usage or {}
        output = s.output
        cols["run_id"].append(run_id)
        cols["sample_id"].append(sid)
        cols["epoch"].append(s.epoch)
        cols["uuid"].append(s.uuid)
        cols["input"].append(
            s.input
            if isinstance(s.input, str)
            else json.dumps([m.model_dump(mode="json", exclude_none=True) for m in s.input])
        )
        cols["target"].append([s.target] if isinstance(s.target, str) else list(s.target))
        cols["completion"].append(output.completion if output else "")
        cols["error"].append(s.error.message if s.error else None)
        cols["error_traceback"].append(s.error.traceback if s.error else None)
        cols["output"].append(output.model_dump_json(exclude_none=True) if output else None)
        cols["metadata"].append(_json(s.metadata or {}))
        cols["store"].append(_json(s.store or {}))
        cols["model_usage"].append(
            _json({m: u.model_dump(exclude_none=True) for m, u in usage.items()})
        )
        cols["input_tokens"].append(sum(u.input_tokens for u in usage.values()))
        cols["output_tokens"].append(sum(u.output_tokens for u in usage.values()))
        cols["total_tokens"].append(sum(u.total_tokens for u in usage.values()))
        cols["total_time"].append(s.total_time)
        cols["working_time"].append(s.working_time)
        cols["started_at"].append(_timestamp(s.started_at))
        cols["completed_at"].append(_timestamp(s.completed_at))
        cols["n_messages"].append(len(s.messages))
        cols["ingested_at"].append(now)
        for idx, m in enumerate(s.messages):
            mcols["run_id"].append(run_id)
            mcols["sample_id"].append(sid)
            mcols["epoch"].append(s.epoch)
            mcols["idx"].append(idx)
            mcols["role"].append(m.role)
            mcols["text"].append(m.text)
            calls = getattr(m, "tool_calls", None)
            mcols["tool_calls"].append(
                json.dumps([c.model_dump(mode="json", exclude_none=True) for c in calls])
                if calls
                else None
            )
            mcols["tool_call_id"].append(getattr(m, "tool_call_id", None))
            mcols["function"].append(getattr(m, "function", None))
            error = getattr(m, "error", None)
            mcols["tool_error"].append(error.message if error else None)
    return (
        pa.table(cols, schema=SAMPLES_SCHEMA),
        pa.table(mcols, schema=MESSAGES_SCHEMA),
    )


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def _timestamp(value: str | datetime | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
