"""A dead model server costs seconds and says which server and why; stored errors say what
failed against what. Real sockets and real HTTP servers on 127.0.0.1, real Inspect generation."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from flows.generate import run_generation
from flows.runtime.envvars import environ_set
from sweeps.config import ConfigError, ModelConfig, TaskConfig, parse_config
from sweeps.mock_server import scripted_server
from sweeps.model_servers import check_model_env, server_problem
from warehouse import Warehouse


def _closed_port() -> int:
    """A port nothing listens on (bound once to find it free, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _status_server(status: int) -> Iterator[str]:
    """A server that answers every request with `status` (as an auth proxy might)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def _silent_server() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def test_an_unreachable_server_is_one_line_naming_the_url_where_it_came_from_and_why() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with environ_set({"DEAD_BASE_URL": url}):
        problem = server_problem(ModelConfig(model="openai-api/dead/m", name="ckpt-1"))
    assert problem is not None and "\n" not in problem
    assert url in problem and "DEAD_BASE_URL" in problem and "ckpt-1" in problem
    assert "connection refused" in problem

    problem = server_problem(ModelConfig(model="vllm/m", base_url=url))
    assert problem is not None and "(base_url)" in problem

    with _silent_server() as silent:
        problem = server_problem(ModelConfig(model="vllm/m", base_url=silent), timeout_s=0.5)
    assert problem is not None and "no answer within 0.5 s" in problem


def test_any_http_answer_counts_as_up_and_providers_without_a_url_are_not_probed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with scripted_server(lambda model, messages: "hi", models=["m"]) as server:
        assert server_problem(ModelConfig(model="vllm/m", base_url=server.base_url)) is None
    for status in (401, 404, 503):
        with _status_server(status) as url:
            assert server_problem(ModelConfig(model="vllm/m", base_url=url)) is None
    # vllm/ without a URL starts its own server; mockllm has none
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    assert server_problem(ModelConfig(model="vllm/m")) is None
    assert server_problem(ModelConfig(model="mockllm/model")) is None


def test_a_missing_api_key_is_a_config_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = {
        "name": "keys",
        "models": [{"model": "openai-api/my-svc/m", "name": "ckpt"}],
        "tasks": [{"task": "math_verified", "verifiers": ["math"]}],
    }
    cfg = parse_config(raw, source=tmp_path / "keys.toml")
    monkeypatch.delenv("MY_SVC_API_KEY", raising=False)
    monkeypatch.setenv("MY_SVC_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError) as err:
        check_model_env(cfg)
    message = str(err.value)
    assert "\n" not in message and "keys.toml: models[0] (ckpt)" in message
    assert "export MY_SVC_API_KEY=" in message
    monkeypatch.setenv("MY_SVC_API_KEY", "k")
    monkeypatch.delenv("MY_SVC_BASE_URL")
    with pytest.raises(ConfigError, match="MY_SVC_BASE_URL"):
        check_model_env(cfg)
    monkeypatch.setenv("MY_SVC_BASE_URL", "http://127.0.0.1:9/v1")
    check_model_env(cfg)


def test_a_dead_server_fails_that_models_tasks_in_seconds(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    model = ModelConfig(model="openai-api/dead/m", name="dead")  # Inspect's default retries
    tasks = [
        TaskConfig(task="math_verified", limit=2, verifiers=["math"]),
        TaskConfig(task="math_verified", args={"timeout_s": 1.0}, limit=2, verifiers=["math"]),
    ]
    start = time.monotonic()
    with environ_set({"DEAD_BASE_URL": url, "DEAD_API_KEY": "x"}):
        results = run_generation(model, tasks, tmp_path / "logs")
    # the bound: seconds, where Inspect's retries took minutes
    assert time.monotonic() - start < 30
    assert [r.log for r in results] == [None, None]
    for r in results:
        assert url in r.error and "connection refused" in r.error
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())


@pytest.mark.slow
def test_stored_generation_errors_say_what_failed_against_what(tmp_path: Path) -> None:
    """The server answers the check but fails every chat request: Inspect retries, gives up,
    and stores `RetryError(<Future ...>)`; the warehouse says what failed, against what."""
    with scripted_server(lambda model, messages: 500, models=["m"]) as server:
        model = ModelConfig(
            model="openai-api/flaky/m",
            name="flaky",
            config={"max_retries": 1, "timeout": 30},
            retry_on_error=0,
        )
        task = TaskConfig(task="math_verified", limit=1, verifiers=["math"])
        with environ_set({"FLAKY_BASE_URL": server.base_url, "FLAKY_API_KEY": "x"}):
            [result] = run_generation(model, [task], tmp_path / "logs")
    assert result.log is not None and result.errored == 1
    wh = Warehouse(tmp_path / "w.duckdb")
    [res] = wh.ingest_logs([result.log])
    assert res.error is None
    with wh.read() as con:
        [(error, traceback)] = con.execute("SELECT error, error_traceback FROM samples").fetchall()
    assert "RetryError(<Future" not in error
    assert "InternalServerError" in error and "500" in error
    assert f"openai-api/flaky/m at {server.base_url}" in error
    assert "Traceback" in traceback  # the traceback is kept as Inspect stored it


@pytest.mark.slow
def test_a_sweep_with_one_dead_server_runs_the_other_models(prefect_api, tmp_path: Path) -> None:
    from flows.sweep import sweep_flow

    dead = f"http://127.0.0.1:{_closed_port()}/v1"
    raw = {
        "name": "mixed",
        "log_dir": str(tmp_path / "logs"),
        "warehouse": str(tmp_path / "w.duckdb"),
        "models": [
            {"name": "dead", "model": "openai-api/dead/m"},
            {"name": "live", "model": "openai-api/local/m"},
        ],
        "tasks": [{"task": "math_verified", "limit": 2, "verifiers": ["math"]}],
    }
    cfg = parse_config(raw, source=tmp_path / "mixed.toml")
    with scripted_server(lambda model, messages: "ANSWER: 2", models=["m"]) as live:
        env = {
            "DEAD_BASE_URL": dead,
            "DEAD_API_KEY": "x",
            "LOCAL_BASE_URL": live.base_url,
            "LOCAL_API_KEY": "x",
        }
        with environ_set(env):
            result = sweep_flow(cfg, workers=1, progress=False)
    rows = {r.model: r for r in result.rows}
    assert rows["dead"].run_id is None and dead in rows["dead"].note
    assert rows["live"].samples == 2 and rows["live"].scored == 2
    assert live.count(200) == 2  # both samples generated by the live model
    assert result.exit_code == 2  # a model that could not run is bad input, not a failed gate
