"""Sample rows read straight out of a local `.eval` archive, without Inspect's pydantic models.

Why: Inspect's reader validates every sample into models, which makes ingest many times slower
than `inspect_ai.analysis.samples_df`. A `.eval` file is a zip whose members are
Zstandard-compressed JSON written by pydantic's serializer (`samples/<id>_epoch_<n>.json`).
This module decompresses each member with `zstandard`, decodes only the fields the warehouse
stores with `msgspec` (which skips the transcript `events` without building them), and keeps the
serializer's own bytes for the `output` column.

The rows must equal what Inspect's reader produces (tests/test_ingest_fast.py compares the two
table for table), so this path is used only where that holds by construction: a local `.eval`
written by the installed Inspect version, whose members are exactly what the same models dump.
Everything else goes to Inspect's reader: logs from other Inspect versions (their validators may
migrate fields on load), `.json` logs, remote paths, and, one sample at a time, any sample whose
input or messages reference attachments or whose JSON this decoder does not accept.

The header (`read_header`) is read the way Inspect reads it, `EvalLog.model_validate` of the
`header.json` member (and its `reductions.json`), so it holds for a log of any Inspect version.
What is skipped is opening the zip (warehouse.zip_members finds the two entries needed).
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

import inspect_ai
import msgspec
import zstandard
from inspect_ai.log import (
    EvalLog,
    EvalSampleReductions,
    read_eval_log_sample,
    read_eval_log_samples_by_id,
)

from warehouse.inflate import InflateLimits, InflateRefused, LogBudget, LogTooBig, inflate
from warehouse.sample_rows import (
    BadSample,
    SampleColumns,
    canonical_json,
    json_safe,
    timestamp,
)
from warehouse.zip_members import central_entries, header_member, member_data

SampleKey = tuple[str, int]

# Samples per write transaction on this path: each transaction costs a connect and a
# checkpoint, so batches are larger than Inspect's path's; the byte cap bounds memory.
DIRECT_BATCH = 5000
DIRECT_BATCH_BYTES = 64 << 20

_SAMPLES_DIR = "samples/"
_EPOCH_SEP = "_epoch_"

_REDUCTIONS_JSON = b"reductions.json"
# Attachment references (and their older `tc://` spelling) are resolved by Inspect's reader.
_ATTACHMENT_MARKERS = (b"attachment://", b"tc://")


def applies(path: str, header: EvalLog) -> bool:
    """Whether `path` can be read by this module with rows identical to Inspect's reader."""
    if not path.endswith(".eval") or "://" in path:
        return False
    packages = header.eval.packages or {}
    return packages.get("inspect_ai") == inspect_ai.__version__


def read_header(path: str, limits: InflateLimits | None = None) -> EvalLog | None:
    """The log's header as `read_eval_log(path, header_only=True)` gives it, or None when that
    reader must do it: not a local `.eval`, no `header.json` (a log still being written), or
    anything else this reader does not expect.

    Raises:
        InflateRefused: `header.json` or `reductions.json` inflates past `limits` (default:
            InflateLimits.from_env()): Inspect's reader must not try it either.
    """
    if not path.endswith(".eval") or "://" in path:
        return None
    limits = limits or InflateLimits.from_env()
    try:
        from inspect_ai._util.constants import get_deserializing_context

        header = header_member(path, limits)  # read once per process (zip_members)
        if header is None:
            return None
        with open(path, "rb") as f:
            entries = central_entries(f, (_REDUCTIONS_JSON,)) or {}
            reductions = entries.get(_REDUCTIONS_JSON)
            reduced = (
                json.loads(member_data(f, reductions, limits.budget())) if reductions else None
            )
        log = EvalLog.model_validate(header, context=get_deserializing_context())
        if reduced is not None and log.results is not None:
            log.reductions = [
                EvalSampleReductions.model_validate(r, context=get_deserializing_context())
                for r in reduced
            ]
    except InflateRefused:
        raise
    except Exception:  # noqa: BLE001 - Inspect's reader decides, and words any real error
        return None
    log.location = path
    return log


