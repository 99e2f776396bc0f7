"""The local Prefect server gradebook commands share: started once, detached, reused (whatever
interpreter runs the command), never stopped while a command uses it, replaced when it is an
unused leftover, and second to PREFECT_API_URL; a command whose server dies under it says so in
one line. Real servers, real `gradebook` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest
from process_kit import ROOT, cli_env, gradebook, make_log, start_gradebook, wait_for

from flows.runtime.background_server import ensure_server, find_server, stop_server
from flows.runtime.procs import alive, environ_of

STARTED = "started a local Prefect server"
# Where a test starts the server itself, it waits this long: a cold start migrates the database,
# which took over the commands' own 120 s on a 2-core host at load 30 (other test runs)
SERVER_START_S = 600.0

# A verifier that holds every sample until the test opens its gate: the command that grades
# with it is mid-run, inside its Prefect session, for exactly as long as the test needs.
GATED_VERIFIER = textwrap.dedent(
    '''
    """gated_v: waits until $GATE_DIR/open exists, then grades the last word as the target."""
    import os
    import time
    from pathlib import Path

    from scorers.grade import SampleView, scored
    from scorers.registry import Verifier, register

    GATE = Path(os.environ["GATE_DIR"])


    def grade(view: SampleView):
        (GATE / "started").touch()
        while not (GATE / "open").exists():
            time.sleep(0.05)
        words = view.completion.split()
        ok = bool(words) and words[-1] == view.targets[0]
        return scored(1.0 if ok else 0.0, answer=words[-1] if words else None,
                      explanation="equal" if ok else "mismatch",
                      reason="verified_equal" if ok else "mismatch")


    register(Verifier("gated_v", grade, module="gated_v", params={}, label="test: gated"))
    '''
)


@pytest.fixture
def home(tmp_path: Path):
    """A Prefect home of this test's own; whatever server it ends with is stopped, and no
    process of that home may be left."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    try:
        yield home
    finally:
        stop_server(home, force=True)
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
def test_a_server_another_prefect_version_started_is_stopped_and_replaced_when_unused(home):
    old = ensure_server(home=home)
    record = home / "gradebook-server.json"
    data = json.loads(record.read_text())
    data["key"]["prefect"] = "2.0.0"
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


# -- many users: reuse across interpreters, leases, a server that dies ------------------------


def _record(home: Path) -> dict:
    return json.loads((home / "gradebook-server.json").read_text())


@pytest.mark.slow
def test_a_command_run_as_python3_reuses_the_server_python_started(home, tmp_path):
    # The reproduction: the record was keyed on the interpreter path, so the same
    # virtualenv's `python3` took the running server for a leftover and replaced it.
    python3 = Path(sys.executable).with_name("python3")
    assert python3.exists() and str(python3) != sys.executable
    env = _env(home)
    ensure_server(home=home, startup_timeout=SERVER_START_S)  # started by `python`
    before = _record(home)
    log = make_log(tmp_path / "logs", 2)

    out = subprocess.run(
        [str(python3), "-m", "flows.cli", "score", str(log), "--db", str(tmp_path / "w.duckdb")],
        env=env,
        capture_output=True,
        text=True,
    )

    assert out.returncode == 0, out.stderr
    assert STARTED not in out.stderr
    after = _record(home)
    assert (after["pid"], after["ticks"]) == (before["pid"], before["ticks"])
    assert alive(before["pid"], before["ticks"])


@pytest.fixture
def gated(tmp_path: Path):
    """A 3-sample log recording gated_v, its warehouse, and the gate directory."""
    (tmp_path / "gated_v.py").write_text(GATED_VERIFIER)
    gate = tmp_path / "gate"
    gate.mkdir()
    log = make_log(tmp_path / "logs", 3, verifiers=["gated_v"])
    return log, tmp_path / "w.duckdb", gate


@contextmanager
def _gated_score(home: Path, tmp_path: Path, gated, **extra: str):
    """`gradebook score` of the gated log, started and waited for until it grades (so it is
    inside its Prefect session); killed on the way out if the test left it running."""
    log, db, gate = gated
    env = _env(home, PYTHONPATH=cli_env(tmp_path)["PYTHONPATH"], GATE_DIR=str(gate), **extra)
    proc = start_gradebook("score", str(log), "--db", str(db), env=env, preload=("gated_v",))
    try:
        wait_for(
            lambda: (gate / "started").exists() or proc.poll() is not None,
            300,
            "the score command to start grading",
        )
        assert proc.poll() is None, proc.communicate()
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _let_finish(proc, gated) -> tuple[str, str]:
    (gated[2] / "open").touch()
    return proc.communicate(timeout=300)


