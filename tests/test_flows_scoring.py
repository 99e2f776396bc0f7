"""Real flow runs: model errors are kept, verifier faults are isolated, scoring is idempotent,
and an edited verifier is re-scored by the watcher without touching other verifiers' rows."""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import flows_kit
import pytest

from flows.rescore import watch_verifiers
from flows.score import score_flow
from flows.sweep import sweep_flow
from sweeps.config import parse_config
from sweeps.mock_server import scripted_server
from warehouse import Warehouse


def _verifier(tmp_path, monkeypatch, boom: set[str] | None = None) -> tuple[str, object]:
    name = f"exact_{uuid.uuid4().hex[:8]}"
    path = flows_kit.write_verifier(tmp_path, name, name, boom)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    return name, path


def _cfg(tmp_path, models, verifiers, n=6, epochs=1):
    raw = {
        "name": "t",
        "log_dir": "logs",
        "warehouse": "gb.duckdb",
        "models": models,
        "tasks": [
            {
                "task": flows_kit.TASK_SPEC,
                "args": {"n": n},
                "epochs": epochs,
                "verifiers": verifiers,
            }
        ],
        "gates": {"max_regression": None},
    }
    return parse_config(raw, source=tmp_path / "sweep.toml")


def _mock(wrong: set[int]) -> dict:
    return {
        "name": "v1",
        "model": "mockllm/model",
        "args": {"custom_outputs": flows_kit.mock_outputs(wrong)},
    }


def _count(db, sql, params=()):
    with Warehouse(db).read() as con:
        return con.execute(sql, list(params)).fetchall()


@pytest.mark.slow
def test_http_500_samples_are_counted_as_errored_not_lost(prefect_api, tmp_path, monkeypatch):
    name, _ = _verifier(tmp_path, monkeypatch)

    def script(model, messages):
        prompt = str(messages[-1]["content"])
        # operands 2 and 4 always fail: the retries cannot rescue them
        if "What is 2 +" in prompt or "What is 4 +" in prompt:
            return 500
        return flows_kit.answer_for(prompt, wrong=False)

    with scripted_server(script, models=["ckpt"]) as server:
        monkeypatch.setenv("LOCAL_BASE_URL", server.base_url)
        monkeypatch.setenv("LOCAL_API_KEY", "none")
        model = {
            "name": "ckpt",
            "model": "openai-api/local/ckpt",
            "config": {"max_retries": 1, "timeout": 20},
            "retry_on_error": 1,
        }
        cfg = _cfg(tmp_path, [model], [name])
        result = sweep_flow(cfg, workers=1, progress=False)
        assert server.count(500) >= 2

    (gen,) = result.generations
    assert (gen.samples, gen.errored) == (6, 2)
    (row,) = result.rows
    assert (row.samples, row.errored, row.scored) == (6, 2, 4)
    assert row.accuracy == 1.0 and row.accuracy_strict == pytest.approx(4 / 6)
    rows = _count(
        cfg.warehouse, "SELECT status, reason, count(*) FROM scores GROUP BY ALL ORDER BY 1"
    )
    assert rows == [("error", "generation_error", 2), ("scored", "verified_equal", 4)]


@pytest.mark.slow
def test_vllm_provider_with_a_base_url_uses_the_running_server(prefect_api, tmp_path, monkeypatch):
    name, _ = _verifier(tmp_path, monkeypatch)
    with scripted_server(
        lambda m, msgs: flows_kit.answer_for(str(msgs[-1]["content"]), wrong=False)
    ) as server:
        model = {
            "name": "vl",
            "model": "vllm/ckpt",
            "base_url": server.base_url,
            "args": {"api_key": "x"},
        }
        result = sweep_flow(_cfg(tmp_path, [model], [name], n=3), workers=1, progress=False)
        assert server.count(200) == 3
    assert result.rows[0].accuracy == 1.0


