"""Shared test plumbing.

Services (Docker Engine, a Prefect server) are real in these tests. When one is missing the test
says why and skips on a developer's machine; under CI (CI=true) a missing service is a failure.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# As the CLI does: from here on this process records the exact source of every project module it
# imports (scorers.identity.loaded_code), so a verifier it grades in-process can be fingerprinted as run.
import flows  # noqa: F401

# The readline module, which pytest imports at start-up (_pytest/capture.py), exports COLUMNS=80
# and LINES=24 into the C environment when stdin is not a terminal. os.environ never shows them,
# but a process started without an explicit env inherits them: pytest-xdist's workers did, and
# the commands they ran laid their tables out 80 columns wide where a plain `pytest` run's were
# 120. What the shell gave this process (os.environ) is what the processes it starts get.
for _var in ("COLUMNS", "LINES"):
    if _var not in os.environ:
        os.unsetenv(_var)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# "gw0", "gw1", ... in a pytest-xdist worker (`make test` runs the suite on several), "" alone.
# Each worker is a test session of its own, isolated as two checkouts' sessions are: its own
# temp dirs, state dirs and Prefect servers, free ports, and sandbox containers labelled with
# their owner's pid.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
# A test that takes longer than this says why in its docstring (a warning names it otherwise).
LONG_TEST_S = 60.0


# Where everything the tests run keeps state, caches and data, instead of the user's home:
# another gradebook of the same user (a checkout's `serve`, another test run) may be using
# ~/.local/state/gradebook, ~/.cache/gradebook, Inspect's ~/.local/share/inspect_ai or ~/.prefect.
SESSION_DIRS = {
    "XDG_STATE_HOME": "state",
    "XDG_CACHE_HOME": "cache",
    "XDG_DATA_HOME": "data",
    "PREFECT_HOME": "prefect",
}
_session_home: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point the XDG dirs and Prefect's home at one session temp dir, before any test module
    imports Prefect (which reads PREFECT_HOME once, at import). The package caches (uv, pip)
    stay where they were: they hold no gradebook state, and an offline install needs them."""
    global _session_home
    prefix = f"gradebook-test-home-{WORKER}-" if WORKER else "gradebook-test-home-"
    _session_home = Path(tempfile.mkdtemp(prefix=prefix))
    real_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    os.environ.setdefault("UV_CACHE_DIR", str(real_cache / "uv"))
    os.environ.setdefault("PIP_CACHE_DIR", str(real_cache / "pip"))
    for var, name in SESSION_DIRS.items():
        os.environ[var] = str(_session_home / name)
    # the AWS chain reads ~/.aws and AWS_* variables: a test reaches only its own S3 server
    # (tests/s3_kit.py), never the user's buckets with the user's keys
    for var in [v for v in os.environ if v.startswith("AWS_")]:
        del os.environ[var]
    os.environ["AWS_CONFIG_FILE"] = str(_session_home / "aws" / "config")
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(_session_home / "aws" / "credentials")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # no instance-role lookup off this machine


def pytest_unconfigure(config: pytest.Config) -> None:
    if "prefect" in sys.modules:
        # the session's servers are gone by now: what Prefect still holds for them is dropped,
        # or its exit-time drain would retry each item with no deadline
        from flows.runtime.session import flush_to_server

        flush_to_server(timeout=5)
    if _session_home is not None:
        shutil.rmtree(_session_home, ignore_errors=True)


_SPENT = pytest.StashKey[float]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Warn about a test that took over LONG_TEST_S (setup, call and teardown) with no docstring
    saying why: the suite's time is a budget, and a long test owes its reader a reason."""
    report = yield
    spent = item.stash.get(_SPENT, 0.0) + report.duration
    item.stash[_SPENT] = spent
    function = getattr(item, "function", None)
    if report.when == "teardown" and spent > LONG_TEST_S and not getattr(function, "__doc__", ""):
        item.warn(
            pytest.PytestWarning(
                f"took {spent:.0f}s (over {LONG_TEST_S:.0f}s) and its docstring does not say why"
            )
        )
    return report


def need(condition: bool, why: str) -> None:
    """Skip (or, under CI, fail) the calling test when a service or input is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Caches (the fingerprint's) go to a session temp dir, never the user's ~/.cache; so does
    the state a command keeps (the key that seals stored verifier specs), never the user's
    ~/.local/state."""
    from flows.runtime.envvars import environ_set

    with environ_set(
        {
            "GRADEBOOK_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
            "GRADEBOOK_STATE_DIR": str(tmp_path_factory.mktemp("state")),
        }
    ):
        yield


