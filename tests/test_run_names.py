"""Flow and task runs are named for what they ran and tagged so the Prefect UI's filters work.

Real flow runs against the session's Prefect server (mockllm generates, a test verifier grades);
the names and tags are read back through the Prefect client, as the UI shows them.
"""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import flows_kit
import pytest
from process_kit import cli_env, gradebook, wait_for

from flows.generate import generate_flow
from flows.rescore import rescore_flow
from flows.score import score_flow
from flows.sweep import sweep_flow
from sweeps.config import parse_config

pytestmark = pytest.mark.slow


def _runs(**tags_all: str) -> tuple[list, list]:
    """(flow runs, task runs) carrying every tag given (`kind=value` -> `kind:value`)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    wanted = [f"{k}:{v}" for k, v in tags_all.items()]
    with get_client(sync_client=True) as client:
        flows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=wanted))
        )
        ids = [f.id for f in flows]
        tasks = client.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=ids))
        )
        again = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    assert len(again) == len(flows)
    return flows, tasks


@pytest.fixture
def verifier(tmp_path, monkeypatch) -> tuple[str, Path]:
    name = f"lastword_{uuid.uuid4().hex[:8]}"
    path = flows_kit.write_verifier(tmp_path, name, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    return name, path


def test_a_sweep_and_its_steps_are_named_and_tagged(prefect_api, tmp_path, verifier) -> None:
    name, _ = verifier
    sweep = f"nightly-{uuid.uuid4().hex[:6]}"
    raw = {
        "name": sweep,
        "log_dir": "logs",
        "warehouse": "g.duckdb",
        "models": [
            {"name": "ckpt-1", "model": "mockllm/model",
             "args": {"custom_outputs": flows_kit.mock_outputs({2})}},
            {"name": "ckpt-2", "model": "mockllm/model",
             "args": {"custom_outputs": flows_kit.mock_outputs(set())}},
        ],
        "tasks": [{"task": flows_kit.TASK_SPEC, "args": {"n": 4}, "verifiers": [name]}],
        "gates": {"min_accuracy": 0.1, "max_regression": None},
    }  # fmt: skip
    cfg = parse_config(raw, source=tmp_path / "sweep.toml")
    sweep_flow(cfg, workers=1, progress=False)

    expected = {
        "generate ckpt-1 · 1 task",
        "generate ckpt-2 · 1 task",
        "ingest 2 logs",
        f"gate sweep {sweep}",
    }
    # Prefect records task runs from their events, after the flow has returned: wait for them
    wait_for(
        lambda: expected <= {t.name for t in _runs(sweep=sweep)[1]},
        timeout=120,
        what="the sweep's task runs recorded by the Prefect server",
    )
    flows, tasks = _runs(sweep=sweep)
    [run] = flows
    assert run.name == f"sweep {sweep} · 2 models × 1 task"
    assert {"model:ckpt-1", "model:ckpt-2", "task:arith", f"verifier:{name}"} <= set(run.tags)
    names = {t.name: t for t in tasks}
    assert expected <= set(names)
    assert "model:ckpt-2" in names["generate ckpt-2 · 1 task"].tags
    # the UI's filter on one model finds the sweep, and its generation of that model
    flows, tasks = _runs(model="ckpt-1", sweep=sweep)
    assert [f.id for f in flows] == [run.id]
    assert any(t.name == "generate ckpt-1 · 1 task" for t in tasks)


def test_score_and_rescore_runs_say_what_they_graded(prefect_api, tmp_path, verifier) -> None:
    name, path = verifier
    from gate_world import run_eval

    log = run_eval(tmp_path / "logs", ["0", "1", "2", "x"], task_name="capitals")
    db = str(tmp_path / "g.duckdb")
    score_flow([str(log)], db, verifiers=[name], progress=False)

    flows, _ = _runs(verifier=name)
    [scored] = flows
    assert scored.name == "score capitals · model (4 samples)"
    assert {"task:capitals", "model:mockllm/model"} <= set(scored.tags)

    # the verifier changes; its re-score is named by the new fingerprint and what it graded
    path.write_text(path.read_text().replace("OFFSET = 0", "OFFSET = 1"))
    importlib.reload(importlib.import_module(name))
    [plan] = rescore_flow(db, [name], progress=False)
    flows, _ = _runs(verifier=name)
    [rescored] = [f for f in flows if f.id != scored.id]
    assert rescored.name == f"rescore {name} @{plan.digest[:10]} (4 samples)"


def test_score_tags_a_model_as_the_sweep_that_generated_it(prefect_api, tmp_path) -> None:
    label = f"offline-{uuid.uuid4().hex[:6]}"  # the config's name for mockllm/model
    raw = {
        "name": f"labels-{uuid.uuid4().hex[:6]}",
        "log_dir": "logs",
        "warehouse": "g.duckdb",
        "models": [{"name": label, "model": "mockllm/model",
                    "args": {"custom_outputs": flows_kit.mock_outputs(set())}}],
        "tasks": [{"task": flows_kit.TASK_SPEC, "args": {"n": 2}, "verifiers": ["math"]}],
    }  # fmt: skip
    [made] = generate_flow(parse_config(raw, source=tmp_path / "sweep.toml"))

    # scored later, by hand, into another warehouse
    env = cli_env(api_url=prefect_api)
    done = gradebook("score", made.log, "--db", str(tmp_path / "later.duckdb"), env=env)
    assert done.returncode == 0, done.stdout + done.stderr

    # the UI's filter on the model finds its generation and its scoring, under one name
    flows, _ = _runs(model=label)
    assert len(flows) == 2, [(f.name, f.tags) for f in flows]
    [scored] = [f for f in flows if f.name.startswith("score")]
    assert scored.name == f"score arith · {label} (2 samples)"
    assert "model:mockllm/model" not in scored.tags
