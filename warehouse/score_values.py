"""An Inspect `Score` as gradebook's score columns, and those columns back as an Inspect `Score`.

One conversion for a score gradebook computes with an Inspect scorer (scorers.inspect_scorers)
and for a score a log already holds (warehouse.recorded_scores), so the two can be compared
row for row in `grade_flips`.

Values are read as Inspect's `value_to_float()` reads them: "C" 1, "P" 0.5, "I" and "N" 0,
booleans and numbers as numbers, "yes"/"true" 1, "no"/"false" 0, numeric strings as numbers.
Where Inspect would warn and count 0 (a list, any other string) the row is `unscored` with
reason `unconvertible_value`: a value nobody can read is not a wrong answer. `Score.unscored`
(value NaN) is `unscored` with the scorer's own reason. The raw value is kept in the row's
metadata (`inspect_value`), with the score's own reason and metadata.

A dict value (one score per key, e.g. {"accuracy": 1, "f1": 0.5}) gives a row for the score
itself (status `scored`, value NULL, reason `dict_value`) and one row per key, named
`<scorer>:<key>` (DICT_KEY_SEP), with that key's value.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DICT_KEY_SEP",
    "dict_key_rows",
    "metadata_json",
    "INSPECT_REASONS",
    "ScoreFields",
    "inspect_reason",
    "score_fields",
    "to_inspect_score",
]

DICT_KEY_SEP = ":"

# Inspect's own ScoreReason values (inspect_ai.scorer.ScoreReason)
INSPECT_REASONS = (
    "invalid_response_format",
    "refusal",
    "no_response",
    "grader_failed",
    "scoring_failed",
)

# gradebook's reason codes -> the ScoreReason that fits, for a Score written into a log; the
# finer code stays in the Score's metadata (`gradebook_reason`)
_REASON_MAP = {
    "no_answer": "invalid_response_format",
    "unparseable_answer": "invalid_response_format",
    "no_code": "invalid_response_format",
    "verifier_error": "scoring_failed",
    "verdict_unparseable": "grader_failed",
    "timeout": "scoring_failed",
    "sandbox_unavailable": "scoring_failed",
    "invalid_target": "scoring_failed",
    "unconvertible_value": "scoring_failed",
    "choice_marks_unknown": "scoring_failed",
    "state_not_stored": "scoring_failed",
    "no_score": "scoring_failed",
    "generation_error": "no_response",
}

_WORD_REASONS = {"C": "correct", "I": "incorrect", "P": "partial", "N": "no_answer"}
_NUMBER = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")


@dataclass(frozen=True)
class ScoreFields:
    """The score columns of one row (`key`: None for the score itself, else a dict key)."""

    status: str
    value: float | None
    answer: str | None
    explanation: str
    reason: str
    metadata: dict[str, Any] = field(default_factory=dict)
    key: str | None = None


def _as_float(value: Any) -> float | None:
    """value_to_float()'s reading of a scalar, or None where it would warn and count 0."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if value == "C":
        return 1.0
    if value == "P":
        return 0.5
    if value in ("I", "N"):
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        low = value.lower()
        if low in ("yes", "true"):
            return 1.0
        if low in ("no", "false"):
            return 0.0
        if _NUMBER.match(value):
            number = float(value)
            return number if math.isfinite(number) else None
    return None


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _json_value(value: Any) -> Any:
    """The raw value as JSON can hold it (NaN as the string "NaN")."""
    if _is_nan(value):
        return "NaN"
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return value


def _scalar(
    value: Any, base: dict[str, Any], reason: str | None, answer: str | None, explanation: str
) -> ScoreFields:
    if _is_nan(value):
        return ScoreFields(
            "unscored", None, answer, explanation or "the scorer left it unscored",
            reason or "unscored", base,
        )  # fmt: skip
    number = _as_float(value)
    if number is None or not math.isfinite(number):
        what = "no value" if value is None else f"{type(value).__name__} value {value!r:.60}"
        return ScoreFields(
            "unscored", None, answer,
            f"{what} has no number (Inspect's value_to_float would read it as 0)",
            "unconvertible_value", base,
        )  # fmt: skip
    word = _WORD_REASONS.get(value) if isinstance(value, str) else None
    return ScoreFields("scored", number, answer, explanation, reason or word or "scored", base)


