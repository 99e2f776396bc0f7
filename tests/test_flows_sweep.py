"""Real flow runs against the session's Prefect server: the sweep end to end with mockllm."""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import flows_kit
import pytest

from flows.sweep import EXIT_GATE_FAILED, EXIT_OK, sweep_flow
from sweeps.config import parse_config
from warehouse import Warehouse


@pytest.fixture
def exact_check(tmp_path, monkeypatch) -> str:
    """A fresh test verifier module on sys.path (workers are spawned and import it too)."""
    name = f"exact_{uuid.uuid4().hex[:8]}"
    flows_kit.write_verifier(tmp_path, name, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    return name


def _config(tmp_path: Path, verifier: str, wrong: set[int], gates: dict | None = None):
    raw = {
        "name": "e2e",
        "log_dir": "logs",
        "warehouse": "sweep.duckdb",
        "models": [
            {
                "name": "v1",
                "model": "mockllm/model",
                "args": {"custom_outputs": flows_kit.mock_outputs(wrong)},
            }
        ],
        "tasks": [
            {"task": flows_kit.TASK_SPEC, "args": {"n": 6}, "epochs": 2, "verifiers": [verifier]}
        ],
        "gates": gates or {"min_accuracy": 0.5, "max_regression": None},
    }
    return parse_config(raw, source=tmp_path / "sweep.toml")


@pytest.mark.slow
def test_sweep_end_to_end_with_mockllm(prefect_api, tmp_path, exact_check):
    cfg = _config(tmp_path, exact_check, wrong={2, 5})
    result = sweep_flow(cfg, workers=2, progress=False)

    assert [g.samples for g in result.generations] == [12]
    (row,) = result.rows
    # 6 problems x 2 epochs; operands 2 and 5 answered wrong in both epochs
    assert (row.samples, row.scored, row.unscored, row.errored) == (12, 12, 0, 0)
    assert row.accuracy == pytest.approx(8 / 12)
    assert row.gate == "pass"
    assert result.exit_code == EXIT_OK

    wh = Warehouse(cfg.warehouse)
    with wh.read() as con:
        n_scores = con.execute("SELECT count(*) FROM scores").fetchone()[0]
        n_gates = con.execute("SELECT count(*) FROM gates").fetchone()[0]
    assert n_scores == 12
    assert n_gates == 1
    # the log on disk is unscored: generation never scores
    from inspect_ai.log import read_eval_log

    log = read_eval_log(result.generations[0].log)
    assert log.results is None or not log.results.scores
    # the log says which sweep made it, so `gradebook gate --sweep` finds runs it never gated
    assert log.eval.metadata["sweep"] == cfg.name
    from gates.records import newest_runs

    with wh.write() as con:
        con.execute("DELETE FROM wh.gates")
    with wh.read() as con:
        assert newest_runs(con, sweep=cfg.name) == [result.generations[0].run_id]


@pytest.mark.slow
def test_a_failed_gate_gives_exit_code_1(prefect_api, tmp_path, exact_check):
    cfg = _config(tmp_path, exact_check, wrong={1, 2, 3, 4}, gates={"min_accuracy": 0.9})
    result = sweep_flow(cfg, workers=1, progress=False)
    assert result.rows[0].accuracy == pytest.approx(2 / 6)
    assert result.rows[0].gate == "fail"
    assert result.exit_code == EXIT_GATE_FAILED


@pytest.mark.slow
def test_a_verifier_edited_while_the_models_generate_grades_with_the_new_code(
    prefect_api, tmp_path, exact_check
):
    # The sweep starts its scoring workers (which import the verifier) before generating. An
    # edit during generation must still be what grades, under the new fingerprint.
    module = tmp_path / f"{exact_check}.py"
    answer = flows_kit.mock_outputs(set())

    def edit_then_answer(*args):
        if "OFFSET = 0" in module.read_text():
            module.write_text(module.read_text().replace("OFFSET = 0", "OFFSET = 1"))
        return answer(*args)

    cfg = _config(tmp_path, exact_check, wrong=set())
    cfg.models[0].args["custom_outputs"] = edit_then_answer
    result = sweep_flow(cfg, workers=2, progress=False)

    (row,) = result.rows
    assert (row.samples, row.scored) == (12, 12)
    assert row.accuracy == 0.0  # every right answer is now off by one: the edited code graded
    from gates.evaluate import current_fingerprints

    with Warehouse(cfg.warehouse).read() as con:
        stored = {r[0] for r in con.execute("SELECT DISTINCT fingerprint FROM scores").fetchall()}
    assert stored == {current_fingerprints([exact_check])[exact_check]}
