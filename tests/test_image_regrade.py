"""Which verdicts a sandbox scorer grades again because their task image was rebuilt
(workspaces.image_regrade), decided against a real DuckDB file and, where marked, a real Docker
Engine's images (looked up, never built). The end-to-end case (an image removed, rebuilt by
another warehouse's scoring, graded again here as attempt 2) is in test_task_images.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pytest
from conftest import need

from warehouse import SCORE_SCHEMA, Warehouse
from workspaces.image_regrade import rebuilt_image_samples

GONE = "sha256:" + "0" * 64  # an image ID no Engine has
SANDBOX = SimpleNamespace(name="tool_check", params={"sandbox": {"image": "x"}})


def _warehouse(tmp_path, samples: dict[str, tuple[str | None, str]]) -> Warehouse:
    """One run whose samples ran in `recorded` and were graded in `used` (sample -> the pair),
    a recorded None meaning a sample with no workspace record."""
    wh = Warehouse(tmp_path / "w.duckdb")
    with wh.write() as con:
        for sample, (recorded, _) in samples.items():
            box = {"name": "default", "status": "captured", "image_id": recorded,
                   "recipe": "r" * 64, "service": "default"}  # fmt: skip
            store = {"gradebook_workspace": {"store": "s", "sandboxes": [box]}} if recorded else {}
            con.execute(
                "INSERT INTO wh.samples (run_id, sample_id, epoch, store) VALUES ('run', ?, 1, ?)",
                [sample, json.dumps(store)],
            )
    rows = [
        {"run_id": "run", "sample_id": sample, "epoch": 1, "scorer": "tool_check",
         "fingerprint": "fp", "status": "scored", "value": 1.0,
         "metadata": json.dumps({"sandbox": {"restored": {"default": {"image_id": used}}}})}
        for sample, (_, used) in samples.items()
    ]  # fmt: skip
    assert wh.write_scores(pa.Table.from_pylist(rows, SCORE_SCHEMA)) == len(rows)
    return wh


def test_a_verifier_that_restores_no_sandbox_is_never_checked():
    # no warehouse is read, no Engine asked
    assert rebuilt_image_samples(None, SimpleNamespace(name="math", params={}), "fp") == []  # type: ignore[arg-type]


def test_with_the_engine_unreachable_the_verdicts_stand(tmp_path, monkeypatch):
    wh = _warehouse(tmp_path, {"1": (GONE, "sha256:" + "1" * 64)})
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    assert rebuilt_image_samples(wh, SANDBOX, "fp", ["run"]) == []  # type: ignore[arg-type]


@pytest.mark.docker
def test_only_a_verdict_whose_image_restore_would_use_now_differs_is_graded_again(tmp_path):
    from scorers.sandbox.pool import SandboxUnavailable, engine_with_image

    try:
        client, image = engine_with_image()
    except SandboxUnavailable as exc:
        need(False, f"Docker sandbox unavailable: {exc}")
    here = client.images.get(image).id  # an image this Engine has, standing in for a task's
    wh = _warehouse(
        tmp_path,
        {
            "graded in another image": (here, "sha256:" + "2" * 64),
            "graded in it": (here, here),
            "its image gone, not rebuilt": (GONE, "sha256:" + "3" * 64),
            "no record": (None, "sha256:" + "4" * 64),
        },
    )
    assert rebuilt_image_samples(wh, SANDBOX, "fp", ["run"]) == [  # type: ignore[arg-type]
        ("run", "graded in another image", 1)
    ]
    # a regrade is the next attempt of exactly that sample
    todo = wh.samples_to_score("tool_check", "fp", regrade=[("run", "graded in another image", 1)])
    assert [(r["sample_id"], r["attempt"]) for r in todo.to_pylist()] == [
        ("graded in another image", 2)
    ]
