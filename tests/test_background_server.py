"""The local Prefect server gradebook commands share: started once, detached, reused, replaced
when it is a leftover, and second to PREFECT_API_URL. Real servers, real `gradebook` processes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from process_kit import cli_env, gradebook, make_log, wait_for

from flows.runtime.background_server import ensure_server, find_server, stop_server
from flows.runtime.procs import alive, environ_of

STARTED = "started a local Prefect server"


@pytest.fixture
def home(tmp_path: Path):
    """A Prefect home of this test's own; whatever server it ends with is stopped, and no
    process of that home may be left."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    try:
        yield home
    finally:
        stop_server(home)
        assert _processes_of(home) == []


def _processes_of(home: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            env = environ_of(int(entry.name))
            if env and env.get("PREFECT_HOME") == str(home) and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _env(home: Path, **extra: str) -> dict[str, str]:
    return cli_env(GRADEBOOK_PREFECT_HOME=str(home), GRADEBOOK_PREFECT_PORT="0", **extra)


def _flow_runs(api_url: str, flow_name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"api.url": api_url}), get_client(sync_client=True) as c:
        return c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))


@pytest.mark.slow
def test_the_first_command_starts_a_detached_server_and_the_next_one_reuses_it(home, tmp_path):
    log_a = make_log(tmp_path / "a", 3)
    log_b = make_log(tmp_path / "b", 3)
    db = tmp_path / "w.duckdb"
    env = _env(home)

    first = gradebook("score", str(log_a), "--db", str(db), env=env)
    assert first.returncode == 0, first.stderr
    notices = [line for line in first.stderr.splitlines() if STARTED in line]
    assert len(notices) == 1, first.stderr
    info = find_server(home)
    assert info is not None
    assert f"pid {info.pid}" in notices[0] and info.ui_url in notices[0]
    assert "`gradebook server stop` stops it" in notices[0]
    # detached: it outlived the command, in a session of its own, bound to the loopback
    assert alive(info.pid, info.ticks)
    assert os.getsid(info.pid) != os.getsid(0)
    assert info.api_url.startswith("http://127.0.0.1:")

    second = gradebook("score", str(log_b), "--db", str(db), env=env)
    assert second.returncode == 0, second.stderr
    assert STARTED not in second.stderr
    again = find_server(home)
    assert again is not None and (again.pid, again.ticks, again.port) == (
        info.pid,
        info.ticks,
        info.port,
    )
    runs = _flow_runs(info.api_url, "score")
    assert sorted(r.state_type.value for r in runs) == ["COMPLETED", "COMPLETED"]

    status = gradebook("server", "status", env=env)
    assert status.returncode == 0
    assert "running" in status.stdout
    for fact in (info.ui_url, str(info.pid), str(home / "prefect.db"), "uptime"):
        assert fact in status.stdout, status.stdout
    as_json = json.loads(gradebook("server", "status", "--json", env=env).stdout)
    assert (as_json["state"], as_json["pid"], as_json["ui"]) == ("running", info.pid, info.ui_url)

    stopped = gradebook("server", "stop", env=env)
    assert stopped.returncode == 0 and f"pid {info.pid}" in stopped.stdout
    assert not alive(info.pid, info.ticks)
    assert "not running" in gradebook("server", "status", env=env).stdout


@pytest.mark.slow
def test_a_server_killed_with_sigkill_is_replaced(home, tmp_path):
    log = make_log(tmp_path / "logs", 3)
    env = _env(home)
    old = ensure_server(home=home)
    os.kill(old.pid, signal.SIGKILL)
    wait_for(lambda: not alive(old.pid, old.ticks), 10, "the killed server to be gone")
    # its files are still there, naming a dead process
    assert (home / "server.pid").exists() and (home / "gradebook-server.json").exists()
    status = gradebook("server", "status", env=env)
    assert "leftover" in status.stdout and "its process is gone" in status.stdout

    out = gradebook("score", str(log), "--db", str(tmp_path / "w.duckdb"), env=env)

    assert out.returncode == 0, out.stderr
    assert STARTED in out.stderr
    new = find_server(home)
    assert new is not None and new.pid != old.pid and alive(new.pid, new.ticks)
    assert [r.state_type.value for r in _flow_runs(new.api_url, "score")] == ["COMPLETED"]


@pytest.mark.slow
def test_a_server_an_older_gradebook_started_is_stopped_and_replaced(home):
    old = ensure_server(home=home)
    record = home / "gradebook-server.json"
    data = json.loads(record.read_text())
    data["key"]["gradebook"] = "0.0.1"
    record.write_text(json.dumps(data))
    assert find_server(home) is None  # never used as it is

    out = gradebook("server", "start", env=_env(home))

    assert out.returncode == 0, out.stderr
    assert "started" in out.stdout
    new = find_server(home)
    assert new is not None and new.pid != old.pid
    assert not alive(old.pid, old.ticks)  # stopped, not left running beside the new one


@pytest.mark.slow
def test_commands_started_together_share_one_server(home):
    import subprocess
    import sys

    env = _env(home)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "server", "start"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    words = sorted("already running" in out for out, _ in outs)
    assert words == [False, True], outs  # one started it, the other found it
    info = find_server(home)
    assert info is not None
    assert all(str(info.pid) in out for out, _ in outs)


@pytest.mark.slow
def test_prefect_api_url_wins_over_the_local_server(prefect_api, home, tmp_path):
    log = make_log(tmp_path / "logs", 2)
    out = gradebook(
        "score",
        str(log),
        "--db",
        str(tmp_path / "w.duckdb"),
        env=_env(home, PREFECT_API_URL=prefect_api),
    )
    assert out.returncode == 0, out.stderr
    assert STARTED not in out.stderr
    assert not (home / "gradebook-server.json").exists() and _processes_of(home) == []