@pytest.mark.slow
def test_a_server_a_command_uses_is_not_stopped_by_server_stop_nor_by_an_incompatible_command(
    home, tmp_path, gated
):
    log = gated[0]
    server = ensure_server(home=home, startup_timeout=SERVER_START_S)
    env = _env(home)
    with _gated_score(home, tmp_path, gated) as proc:
        # `server stop` leaves it running, naming the command that uses it
        stop = gradebook("server", "stop", env=env)
        assert stop.returncode == 2, stop.stdout + stop.stderr
        (line,) = [ln for ln in stop.stderr.splitlines() if ln.strip()]
        assert f"pid {server.pid}" in line and "in use by" in line, line
        assert f"{ROOT} (`gradebook score {log}" in line, line
        assert "--force" in line
        assert alive(server.pid, server.ticks)

        # a command that cannot use it (another Prefect version started it) leaves it too
        data = _record(home)
        data["key"]["prefect"] = "2.0.0"
        (home / "gradebook-server.json").write_text(json.dumps(data))
        start = gradebook("server", "start", env=env)
        assert start.returncode == 2, start.stdout + start.stderr
        (line,) = [ln for ln in start.stderr.splitlines() if ln.strip()]
        assert "runs Prefect 2.0.0" in line and "left running" in line, line
        assert f"{ROOT} (`gradebook score" in line, line
        assert alive(server.pid, server.ticks)
        assert _record(home)["pid"] == server.pid
        out, err = _let_finish(proc, gated)
    assert proc.returncode == 0, err
    from flows.runtime.server_leases import live_leases

    assert live_leases(home) == []  # its lease went with it

    stopped = gradebook("server", "stop", env=env)
    assert stopped.returncode == 0 and f"pid {server.pid}" in stopped.stdout
    assert not alive(server.pid, server.ticks)


