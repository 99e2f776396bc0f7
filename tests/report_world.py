"""A warehouse of many nightly runs, written straight into its tables, for the report tests.

Hundreds of real Inspect evals would take minutes; the report reads only the warehouse's views,
so the runs, samples, verifier versions and fingerprint changes are inserted with SQL and the
scores go through the real `Warehouse.write_scores` (which also records the flip pairs that
`grade_flips` reads). The story: models improve night after night; at 60% of the nights a
verifier edit that accepts "7.0" for 7 is re-scored over every earlier run and reverted within
the minute; at 80% a second edit (the same leniency, for good) is re-scored over every run.
One night has a grader outage: 5 samples per run unscored. A checkpoint sweep (`sweep`) can
follow the nights: each checkpoint runs once per task, the later ones more accurate.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from warehouse import SCORE_SCHEMA, Warehouse

START = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
SAMPLES = 20
SCORER = "exact"
FP_A, FP_B, FP_C = "a" * 12 + "strict", "b" * 12 + "lenient", "c" * 12 + "lenient2"


@dataclass(frozen=True)
class Run:
    run_id: str
    task: str
    model: str
    created: datetime
    night: int


@dataclass(frozen=True)
class World:
    db: Path
    runs: list[Run]
    nights: int
    models: list[str]
    tasks: list[str]
    edit_at: datetime  # A -> B, re-scored, reverted at revert_at (B -> A), the same minute
    revert_at: datetime
    second_edit_at: datetime  # A -> C, re-scored over every run


def _answers(rng: random.Random, skill: float) -> list[str]:
    """Per sample: "right", "wrong" or "point-zero" (right only to a lenient verifier)."""
    out = []
    for _ in range(SAMPLES):
        u = rng.random()
        out.append("right" if u < skill else "point-zero" if u < skill + 0.1 else "wrong")
    return out


def _grade(kind: str, fp: str, outage: bool, i: int) -> tuple[str, float | None, str]:
    if outage and i < 5:
        return "unscored", None, "timeout"
    ok = kind == "right" or (kind == "point-zero" and fp != FP_A)
    return "scored", 1.0 if ok else 0.0, "verified_equal" if ok else "mismatch"


def build(
    root: Path,
    *,
    nights: int,
    models: list[str],
    tasks: list[str],
    sweep: Sequence[str] = (),
    sweep_skips: Collection[tuple[str, str]] = (),
) -> World:
    """len(models) × len(tasks) runs per night for `nights` nights (one run each when 1); then
    the checkpoints of `sweep` once per task, in order, the day after the last night (except
    the (checkpoint, task) pairs of `sweep_skips`)."""
    rng = random.Random(7)
    wh = Warehouse(root / "history.duckdb")
    runs: list[Run] = []
    kinds: dict[str, list[str]] = {}
    for night in range(nights):
        for m, model in enumerate(models):
            for t, task in enumerate(tasks):
                created = START + timedelta(days=night, minutes=7 * t + m)
                run = Run(f"run-{night:03d}-{m}-{t}", task, model, created, night)
                runs.append(run)
                skill = 0.3 + 0.5 * night / max(1, nights - 1) - 0.1 * (m % 3)
                kinds[run.run_id] = _answers(rng, skill)
    for c, ckpt in enumerate(sweep):
        for t, task in enumerate(tasks):
            if (ckpt, task) in sweep_skips:
                continue
            # a sweep runs its models one after another, each model's tasks side by side
            created = START + timedelta(days=nights, minutes=2 * c, seconds=t)
            run = Run(f"sweep-{c:03d}-{t}", task, ckpt, created, nights)
            runs.append(run)
            kinds[run.run_id] = _answers(rng, 0.15 + 0.7 * c / max(1, len(sweep) - 1))
    edit_night, second_night = int(nights * 0.6), int(nights * 0.8)
    edit_at = START + timedelta(days=edit_night, hours=12)
    revert_at = edit_at + timedelta(seconds=40)
    second_at = START + timedelta(days=second_night, hours=12)
    outage_night = nights - 3 if nights >= 5 else -1

    with wh.write() as con:
        con.executemany(
            "INSERT INTO wh.runs (run_id, task, model, created, status, epochs, n_samples, "
            "n_errors, ingest_state, first_ingested_at, ingested_at) "
            "VALUES (?, ?, ?, ?, 'success', 1, ?, 0, 'complete', ?, ?)",
            [(r.run_id, r.task, r.model, r.created, SAMPLES, r.created, r.created) for r in runs],
        )
        con.execute(
            "INSERT INTO wh.samples (run_id, sample_id, epoch, target, completion) "
            "SELECT r.run_id, printf('q%03d', i), 1, [i::VARCHAR], i::VARCHAR "
            "FROM (SELECT unnest(?::VARCHAR[]) AS run_id) r, range(?) t(i)",
            [[r.run_id for r in runs], SAMPLES],
        )
        versions = [
            (FP_A, START, "strict"),
            (FP_B, edit_at, "lenient"),
            (FP_C, second_at, "lenient"),
        ]
        con.executemany(
            "INSERT INTO wh.verifiers (name, fingerprint, label, first_seen) VALUES (?, ?, ?, ?)",
            [(SCORER, fp, label, at) for fp, at, label in versions],
        )
        con.executemany(
            "INSERT INTO wh.fingerprint_changes VALUES (?, ?, ?)",
            [
                (SCORER, FP_A, START - timedelta(hours=1)),
                (SCORER, FP_B, edit_at),
                (SCORER, FP_A, revert_at),
                (SCORER, FP_C, second_at),
            ],
        )

    def scores(fp: str, chosen: list[Run], at: datetime | None = None) -> int:
        rows = []
        for r in chosen:
            for i, kind in enumerate(kinds[r.run_id]):
                status, value, reason = _grade(kind, fp, r.night == outage_night, i)
                rows.append(
                    {
                        "run_id": r.run_id,
                        "sample_id": f"q{i:03d}",
                        "epoch": 1,
                        "scorer": SCORER,
                        "fingerprint": fp,
                        "status": status,
                        "value": value,
                        "answer": {"right": str(i), "point-zero": f"{i}.0"}.get(kind, "x"),
                        "explanation": reason,
                        "reason": reason,
                        "metadata": "{}",
                        "scored_at": max(at or r.created, r.created + timedelta(minutes=30)),
                        "duration_s": 0.001,
                        "attempt": 1,
                    }
                )
        return wh.write_scores(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA))

    if nights < 5:  # too few nights for a story of edits: one verifier version, no change
        with wh.write() as con:
            con.execute("DELETE FROM wh.fingerprint_changes WHERE fingerprint <> ?", [FP_A])
        scores(FP_A, runs)
        return World(wh.path, runs, nights, [*models, *sweep], tasks, edit_at, revert_at, second_at)
    scores(FP_A, [r for r in runs if r.night < second_night])
    scores(FP_B, [r for r in runs if r.night <= edit_night], edit_at + timedelta(seconds=5))
    scores(FP_C, runs, second_at + timedelta(seconds=5))
    return World(wh.path, runs, nights, [*models, *sweep], tasks, edit_at, revert_at, second_at)
