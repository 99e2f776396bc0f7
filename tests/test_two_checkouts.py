"""Two checkouts of gradebook as one user on one machine: they share one local Prefect server, and
neither stops it under the other.

The second checkout is real as far as gradebook can tell: a copy of this checkout's files in a
directory of its own, run by a virtualenv of its own (its `sys.executable`, `sys.prefix` and the
directory its `flows` package comes from all differ), whose site-packages reach this checkout's
installed dependencies through a .pth file. Both run with the default Prefect home (the state
directory under an XDG_STATE_HOME and a HOME of the test's own), as two clones would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import need
from process_kit import MARK, ROOT, cli_env, make_log, marked, start_gradebook, wait_for

from flows.runtime.background_server import ensure_server, prefect_home, stop_server
from flows.runtime.procs import alive

STARTED = "started a local Prefect server"


@pytest.fixture(scope="module")
def second_checkout(tmp_path_factory) -> tuple[Path, Path]:
    """(the copy's root, its virtualenv's python)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
    )
    need(listed.returncode == 0, f"{ROOT} is not a git checkout: cannot copy its files")
    base = tmp_path_factory.mktemp("checkout-b")
    copy = base / "gradebook"
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name)
    venv = base / "venv"
    subprocess.run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv],
        check=True,
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    # the copy first on sys.path, then this checkout's installed packages (and their .pth files)
    purelib = sysconfig.get_paths()["purelib"]
    (site / "checkout_b.pth").write_text(f"{copy}\nimport site; site.addsitedir({purelib!r})\n")
    python = venv / "bin" / "python"
    where = subprocess.run(
        [python, "-c", "import sys, flows; print(flows.__file__, sys.prefix, sys.executable)"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=base,  # not this checkout: `-c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    flows_file, prefix, executable = where.stdout.split()
    assert Path(flows_file).is_relative_to(copy), where.stdout
    assert (prefix, executable) == (str(venv), str(python)), where.stdout
    return copy, python


def _user_env(tmp: Path) -> dict[str, str]:
    """What both checkouts share: one user (HOME), the default Prefect home under its state
    directory, any free port; no Prefect home or API URL named."""
    return {
        "HOME": str(tmp / "user"),
        "XDG_STATE_HOME": str(tmp / "user" / ".local" / "state"),
        "GRADEBOOK_PREFECT_PORT": "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def _without_homes(env: dict[str, str]) -> dict[str, str]:
    drop = {"GRADEBOOK_PREFECT_HOME", "PREFECT_HOME", "PREFECT_API_URL", "VIRTUAL_ENV"}
    return {k: v for k, v in env.items() if k not in drop}


def _b(python: Path, copy: Path, env: dict[str, str], *args: str, cwd: Path):
    """`gradebook ARGS` run by the second checkout."""
    return subprocess.run(
        [str(python), "-m", "flows.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _status(python: Path, copy: Path, env: dict[str, str], cwd: Path) -> dict:
    out = _b(python, copy, env, "server", "status", "--json", cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _watcher_runs_completed(api_url: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import temporary_settings

    done = FlowRunFilter(state={"type": FlowRunFilterStateType(any_=[StateType.COMPLETED])})
    watcher = DeploymentFilter(name=DeploymentFilterName(any_=["watch-a"]))
    with temporary_settings(updates={"api.url": api_url}), get_client(sync_client=True) as c:
        return len(c.read_flow_runs(flow_run_filter=done, deployment_filter=watcher))


@pytest.mark.slow
def test_a_second_checkout_scores_and_sweeps_while_the_first_serves_and_neither_loses_its_server(
    tmp_path, second_checkout, monkeypatch, request
):
    """Up to 70 s on a loaded machine: ten `gradebook` processes of two checkouts in turn, a
    server start, and a wait for the next 5 s run of A's watcher."""
    copy, python_b = second_checkout
    user = _user_env(tmp_path)
    (tmp_path / "user").mkdir()
    # The shared server, in the default home both checkouts use, started here with time to
    # spare on a loaded host (a command allows 120 s); A's serve finds it as any command would.
    monkeypatch.setenv("XDG_STATE_HOME", user["XDG_STATE_HOME"])
    monkeypatch.delenv("GRADEBOOK_PREFECT_HOME")
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    home = prefect_home()
    ensure_server(home=home, startup_timeout=600)
    request.addfinalizer(lambda: stop_server(home, force=True))  # if the test fails half-way

    # checkout A (this one): `gradebook serve`, its verifier watcher running every 5 s
    a_dir = tmp_path / "a"
    a_dir.mkdir()
    (a_dir / "serve.toml").write_text(
        'name = "a-nightly"\nwarehouse = "a.duckdb"\n'
        '[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
    )
    env_a = _without_homes({**cli_env(a_dir), **user})
    serve = start_gradebook("serve", "serve.toml", "--watch-every", "5", env=env_a, cwd=a_dir)

    # checkout B: its own copy and virtualenv; a log to score and a sweep to run
    b_dir = tmp_path / "b"
    log = make_log(b_dir / "scored-logs", 3)
    (b_dir / "sweep.toml").write_text(
        textwrap.dedent(
            f"""
            name = "b-sweep"
            log_dir = "logs"
            warehouse = "b.duckdb"
            [[models]]
            name = "v1"
            model = "mockllm/model"
            args_from = "cluster_kit:mock_args"
            [[tasks]]
            task = "{copy / "tests" / "flows_kit.py"}@arith"
            args = {{n = 3}}
            verifiers = ["math"]
            [gates]
            min_accuracy = 0.0
            """
        )
    )
    env_b = _without_homes({**os.environ, **user})
    env_b["PYTHONPATH"] = str(copy / "tests")
    env_b[MARK] = uuid.uuid4().hex
    try:
        # serve prints this once it holds its server (quiet otherwise: the pipe never fills)
        seen = [serve.stdout.readline()]
        while seen[-1] and "verifier watcher" not in seen[-1]:
            seen.append(serve.stdout.readline())
        assert serve.poll() is None, "".join(seen) + serve.communicate()[1]
        before = _status(python_b, copy, env_b, b_dir)
        assert before["state"] == "running", before
        server = (before["pid"], before["api"])

        score = _b(python_b, copy, env_b, "score", str(log), "--db", "b.duckdb", cwd=b_dir)
        assert score.returncode == 0, score.stderr
        sweep = _b(python_b, copy, env_b, "sweep", "sweep.toml", cwd=b_dir)
        assert sweep.returncode == 0, sweep.stdout + sweep.stderr

        # B used A's server: it started none, and A's serve still runs on the same one
        assert STARTED not in score.stderr + sweep.stderr
        after = _status(python_b, copy, env_b, b_dir)
        assert (after["pid"], after["api"]) == server and after["state"] == "running"
        assert serve.poll() is None
        # status names who uses it now (A's serve) and who used it lately (B)
        assert len(after["servers"]) == 1, after["servers"]
        (a_user,) = after["users"]
        assert a_user["checkout"] == str(ROOT) and a_user["venv"] == sys.prefix
        assert a_user["command"] == "gradebook serve serve.toml --watch-every 5"
        assert {(u["checkout"], u["venv"]) for u in after["recent"]} == {
            (str(copy), str(python_b.parent.parent))
        }
        assert serve.poll() is None
        # and A's watcher goes on running flows on it after B is done
        done = _watcher_runs_completed(before["api"])
        wait_for(
            lambda: _watcher_runs_completed(before["api"]) > done,
            180,
            "another verifier-watcher run of checkout A",
        )

        # B cannot stop the server under A
        refused = _b(python_b, copy, env_b, "server", "stop", cwd=b_dir)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = [ln for ln in refused.stderr.splitlines() if ln.strip()]
        assert f"in use by {ROOT} (`gradebook serve serve.toml --watch-every 5`" in line, line
        assert alive(before["pid"])

        os.killpg(serve.pid, signal.SIGINT)  # A's Ctrl-C
        out_a, err_a = serve.communicate(timeout=120)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
    assert serve.returncode == 0, out_a + err_a
    assert "gradebook serve: stopped" in out_a
    assert "could not mark" not in err_a and "Traceback" not in err_a

    # nobody uses it now: `server stop` stops it, and nothing is left running
    stopped = _b(python_b, copy, env_b, "server", "stop", cwd=b_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert f"pid {before['pid']}" in stopped.stdout
    assert not alive(before["pid"])
    wait_for(
        lambda: marked(env_a[MARK]) == [] and marked(env_b[MARK]) == [],
        30,
        "every process either checkout started to exit",
    )
    assert before["home"] == str(home)
    assert home.parent == Path(user["XDG_STATE_HOME"]) / "gradebook" / "prefect"
    assert list((home / "users").glob("*.json")) == []  # no lease left
    final = _status(python_b, copy, env_b, b_dir)
    assert final["state"] == "stopped" and final["servers"] == []
