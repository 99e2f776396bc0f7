"""Cluster mode's config and dispatch contract: [cluster], args_from, idempotent dispatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.config import ConfigError, ModelConfig, parse_config

TESTS = Path(__file__).resolve().parent


def _raw(**extra):
    return {
        "name": "c",
        "models": [{"model": "mockllm/model"}],
        "tasks": [{"task": "math_verified", "verifiers": ["math"]}],
        **extra,
    }


def test_no_cluster_section_keeps_the_embedded_default(tmp_path):
    cfg = parse_config(_raw(), source=tmp_path / "s.toml")
    assert cfg.cluster is None


def test_cluster_section_resolves_staging_next_to_the_config(tmp_path):
    cfg = parse_config(
        _raw(cluster={"staging_dir": "shared/staging", "chunk_size": 50}),
        source=tmp_path / "s.toml",
    )
    assert cfg.cluster.staging_dir == (tmp_path / "shared/staging").resolve()
    assert (cfg.cluster.chunk_size, cfg.cluster.score_pool, cfg.cluster.chunk_retries) == (
        50,
        "cpu",
        2,
    )


def test_misspelt_cluster_key_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_config(_raw(cluster={"chunksize": 5}), source=tmp_path / "s.toml")
    assert "cluster.chunksize: unknown key" in str(err.value)


def test_args_from_merges_on_load_and_serialises_as_written(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    m = ModelConfig(model="mockllm/model", args={"x": 1}, args_from="cluster_kit:mock_args")
    assert callable(m.args["custom_outputs"]) and m.args["x"] == 1
    dumped = m.model_dump(mode="json")
    assert dumped["args"] == {"x": 1} and dumped["args_from"] == "cluster_kit:mock_args"
    # what a worker does with the JSON: the factory runs again there
    again = ModelConfig.model_validate(dumped)
    assert callable(again.args["custom_outputs"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "must be 'module:function'"),
        ("surely_not_a_module_xyz:f", "cannot load 'surely_not_a_module_xyz:f'"),
        ("os.path:join_nonexistent", "cannot load"),
    ],
)
def test_bad_args_from_names_the_key(tmp_path, spec, message):
    raw = _raw()
    raw["models"][0]["args_from"] = spec
    with pytest.raises(ConfigError) as err:
        parse_config(raw, source=tmp_path / "s.toml")
    text = str(err.value)
    assert "models[0] (mockllm/model)" in text and "args_from" in text
    assert message in text and "\n" not in text


def test_a_python_object_model_arg_cannot_be_sent_to_a_worker():
    from flows.cluster.dispatch import _jsonable_model

    m = ModelConfig(model="mockllm/model", args={"custom_outputs": lambda *a: None})
    with pytest.raises(ConfigError, match=r"models\[3\] \(mockllm/model\)\.args.*args_from"):
        _jsonable_model(m, 3)
    assert _jsonable_model(ModelConfig(model="vllm/x", args={"k": [1]}), 0)["args"] == {"k": [1]}


@pytest.fixture(scope="module")
def idle_pools(prefect_api):
    """Deployments on pools no worker serves: runs created there stay Scheduled."""
    from flows.cluster.setup import setup_cluster

    return setup_cluster(generate_pools=["idle-gpu"], score_pools=["idle-cpu"])


@pytest.mark.slow
def test_same_idempotency_key_gives_the_same_flow_run_and_a_retry_a_new_one(idle_pools):
    from prefect.client.orchestration import get_client

    from flows.cluster.dispatch import ClusterRun, _submit

    def unit() -> ClusterRun:
        params = {"chunk": "/x.parquet", "scorer": "math", "digest": "d", "staging_dir": "/s"}
        return ClusterRun("score", "math #1/1", "cluster-score/idle-cpu", "gb/test/k1", params)

    first, again = unit(), unit()
    _submit(first)
    _submit(again)  # a dispatcher that was restarted sends the same unit again
    assert first.flow_run_ids == again.flow_run_ids
    _submit(first)  # the retry after a crash: attempt 2 is a new flow run
    assert first.attempts == 2 and first.flow_run_ids[1] != first.flow_run_ids[0]
    with get_client(sync_client=True) as client:
        runs = [client.read_flow_run(i) for i in first.flow_run_ids]
        assert {r.work_pool_name for r in runs} == {"idle-cpu"}
        assert all("gradebook-cluster" in r.tags for r in runs)
        for r in runs:
            client.delete_flow_run(r.id)


@pytest.mark.slow
def test_the_crash_automation_is_armed_by_running_too_and_setup_updates_an_older_one(
    idle_pools,
):
    # A host that dies before its run's first heartbeat reached the server left the run
    # Running for ever: the automation is armed by the Running state as well.
    from prefect.automations import Automation

    from flows.cluster.setup import CRASH_AUTOMATION, setup_cluster

    older = Automation.read(name=CRASH_AUTOMATION)
    older.trigger.after = {"prefect.flow-run.heartbeat"}  # as an older gradebook made it
    older.update()
    again = setup_cluster(generate_pools=["idle-gpu"], score_pools=["idle-cpu"])
    now = Automation.read(name=CRASH_AUTOMATION)
    assert again.automation == idle_pools.automation == str(now.id)
    assert now.trigger.after == {"prefect.flow-run.heartbeat", "prefect.flow-run.Running"}


def test_a_missing_deployment_says_to_run_setup(prefect_api):
    from flows.cluster.dispatch import DispatchError, _check_deployments

    with pytest.raises(DispatchError, match="gradebook cluster setup"):
        _check_deployments(["cluster-score/no-such-pool"])


@pytest.mark.parametrize("name", ["docker-pool.json", "kubernetes-pool.json"])
def test_example_pool_templates_declare_every_placeholder_they_use(name):
    import json
    import re

    path = TESTS.parent / "infra" / "cluster" / "templates" / name
    template = json.loads(path.read_text())
    used = set(re.findall(r"{{\s*(\w+)\s*}}", json.dumps(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used - declared == set(), f"{name}: placeholders without a variable"
    assert {"image", "env"} <= declared
