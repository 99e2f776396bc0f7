"""What the report shows, as plain data: `summary` fills it from the warehouse's views, `html`
and `charts` draw it. Strings in it came from models and logs: whoever draws them escapes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "FLIPS_SHOWN",
    "CoverageRow",
    "FingerprintChange",
    "FlipRow",
    "GateRow",
    "HistoryPoint",
    "ReportData",
]

FLIPS_SHOWN = 50  # per verifier change; the rest are one SQL query away


@dataclass(frozen=True)
class HistoryPoint:
    task: str
    model: str
    scorer: str
    fingerprint: str
    created: datetime
    run_id: str
    accuracy: float | None
    accuracy_strict: float | None
    n_samples: int


@dataclass(frozen=True)
class FlipRow:
    """One sample whose verdict differs between the two fingerprints of a verifier change,
    read from the version before the change (`old_*`) to the one after it (`new_*`)."""

    scorer: str
    run_id: str
    sample_id: str
    epoch: int
    old_fingerprint: str
    new_fingerprint: str
    old_value: float | None
    new_value: float | None
    old_status: str
    new_status: str
    old_answer: str | None
    new_answer: str | None
    new_explanation: str | None
    task: str = "?"
    model: str = "?"


@dataclass
class FingerprintChange:
    """A verifier's code changed (an edit, a revert): from `previous` to `fingerprint`.

    Attributes:
        registered: when a command first found the code at `fingerprint`.
        revert: `fingerprint` was current before (an edit was undone).
        flips: the samples whose verdict differs between the two versions (the first few).
        n_flips: how many there are in all.
        n_both: samples graded by both versions (0: no re-score since the change).
    """

    scorer: str
    fingerprint: str
    label: str
    registered: datetime | None
    previous: str | None = None
    revert: bool = False
    flips: list[FlipRow] = field(default_factory=list)
    n_flips: int = 0
    n_both: int = 0


@dataclass(frozen=True)
class GateRow:
    run_id: str
    task: str
    model: str
    verdict: str
    created: datetime
    failing: list[str]
    accuracy: float | None
    accuracy_strict: float | None
    baseline_run_id: str | None = None


@dataclass(frozen=True)
class CoverageRow:
    run_id: str
    task: str
    model: str
    scorer: str
    fingerprint: str
    n_samples: int
    n_correct: int
    n_scored: int
    n_unscored: int
    n_error: int
    accuracy: float | None
    accuracy_strict: float | None

    @property
    def n_missing(self) -> int:
        return max(0, self.n_samples - self.n_scored - self.n_unscored - self.n_error)


@dataclass
class ReportData:
    """Everything the report shows; each list may be empty (the section then says so).

    `newest`: each scorer's newest fingerprint (the current code's), drawn in full colour;
    older versions' history is drawn faded.
    """

    title: str = "gradebook report"
    generated: datetime | None = None
    warehouse: str = ""
    history: list[HistoryPoint] = field(default_factory=list)
    fingerprint_changes: list[FingerprintChange] = field(default_factory=list)
    gates: list[GateRow] = field(default_factory=list)
    coverage: list[CoverageRow] = field(default_factory=list)
    newest: dict[str, str] = field(default_factory=dict)