def score_fields(score: Any) -> list[ScoreFields]:
    """The rows of one Inspect `Score` (or its dict form): the score itself first, then one
    per key of a dict value (`key` set)."""
    if isinstance(score, dict):
        value, answer = score.get("value"), score.get("answer")
        explanation, reason = score.get("explanation"), score.get("reason")
        meta = score.get("metadata")
    else:
        value, answer, explanation = score.value, score.answer, score.explanation
        reason, meta = score.reason, score.metadata
    if reason is None and isinstance(meta, dict) and meta.get("unscored_reason") is not None:
        reason = str(meta["unscored_reason"])  # logs from before Score.reason (0.3.245)
    answer = None if answer is None else str(answer)
    explanation = "" if explanation is None else str(explanation)
    base: dict[str, Any] = {"inspect_value": _json_value(value)}
    if reason is not None:
        base["inspect_reason"] = reason
    if meta:
        base["inspect_metadata"] = meta
    if not isinstance(value, dict):
        return [_scalar(value, base, reason, answer, explanation)]
    parent = ScoreFields(
        "scored", None, answer, explanation or f"{len(value)} values: {', '.join(map(str, value))}",
        reason or "dict_value", base,
    )  # fmt: skip
    rows = [parent]
    for key, item in value.items():
        row = _scalar(item, {"inspect_value": _json_value(item)}, None, answer, explanation)
        rows.append(
            ScoreFields(
                row.status,
                row.value,
                row.answer,
                row.explanation,
                row.reason,
                row.metadata,
                key=str(key),
            )  # fmt: skip
        )
    return rows


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def metadata_json(metadata: dict[str, Any]) -> str:
    """A row's metadata as the JSON DuckDB accepts (a NaN or infinity becomes its name)."""
    try:
        return json.dumps(metadata, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(metadata), default=str)


def inspect_reason(reason: str | None) -> str | None:
    """The Inspect ScoreReason for a gradebook reason code (the code itself where none fits)."""
    if reason is None or reason in INSPECT_REASONS:
        return reason
    return _REASON_MAP.get(reason, reason)


def to_inspect_score(
    status: str,
    value: float | None,
    answer: str | None,
    explanation: str | None,
    reason: str | None,
    metadata: dict[str, Any],
) -> Any:
    """A stored score row as the Inspect `Score` a log holds: an Inspect scorer's own value
    (C/I, a dict...) where the row keeps one, else the number; NaN (Inspect's unscored) for
    rows that are not `scored`; Inspect's ScoreReason where one fits, gradebook's own code in
    `metadata["gradebook_reason"]`."""
    from inspect_ai.scorer import Score

    meta = dict(metadata)
    raw = meta.pop("inspect_value", None)
    own_reason = meta.pop("inspect_reason", None)
    inner = meta.pop("inspect_metadata", None)
    out_meta = {"gradebook_status": status, "gradebook_reason": reason, **meta}
    if isinstance(inner, dict):
        out_meta = {**inner, **out_meta}
    if status != "scored":
        score_value: Any = math.nan
    elif raw is not None and raw != "NaN":
        score_value = raw
    else:
        score_value = value if value is not None else math.nan
    return Score(
        value=score_value,
        answer=answer,
        explanation=explanation,
        reason=own_reason or (inspect_reason(reason) if status != "scored" else None),
        metadata=out_meta,
    )


def dict_key_rows(table: Any) -> Any:
    """The `<scorer>:<key>` rows of the dict-valued scores among score rows (an Arrow table
    in SCORE_SCHEMA), or None when there are none: a dict-valued score's own row is `scored`
    with a NULL value and the dict in `metadata.inspect_value`. Same run, sample, epoch,
    fingerprint, attempt and time as its own row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    candidates = pc.and_(
        pc.equal(table.column("status"), "scored"), pc.is_null(table.column("value"))
    )
    if not pc.any(candidates).as_py():
        return None
    parents = table.filter(candidates).to_pylist()
    out: list[dict[str, Any]] = []
    for row in parents:
        try:
            raw = json.loads(row["metadata"] or "{}").get("inspect_value")
        except (json.JSONDecodeError, AttributeError):
            continue
        if not isinstance(raw, dict):
            continue
        for key, item in raw.items():
            fields = _scalar(item, {"inspect_value": item}, None, row["answer"],
                             row["explanation"] or "")  # fmt: skip
            out.append(
                {
                    **row,
                    "scorer": f"{row['scorer']}{DICT_KEY_SEP}{key}",
                    "status": fields.status,
                    "value": fields.value,
                    "explanation": fields.explanation,
                    "reason": fields.reason,
                    "metadata": metadata_json(fields.metadata),
                }
            )
    return pa.Table.from_pylist(out, schema=table.schema) if out else None
