"""The grade-flips artifact and `rescore`'s table count samples, not (sample, fingerprint) pairs.

A sample graded under two older fingerprints and flipped by the current one is two rows of
`grade_flips` (one per older fingerprint) but one flipped sample.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from gate_world import run_eval

from warehouse import SCORE_SCHEMA, Warehouse


def _old_grades(wh: Warehouse, run_id: str, digest: str) -> None:
    """Every sample of the run graded wrong by an older math verifier `digest`."""
    wh.register_verifier(
        SimpleNamespace(name="math", digest=digest, label="old", source="", params={})
    )
    todo = wh.samples_to_score("math", digest, run_ids=[run_id]).to_pylist()
    rows = [
        {
            **{k: s[k] for k in ("run_id", "sample_id", "epoch")},
            "scorer": "math",
            "fingerprint": digest,
            "status": "scored",
            "value": 0.0,
            "explanation": "wrong under the old verifier",
            "scored_at": datetime.now(UTC),
            "attempt": 1,
        }
        for s in todo
    ]
    wh.write_scores(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA))


@pytest.mark.slow
def test_flips_are_counted_per_sample(prefect_api, tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.rescore import rescore_flow

    wh = Warehouse(tmp_path / "w.duckdb")
    log = run_eval(tmp_path / "logs", [f"ANSWER: {i}" for i in range(3)], task_name="flips")
    [res] = wh.ingest_logs([log])
    _old_grades(wh, res.run_id, "a" * 64)
    _old_grades(wh, res.run_id, "b" * 64)

    [plan] = rescore_flow(str(wh.path), ["math"], progress=False)
    assert len(plan.flips) == 6  # 3 samples x 2 older fingerprints

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["grade-flips-math"]))
        )
    newest = max(artifacts, key=lambda a: a.created)
    assert newest.description.startswith(f"math: 3 samples flipped under {plan.digest[:12]}")
    assert "(6 flips against older fingerprints)" in newest.description
    assert plan.flipped_samples == 3  # what `gradebook rescore` prints in its table