@pytest.mark.slow
def test_raising_verifier_leaves_those_samples_unscored_and_scores_the_rest(
    prefect_api, tmp_path, monkeypatch
):
    name, _ = _verifier(tmp_path, monkeypatch, boom={"2", "5"})
    cfg = _cfg(tmp_path, [_mock(wrong={3})], [name])
    result = sweep_flow(cfg, workers=2, progress=False, gate=False)
    (row,) = result.rows
    assert (row.scored, row.unscored) == (4, 2)
    assert row.unscored_reasons == {"verifier_error": 2}
    rows = _count(
        cfg.warehouse,
        "SELECT sample_id, explanation, metadata->>'traceback' FROM scores WHERE status = 'unscored' ORDER BY 1",
    )
    assert [r[0] for r in rows] == ["2", "5"]
    assert all("boom on purpose" in r[1] and "RuntimeError" in r[2] for r in rows)


@pytest.mark.slow
def test_scoring_twice_writes_nothing_the_second_time(prefect_api, tmp_path, monkeypatch):
    name, _ = _verifier(tmp_path, monkeypatch)
    cfg = _cfg(tmp_path, [_mock(wrong={1})], [name])
    result = sweep_flow(cfg, workers=1, progress=False, gate=False)
    log = result.generations[0].log
    first = sum(s.written for s in result.scores)
    before = Path(log).read_bytes()
    copies = tmp_path / "scored"
    again = score_flow([log], str(cfg.warehouse), progress=False, scored_log_dir=str(copies))
    assert first == 6
    assert sum(s.written for s in again) == 0
    assert _count(cfg.warehouse, "SELECT count(*) FROM scores") == [(6,)]
    # the fingerprint the rows were graded under is recorded, once
    assert _count(
        cfg.warehouse,
        "SELECT count(*) FROM verifiers v JOIN (SELECT DISTINCT fingerprint FROM scores) s "
        "USING (fingerprint) WHERE v.name = ?",
        [name],
    ) == [(1,)]
    # the scored copy carries the verdicts for `inspect view`; the original is untouched
    from inspect_ai.log import read_eval_log

    copy = read_eval_log(str(copies / Path(log).name))
    values = sorted(s.scores[name].value for s in copy.samples)
    assert values == [0.0] + [1.0] * 5
    assert Path(log).read_bytes() == before


@pytest.mark.slow
def test_watcher_rescores_only_the_edited_verifier_and_keeps_old_rows(
    prefect_api, tmp_path, monkeypatch
):
    edited, path = _verifier(tmp_path, monkeypatch)
    other, _ = _verifier(tmp_path, monkeypatch)
    cfg = _cfg(tmp_path, [_mock(wrong={2, 5})], [edited, other])
    sweep_flow(cfg, workers=1, progress=False, gate=False)
    db = str(cfg.warehouse)
    first = watch_verifiers(db)
    assert (first.rescored, first.retry.written) == ([], [])  # nothing changed yet

    # make the edited verifier lenient: off-by-one answers now count (a behaviour change)
    source = path.read_text()
    path.write_text(
        source.replace("ok = answer == want", "ok = answer in (want, str(int(want) + 1))")
    )
    plans = watch_verifiers(db).rescored

    assert [p.scorer for p in plans] == [edited]
    assert [(f["sample_id"], f["old_value"], f["new_value"]) for f in plans[0].flips] == [
        ("2", 0.0, 1.0),
        ("5", 0.0, 1.0),
    ]
    counts = dict(_count(cfg.warehouse, "SELECT scorer, count(*) FROM scores GROUP BY scorer"))
    assert counts == {edited: 12, other: 6}  # old rows kept; the other verifier untouched
    flips = _count(
        cfg.warehouse, "SELECT sample_id FROM grade_flips WHERE scorer = ? ORDER BY 1", [edited]
    )
    assert flips == [("2",), ("5",)]
    assert watch_verifiers(db).rescored == []  # the next tick finds nothing left to do