class _Sample(msgspec.Struct):
    id: int | str
    epoch: int
    input: msgspec.Raw
    target: str | list[str]
    messages: msgspec.Raw
    output: msgspec.Raw = msgspec.Raw(b"null")  # msgspec cannot put Raw in a union
    metadata: dict[str, Any] = {}
    store: dict[str, Any] = {}
    model_usage: dict[str, dict[str, Any]] = {}
    error: dict[str, Any] | None = None
    uuid: str | None = None
    total_time: float | None = None
    working_time: float | None = None
    started_at: str | None = None
    completed_at: str | None = None
    choices: list[str] | None = None
    scores: dict[str, dict[str, Any]] | None = None


class _Message(msgspec.Struct):
    role: str
    content: str | list[dict[str, Any]]
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function: str | None = None
    error: dict[str, Any] | None = None


class _Output(msgspec.Struct):
    completion: str = ""


_decode_sample = msgspec.json.Decoder(_Sample).decode
_decode_messages = msgspec.json.Decoder(list[_Message]).decode
_decode_output = msgspec.json.Decoder(_Output).decode
_decode_any = msgspec.json.Decoder().decode


class _NotFast(Exception):
    """This sample needs Inspect's reader."""


def iter_sample_columns(
    path: str,
    run_id: str,
    have: set[SampleKey],
    *,
    batch_size: int = DIRECT_BATCH,
    max_batch_bytes: int = DIRECT_BATCH_BYTES,
    limits: InflateLimits | None = None,
) -> Iterator[SampleColumns]:
    """Yield the archive's samples not in `have` as filled `SampleColumns`.

    A batch holds at most `batch_size` samples and stops growing once its members' decompressed
    size reaches `max_batch_bytes` (long agent transcripts make fewer samples per batch). A
    member name repeated in the archive resolves to its last entry, as Inspect's readers do.

    One damaged sample does not stop the others: a member that does not decompress, fails its
    CRC, or that neither this decoder nor Inspect's reader accepts is listed in its batch's
    `bad` and skipped. The members of samples in `have` are checked too (decompressed and
    CRC-checked, not decoded), so a damaged copy of a stored log is not taken for a good one;
    their failures are in the first batch's `bad`. At least one batch is yielded, the last with
    `last` set.

    Members are inflated within `limits` (default: InflateLimits.from_env()): a sample whose
    member would inflate past them is refused, as a damaged one is (`BadSample.refused`).

    Raises:
        zipfile.BadZipFile, OSError: the archive itself (its directory) cannot be read.
        LogTooBig: the members read add up to more than the log's limit (the batches yielded
            before it hold what was read).
    """
    keyed = sample_members(path)
    wanted = [(key, info) for key, info in keyed if key not in have]
    budget = (limits or InflateLimits.from_env()).budget()
    with open(path, "rb") as f:
        damaged = stored_damage(f, keyed, have, budget)
        batches = list(_batches(wanted, batch_size, max_batch_bytes)) or [[]]
        for number, batch in enumerate(batches, start=1):
            columns = SampleColumns(run_id)
            columns.last = number == len(batches)
            if number == 1:
                columns.bad.extend(damaged)
            slow: list[tuple[str, int]] = []
            over: LogTooBig | None = None
            for key, info in batch:
                try:
                    raw = inflate(f, info, budget)
                except LogTooBig as exc:
                    over = exc  # what this batch read so far is kept: yielded below
                    break
                except MEMBER_ERRORS as exc:
                    columns.bad.append(bad_sample(key, exc))
                    continue
                mark = columns.mark()
                try:
                    _add_raw_sample(columns, raw)
                except (_NotFast, msgspec.DecodeError, msgspec.ValidationError):
                    columns.rollback(mark)
                    slow.append(key)
            columns.via_inspect = len(slow)
            if slow:
                add_via_inspect(path, slow, columns)
            if over is not None:
                columns.last = False
                yield columns
                raise over
            yield columns


