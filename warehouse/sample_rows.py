"""The rows a sample becomes (samples + messages tables), from either of the two log readers.

Both readers (Inspect's models in warehouse.logs, the direct `.eval` archive reader in
warehouse.eval_archive) append into one `SampleColumns`, so the column definitions and their
JSON encodings exist once and the two paths cannot drift apart silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from inspect_ai.log import EvalSample

from warehouse.error_text import is_cancellation, readable_error

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
        # migration 10 (warehouse.task_state_columns): what a rebuilt TaskState needs
        ("choices", pa.list_(pa.string())),
        ("messages_json", pa.string()),
        ("sample_id_is_int", pa.bool_()),
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


@dataclass(frozen=True)
class BadSample:
    """A sample of a log that could not be read (the other samples of the log still are).

    `stored`: the sample was already in the warehouse (from an earlier copy of the log); its
    member in this copy is what is damaged. `refused`: its member would inflate past the
    ingest limits (warehouse.inflate), and `reason` says which and how to raise it.
    """

    sample_id: str
    epoch: int
    reason: str
    stored: bool = False
    refused: bool = False

    def line(self, path: str) -> str:
        """One line naming the log, the sample and why."""
        where = " (stored from an earlier copy; this copy's is damaged)" if self.stored else ""
        what = "refused" if self.refused else "unreadable"
        return f"{path}: sample {self.sample_id} epoch {self.epoch}{where}: {what} ({self.reason})"


# A lone UTF-16 surrogate (which JSON's \uXXXX escapes and Python's str allow) cannot be
# encoded as UTF-8, so neither Arrow nor DuckDB can hold it.
_SURROGATE = re.compile("[\ud800-\udfff]")


class SampleColumns:
    """Column lists for one batch of samples of one run; `tables()` turns them into Arrow.

    Args:
        run_id: the run every row belongs to.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.now = datetime.now(UTC)
        self.cols: dict[str, list[Any]] = {name: [] for name in SAMPLES_SCHEMA.names}
        self.mcols: dict[str, list[Any]] = {name: [] for name in MESSAGES_SCHEMA.names}
        # how many of these samples the direct archive reader handed to Inspect's reader
        self.via_inspect = 0
        # set by a reader that knows this is the log's final batch
        self.last = False
        # samples of this batch (or, in the first batch, already stored ones) that could not
        # be read: reported, and the run is not marked complete
        self.bad: list[BadSample] = []
        # the scores the log holds for these samples (warehouse.recorded_scores):
        # (sample_id, epoch, scorer key, Score or its dict, completed_at)
        self.recorded: list[tuple[str, int, str, Any, datetime | None]] = []
        # samples of this batch cancelled in flight (`skips`): not generated, so not stored
        self.cancelled = 0

    def skips(self, error_message: str | None) -> bool:
        """Whether a sample with this error is left out, and counted as cancelled: one in
        flight when its eval was cancelled was not generated (warehouse.error_text). Not
        stored, it counts as a sample the run did not generate (coverage), never as an
        error, and a re-run of the eval generates it."""
        if not is_cancellation(error_message):
            return False
        self.cancelled += 1
        return True

    def __len__(self) -> int:
        return len(self.cols["run_id"])

    def add_sample(self, s: EvalSample) -> None:
        """Append one sample read through Inspect's models (the reference encoding); a
        sample cancelled in flight is counted instead (`skips`)."""
        if self.skips(s.error.message if s.error else None):
            return
        usage = s.model_usage or {}
        output = s.output
        self.add_row(
            sample_id=str(s.id),
            epoch=s.epoch,
            uuid=s.uuid,
            input=s.input
            if isinstance(s.input, str)
            else json.dumps([m.model_dump(mode="json", exclude_none=True) for m in s.input]),
            target=[s.target] if isinstance(s.target, str) else list(s.target),
            completion=output.completion if output else "",
            error=s.error.message if s.error else None,
            error_traceback=s.error.traceback if s.error else None,
            output=_output_json(output) if output else None,
            metadata=json_safe(canonical_json(s.metadata or {})),
            store=json_safe(canonical_json(s.store or {})),
            model_usage=json_safe(
                canonical_json({m: u.model_dump(exclude_none=True) for m, u in usage.items()})
            ),
            input_tokens=sum(u.input_tokens for u in usage.values()),
            output_tokens=sum(u.output_tokens for u in usage.values()),
            total_tokens=sum(u.total_tokens for u in usage.values()),
            total_time=s.total_time,
            working_time=s.working_time,
            started_at=timestamp(s.started_at),
            completed_at=timestamp(s.completed_at),
            n_messages=len(s.messages),
            choices=list(s.choices) if s.choices is not None else None,
            messages_json=json_safe(messages_json(s.messages)),
            sample_id_is_int=isinstance(s.id, int),
        )
        sid = str(s.id)
        for key, score in (s.scores or {}).items():
            self.recorded.append((sid, s.epoch, key, score, timestamp(s.completed_at)))
        for idx, m in enumerate(s.messages):
            # ToolCall is a dataclass: the message's own serializer is what dumps it
            calls = (
                m.model_dump(mode="json", exclude_none=True, include={"tool_calls"}).get(
                    "tool_calls"
                )
                if getattr(m, "tool_calls", None)
                else None
            )
            error = getattr(m, "error", None)
            self.add_message(
                sample_id=sid,
                epoch=s.epoch,
                idx=idx,
                role=m.role,
                text=m.text,
                tool_calls=json_safe(json.dumps(calls)) if calls else None,
                tool_call_id=getattr(m, "tool_call_id", None),
                function=getattr(m, "function", None),
                tool_error=error.message if error else None,
            )

    def add_row(self, **values: Any) -> None:
        """Append one sample row; `values` are the SAMPLES_SCHEMA columns but run/ingest time."""
        cols = self.cols
        cols["run_id"].append(self.run_id)
        cols["ingested_at"].append(self.now)
        for name, value in values.items():
            cols[name].append(value)

    def add_message(self, **values: Any) -> None:
        """Append one message row; `values` are the MESSAGES_SCHEMA columns but run_id."""
        mcols = self.mcols
        mcols["run_id"].append(self.run_id)
        for name, value in values.items():
            mcols[name].append(value)

    def mark(self) -> tuple[int, int, int]:
        """The current number of sample, message and recorded score rows (for `rollback`)."""
        return len(self.cols["run_id"]), len(self.mcols["run_id"]), len(self.recorded)

    def rollback(self, mark: tuple[int, int, int]) -> None:
        """Drop whatever was appended since `mark` (a sample that failed half-way)."""
        for columns, n in ((self.cols, mark[0]), (self.mcols, mark[1])):
            for values in columns.values():
                del values[n:]
        del self.recorded[mark[2] :]

    def tables(self, server: str | None = None) -> tuple[pa.Table, pa.Table]:
        """The samples table and the messages table, in the warehouse's column order.

        Args:
            server: what the run talked to ("<model> at <url>"), named in a generation error
                that Inspect stored as a bare RetryError (warehouse.error_text).

        Text holding a lone surrogate (model output is arbitrary) is stored with U+FFFD in its
        place: the only part of such a sample that cannot be kept as it is.
        """
        cols = self.cols
        if any(e is not None for e in cols["error"]):
            cols["error"] = [
                readable_error(e, tb, server)
                for e, tb in zip(cols["error"], cols["error_traceback"], strict=True)
            ]
        try:
            return (
                pa.table(self.cols, schema=SAMPLES_SCHEMA),
                pa.table(self.mcols, schema=MESSAGES_SCHEMA),
            )
        except UnicodeEncodeError:
            return (
                pa.table(repaired(self.cols), schema=SAMPLES_SCHEMA),
                pa.table(repaired(self.mcols), schema=MESSAGES_SCHEMA),
            )