@pytest.fixture(scope="session", autouse=True)
def _own_prefect_home(tmp_path_factory: pytest.TempPathFactory):
    """A command that starts gradebook's shared local Prefect server (no PREFECT_API_URL) starts
    it in a session temp home, on any free port, never the user's; and it is stopped when the
    session ends, so no test leaves a server behind. (The state directory, where gradebook notes
    the homes it used, is already the session's: see the XDG variables above.)"""
    from flows.runtime.envvars import environ_set

    home = tmp_path_factory.mktemp("gradebook-prefect")
    with environ_set({"GRADEBOOK_PREFECT_HOME": str(home), "GRADEBOOK_PREFECT_PORT": "0"}):
        try:
            yield home
        finally:
            from flows.runtime.background_server import stop_server

            stop_server(home, force=True)  # the session's own: a command a test left is done


@pytest.fixture(scope="session")
def shared_data() -> Path:
    need(SHARED_DATA.is_dir(), f"reference data not found at {SHARED_DATA} (../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """One real `prefect server start` for the whole test session; yields its API URL.

    Every test that runs flows shares it (a server per test would cost seconds each). Prefect's
    home and result storage point at session temp dirs, so cached results never leak between
    sessions. Under CI a server that does not come up fails the test.
    """
    from flows.runtime.server import PrefectServerError, local_server, quiet_env

    root = tmp_path_factory.mktemp("prefect")
    env = {
        **quiet_env(),
        "PREFECT_HOME": str(root / "client-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(root / "results"),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # the API log handler flushes at exit, after the server is gone, and prints an error
        "PREFECT_LOGGING_TO_API_ENABLED": "false",
    }
    try:
        # a loaded 2-core machine (another test run beside this one) has taken over 90 s to
        # start a server; a test run waits for it rather than skipping every flow test
        timeout = float(os.environ.get("GRADEBOOK_TEST_SERVER_TIMEOUT", "600"))
        server = local_server(home=root / "server-home", ui=False, startup_timeout=timeout)
        api_url = server.__enter__()
    except PrefectServerError as exc:
        need(False, f"no Prefect server: {exc}")
        return
    env["PREFECT_API_URL"] = api_url
    from prefect.settings import temporary_settings

    from flows.runtime.envvars import environ_set
    from flows.runtime.session import in_process_settings

    # Prefect reads env at import; temporary_settings makes an already-imported prefect agree.
    settings = {
        **in_process_settings(),
        "api.url": api_url,
        "home": root / "client-home",
        "results.local_storage_path": root / "results",
        "server.analytics_enabled": False,
        "logging.to_api.enabled": False,
    }
    try:
        with environ_set(env), temporary_settings(updates=settings):
            yield api_url
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """One real S3-compatible server (moto's, over HTTP on 127.0.0.1) for the test session.
    Under CI a server that does not come up fails the test."""
    from s3_kit import S3ServerError
    from s3_kit import s3_server as start

    running = start(tmp_path_factory.mktemp("s3-server"))
    try:
        server = running.__enter__()
    except S3ServerError as exc:
        need(False, f"no S3 server: {exc}")
        return
    try:
        yield server
    finally:
        running.__exit__(None, None, None)


@pytest.fixture
def s3_env(s3_server):
    """The session's S3 server in this process's environment (AWS_ENDPOINT_URL, a key pair), as
    a user sets it for MinIO; yields the server. A `gradebook` subprocess gets
    `s3_server.env()`."""
    from flows.runtime.envvars import environ_set

    with environ_set(s3_server.env()):
        yield s3_server


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A fresh, empty bucket on the session's S3 server, as `s3://name`."""
    return f"s3://{s3_env.new_bucket()}"


@pytest.fixture
def docker_sandbox():
    """The process-wide sandbox pool on a running Docker Engine with the sandbox image built.

    Skips locally (fails under CI) when Docker or the image is missing: `make services`. The
    pool is shared by the session (a closed one is replaced) and removed at interpreter exit.
    """
    from scorers.sandbox.pool import SandboxUnavailable, default_pool

    try:
        return default_pool()
    except SandboxUnavailable as exc:
        need(False, f"Docker sandbox unavailable: {exc}")