# What one damaged or refused member raises (the archive's directory was read fine); a log
# over its limit (LogTooBig) stops the log instead.
MEMBER_ERRORS = (
    zipfile.BadZipFile, zstandard.ZstdError, zlib.error, OSError, ValueError, struct.error,
    InflateRefused,
)  # fmt: skip


def sample_members(path: str) -> list[tuple[SampleKey, zipfile.ZipInfo]]:
    """The sample members of a `.eval` archive, keyed (id, epoch), from its central directory.

    Raises:
        zipfile.BadZipFile, OSError: the archive's directory cannot be read.
    """
    with zipfile.ZipFile(path) as archive:
        # dict keeps the last entry of a repeated name (a re-logged sample supersedes)
        members = {i.filename: i for i in archive.infolist() if i.filename.startswith(_SAMPLES_DIR)}
    return [
        (key, info) for info in members.values() if (key := member_key(info.filename)) is not None
    ]


def stored_damage(
    f: Any, keyed: list[tuple[SampleKey, zipfile.ZipInfo]], have: set[SampleKey], budget: LogBudget
) -> list[BadSample]:
    """The samples in `have` whose members here fail to inflate (within `budget`) or their CRC:
    a damaged copy of a stored log is not taken for a good one.

    Raises:
        LogTooBig: the log's limit was reached.
    """
    damaged = []
    for key, info in keyed:
        if key in have:
            try:
                inflate(f, info, budget, keep=False)
            except LogTooBig:
                raise
            except MEMBER_ERRORS as exc:
                damaged.append(bad_sample(key, exc, stored=True))
    return damaged


def bad_sample(key: SampleKey, exc: BaseException, *, stored: bool = False) -> BadSample:
    """The `BadSample` of a member that could not be read (or was refused: over a limit)."""
    if isinstance(exc, InflateRefused):
        return BadSample(key[0], key[1], str(exc), stored=stored, refused=True)
    return BadSample(key[0], key[1], _one_line(exc), stored=stored)


def add_via_inspect(path: str, keys: list[tuple[str, int]], columns: SampleColumns) -> None:
    """Append these samples of a `.eval` log, read with Inspect's reader; a sample it cannot
    read goes to `columns.bad` and the others are still added."""

    def read(part: list[tuple[str, int]]) -> list[Any]:
        # Inspect finds a member by f"{id}_epoch_{epoch}", so the str id finds int ids too
        return read_eval_log_samples_by_id(
            path, part, resolve_attachments=True, exclude_fields={"events"}
        )

    try:
        samples = read(keys)
    except Exception:  # noqa: BLE001 - one bad sample fails the call: find which, one by one
        samples = []
    got = set()
    for sample in samples:
        key = (str(sample.id), sample.epoch)
        got.add(key)
        _add_checked(columns, key, lambda s=sample: s)
    for key in keys:
        if (str(key[0]), key[1]) not in got:
            _add_checked(columns, key, lambda k=key: _one_sample(path, k, read))


def _one_sample(path: str, key: tuple[str, int], read: Any) -> Any:
    try:
        samples = read([key])
        if samples:
            return samples[0]
    except Exception:  # noqa: BLE001, S110 - the whole-sample reader below decides
        pass
    # The streaming reader that skips `events` is stricter than Inspect's whole-member one
    # (invalid UTF-8, e.g. an encoded lone surrogate, fails it): a sample that Inspect reads
    # at all is kept.
    return read_eval_log_sample(path, key[0], key[1], resolve_attachments=True)