def _lost_line(server, command: str) -> str:
    return (
        f"error: the local Prefect server at {server.ui_url} stopped answering (pid "
        f"{server.pid} is gone) during `gradebook {command}`; run the command again (it starts a "
        "new server if none is up), or see `gradebook server status`"
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill -9", "server stop --force"])
def test_a_server_gone_under_a_command_fails_it_in_one_line_and_a_rerun_finishes(
    home, tmp_path, gated, how
):
    """The command learns its server is gone only when Prefect's client gives up retrying it:
    20-70 s with Prefect's 5 retries, so this command's client retries once (the line and the
    re-run are the same however long it retried)."""
    log, db, gate = gated
    server = ensure_server(home=home, startup_timeout=SERVER_START_S)
    with _gated_score(home, tmp_path, gated, PREFECT_CLIENT_MAX_RETRIES="1") as proc:
        if how == "kill -9":
            os.kill(server.pid, signal.SIGKILL)
        else:
            stop = gradebook("server", "stop", "--force", env=_env(home))
            assert stop.returncode == 0, stop.stderr
        wait_for(lambda: not alive(server.pid, server.ticks), 10, "the server to be gone")
        out, err = _let_finish(proc, gated)
    assert proc.returncode == 2, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [_lost_line(server, "score")], err

    # what it wrote stays written: run again, every sample is graded exactly once
    env = _env(home, PYTHONPATH=cli_env(tmp_path)["PYTHONPATH"], GATE_DIR=str(gate))
    again = gradebook("score", str(log), "--db", str(db), env=env, preload=("gated_v",))
    assert again.returncode == 0, again.stderr
    from warehouse import Warehouse

    with Warehouse(db).read() as con:
        rows, samples = con.execute(
            "SELECT count(*), count(DISTINCT sample_id) FROM scores WHERE scorer = 'gated_v'"
        ).fetchone()
    assert (rows, samples) == (3, 3)


def test_a_lease_ends_with_its_process_even_under_kill_9_and_forked_children_do_not_hold_it(
    tmp_path,
):
    from flows.runtime.server_leases import live_leases

    home = tmp_path / "home"
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from flows.runtime.server_leases import holding

        with holding(Path({str(home)!r})):
            child = os.fork()
            if child == 0:
                time.sleep(600)
                os._exit(0)
            print(child, flush=True)
            time.sleep(600)
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, "score", "some.eval"],
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(holder.stdout.readline())
    try:
        (lease,) = live_leases(home)
        assert (lease.pid, lease.checkout, lease.venv) == (holder.pid, str(ROOT), sys.prefix)
        assert lease.command == "gradebook score some.eval"
        holder.kill()  # SIGKILL: no cleanup runs
        holder.wait()
        assert alive(child)  # the forked child outlives it, with the lease's descriptor closed
        assert live_leases(home) == []
        assert list((home / "users").glob("*.json")) == []  # the stale file is removed
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_serve_whose_server_is_killed_stops_its_runner_and_exits_in_one_line(home, tmp_path):
    from process_kit import MARK, marked

    (tmp_path / "watched.toml").write_text(
        'name = "watched"\nwarehouse = "watched.duckdb"\n'
        '[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
    )
    env = _env(home)
    server = ensure_server(home=home, startup_timeout=SERVER_START_S)
    proc = start_gradebook("serve", "watched.toml", "--watch-every", "5", env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        while line and "verifier watcher" not in line:
            line = proc.stdout.readline()
        assert line, proc.communicate()
        os.kill(server.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, out + err
    assert [ln for ln in err.splitlines() if ln.strip()] == [_lost_line(server, "serve")], err
    # its runner, flow runs, workers: all gone with it
    wait_for(lambda: marked(env[MARK]) == [], 30, "serve's processes to exit")


def _dead_record(home: Path, prefect: str, **key: str) -> None:
    """A server record in `home` whose process is gone (an exited pid, and a start time that
    no process of that pid can have)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    home.mkdir(parents=True, exist_ok=True)
    record = {
        "port": 9,
        "pid": gone.pid,
        "ticks": 1,
        "key": {"layout": "1", "prefect": prefect, **key},
        "database": str(home / "prefect.db"),
        "state": "up",
    }
    (home / "gradebook-server.json").write_text(json.dumps(record))


def test_status_lists_every_home_of_the_user_and_stop_all_clears_the_dead_ones(
    tmp_path, monkeypatch
):
    from flows.runtime.server_homes import note_home, prefect_version

    state = tmp_path / "state"
    base = state / "gradebook" / "prefect"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    _dead_record(base, prefect_version(), gradebook="0.0.9", python="/old/venv/bin/python")
    _dead_record(base / "prefect-2.0.0", "2.0.0")
    elsewhere = tmp_path / "elsewhere"
    _dead_record(elsewhere, prefect_version())
    note_home(elsewhere)
    (base / "prefect-2.0.0" / "storage").mkdir()  # what Prefect keeps in a home: not a home
    # neither home variable: the default home under the state directory (the session's
    # prefect_api fixture, when it runs first, sets PREFECT_HOME in this process's env)
    env = {
        k: v
        for k, v in _env(tmp_path).items()
        if k not in ("GRADEBOOK_PREFECT_HOME", "PREFECT_HOME")
    }
    env["XDG_STATE_HOME"] = str(state)

    status = json.loads(gradebook("server", "status", "--json", env=env).stdout)

    assert status["state"] == "stopped"
    assert status["home"] == str(base / f"prefect-{prefect_version()}")
    listed = {s["home"]: s for s in status["servers"]}
    assert set(listed) == {str(base / "prefect-2.0.0"), str(base), str(elsewhere)}
    assert all(s["state"] == "gone" and s["users"] == [] for s in listed.values())
    assert listed[str(base)]["legacy"] and not listed[str(elsewhere)]["legacy"]
    assert not listed[str(base / "prefect-2.0.0")]["compatible"]
    text = gradebook("server", "status", env=env).stdout
    assert "local Prefect server: not running" in text
    assert "other gradebook servers of this user (3):" in text
    assert "started by an older gradebook, which records no users" in text

    stop = gradebook("server", "stop", "--all", env=env)

    assert stop.returncode == 0, stop.stderr
    assert json.loads(gradebook("server", "status", "--json", env=env).stdout)["servers"] == []
