"""Messages outside the config and log checks (tests/test_bad_input.py) say what is wrong and
what to do next: a Prefect server that does not come up, a cluster without its deployments or
workers, a sandbox that cannot run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from cli_kit import gradebook, shell_env


def test_a_prefect_server_that_does_not_answer_in_time_names_its_log_and_the_next_step(
    tmp_path: Path,
) -> None:
    from flows.runtime.server import PrefectServerError, local_server

    home = tmp_path / "server-home"
    with (
        pytest.raises(PrefectServerError) as err,
        local_server(home=home, ui=False, startup_timeout=0.1),
    ):
        pass
    text = str(err.value)
    assert f"its log {home / 'server.log'}" in text
    assert "start one with `prefect server start` and export PREFECT_API_URL" in text
    assert "___ ___" not in text  # not Prefect's ASCII-art banner
    assert "\n" not in text


@pytest.mark.slow
def test_a_cluster_sweep_without_its_deployments_is_one_line_naming_the_fix(
    prefect_api, tmp_path: Path
) -> None:
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(
        textwrap.dedent(
            """\
            name = "no-deployments"
            warehouse = "g.duckdb"
            log_dir = "logs"

            [[models]]
            model = "mockllm/model"
            work_pool = "no-such-pool"

            [[tasks]]
            task = "math_verified"
            limit = 1
            verifiers = ["math"]

            [cluster]
            staging_dir = "staging"
            """
        )
    )
    ran = gradebook(
        "sweep", str(cfg), env=shell_env(tmp_path / "home", api_url=prefect_api), cwd=tmp_path
    )
    assert ran.code == 2, (ran.stdout, ran.stderr)
    assert "Traceback" not in ran.stderr + ran.stdout
    [line] = ran.stderr_lines
    assert "deployment 'cluster-generate/no-such-pool' not found" in line
    assert "gradebook cluster setup" in line


@pytest.fixture(scope="module")
def idle_pool(prefect_api):
    """A generate deployment on a pool no worker serves: its runs stay Scheduled."""
    from flows.cluster.setup import setup_cluster

    return setup_cluster(generate_pools=["idle-msg-gpu"], score_pools=["idle-msg-cpu"])


@pytest.mark.slow
def test_a_stage_no_worker_picks_up_says_which_pool_needs_one(idle_pool) -> None:
    from flows.cluster.dispatch import ClusterRun, DispatchError, _await_runs, _submit

    run = ClusterRun(
        "score",
        "math #1/1",
        "cluster-score/idle-msg-cpu",
        f"gb/test/{id(idle_pool)}",
        {"chunk": "/x.parquet", "scorer": "math", "digest": "d", "staging_dir": "/s"},
    )
    _submit(run)
    with pytest.raises(DispatchError) as err:
        _await_runs([run], retries=0, timeout_s=0.5)
    text = str(err.value)
    assert "on pool(s) idle-msg-cpu" in text
    assert "start a worker there (`gradebook cluster worker idle-msg-cpu`)" in text
    assert "[cluster] stage_timeout_s" in text


def test_a_sandbox_check_without_docker_says_how_to_bring_it_up(tmp_path: Path) -> None:
    env = shell_env(tmp_path / "home", DOCKER_HOST=f"unix://{tmp_path / 'no-docker.sock'}")
    ran = gradebook("sandbox", "check", env=env, cwd=tmp_path, timeout=300)
    assert ran.code == 1, (ran.stdout, ran.stderr)
    [line] = ran.stderr_lines
    assert line.startswith("error: sandbox check failed:")
    assert "`make services`" in line and "gradebook sandbox check" in line