def _add_checked(columns: SampleColumns, key: tuple[str, int], get: Any) -> None:
    mark = columns.mark()
    try:
        columns.add_sample(get())
    except Exception as exc:  # noqa: BLE001 - any failure is this one sample's
        columns.rollback(mark)
        columns.bad.append(BadSample(str(key[0]), key[1], _one_line(exc)))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _batches(
    wanted: list[tuple[SampleKey, zipfile.ZipInfo]], size: int, max_bytes: int
) -> Iterator[list[tuple[SampleKey, zipfile.ZipInfo]]]:
    batch: list[tuple[SampleKey, zipfile.ZipInfo]] = []
    nbytes = 0
    for item in wanted:
        batch.append(item)
        nbytes += item[1].file_size
        if len(batch) >= size or nbytes >= max_bytes:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def member_key(name: str) -> SampleKey | None:
    stem = name[len(_SAMPLES_DIR) :]
    if not stem.endswith(".json"):
        return None
    sid, sep, epoch = stem[: -len(".json")].rpartition(_EPOCH_SEP)
    if not sep or not epoch.isdigit():
        return None
    return sid, int(epoch)


def _add_raw_sample(columns: SampleColumns, raw: bytes | bytearray) -> None:
    """Append one sample's rows (a cancelled one is only counted: `SampleColumns.skips`), or
    raise `_NotFast` having appended nothing."""
    s = _decode_sample(raw)
    message = s.error.get("message") if s.error else None
    if isinstance(message, str) and columns.skips(message):
        return
    raw_input, raw_messages, raw_output = bytes(s.input), bytes(s.messages), bytes(s.output)
    if raw_output == b"null" or any(
        marker in raw_input or marker in raw_messages for marker in _ATTACHMENT_MARKERS
    ):
        raise _NotFast
    decoded_input = _decode_any(raw_input)
    if isinstance(decoded_input, str):
        input_text = decoded_input
    elif isinstance(decoded_input, list):
        # the same Inspect version's models dump exactly these dicts back
        input_text = json.dumps(decoded_input)
    else:
        raise _NotFast
    completion = _decode_output(raw_output).completion
    messages = _decode_messages(raw_messages)
    try:
        texts = [
            m.content
            if isinstance(m.content, str)
            else "\n".join(c["text"] for c in m.content if c.get("type") == "text")
            for m in messages
        ]
        usage = s.model_usage
        tokens = [
            sum(u.get(name, 0) for u in usage.values())
            for name in ("input_tokens", "output_tokens", "total_tokens")
        ]
        error_message = s.error["message"] if s.error else None
        tool_errors = [m.error["message"] if m.error else None for m in messages]
        started, completed = timestamp(s.started_at), timestamp(s.completed_at)
        output_text = raw_output.decode()
    except (KeyError, TypeError, ValueError) as exc:
        raise _NotFast from exc

    sid = str(s.id)
    columns.add_row(
        sample_id=sid,
        epoch=s.epoch,
        uuid=s.uuid,
        input=input_text,
        target=[s.target] if isinstance(s.target, str) else s.target,
        completion=completion,
        error=error_message,
        error_traceback=s.error.get("traceback") if s.error else None,
        output=output_text,
        metadata=canonical_json(s.metadata),
        store=canonical_json(s.store),
        model_usage=canonical_json(usage),
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        total_tokens=tokens[2],
        total_time=s.total_time,
        working_time=s.working_time,
        started_at=started,
        completed_at=completed,
        n_messages=len(messages),
        choices=s.choices,
        messages_json=json_safe(raw_messages.decode()),
        sample_id_is_int=isinstance(s.id, int),
    )
    for key, score in (s.scores or {}).items():
        columns.recorded.append((sid, s.epoch, key, score, completed))
    for idx, (m, text, tool_error) in enumerate(zip(messages, texts, tool_errors, strict=True)):
        columns.add_message(
            sample_id=sid,
            epoch=s.epoch,
            idx=idx,
            role=m.role,
            text=text,
            tool_calls=json.dumps(m.tool_calls) if m.tool_calls else None,
            tool_call_id=m.tool_call_id,
            function=m.function,
            tool_error=tool_error,
        )