def repaired(cols: dict[str, list[Any]]) -> dict[str, list[Any]]:
    def fix(value: Any) -> Any:
        if isinstance(value, str):
            return _SURROGATE.sub("\ufffd", value)
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return {name: [fix(v) for v in values] for name, values in cols.items()}


_MESSAGES_ADAPTER: Any = None


def messages_json(messages: list[Any]) -> str:
    """A transcript's messages as the JSON Inspect's log writer gives them (so the direct
    archive reader, which keeps those bytes, stores the same text)."""
    global _MESSAGES_ADAPTER
    if _MESSAGES_ADAPTER is None:
        from inspect_ai.model import ChatMessage
        from pydantic import TypeAdapter

        _MESSAGES_ADAPTER = TypeAdapter(list[ChatMessage])
    try:
        return _MESSAGES_ADAPTER.dump_json(messages, exclude_none=True).decode()
    except ValueError:  # pydantic's serializer refuses a lone surrogate
        return json.dumps(
            _MESSAGES_ADAPTER.dump_python(messages, mode="json", exclude_none=True),
            separators=(",", ":"),
        )


def _output_json(output: Any) -> str:
    try:
        return output.model_dump_json(exclude_none=True)
    except ValueError:  # pydantic's serializer refuses a lone surrogate
        return json_safe(
            json.dumps(output.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
        )


# In JSON text: an escaped backslash, a valid surrogate pair, or a lone surrogate escape.
_ESCAPES = re.compile(
    r"(\\\\)|(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)


def json_safe(text: str) -> str:
    """JSON text with lone surrogate escapes (which DuckDB's JSON type refuses) as U+FFFD."""
    if "\\ud" not in text and "\\uD" not in text:
        return text
    return _ESCAPES.sub(lambda m: "\\ufffd" if m.group(3) else m.group(0), text)


def canonical_json(value: Any) -> str:
    """The text stored in metadata-like JSON columns (sorted keys, so equal dicts compare equal)."""
    return json.dumps(value, default=str, sort_keys=True)


def timestamp(value: str | datetime | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
