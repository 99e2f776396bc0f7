"""Prefect server plumbing: health checks, ports, and a server that lives as long as a block.

`local_server` runs `prefect server start` for the duration of a `with` block: the tests' one
server per session and the benchmarks use it. The CLI's commands share one detached server
instead (flows.runtime.background_server). Prefect's own fallback, a temporary server started
inside the first flow call, costs seconds in every process, runs no schedules and prints
telemetry tracebacks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from flows.runtime.procs import parent_death_preexec

__all__ = [
    "PrefectServerError",
    "free_port",
    "local_server",
    "quiet_env",
    "server_healthy",
    "stop_process_group",
    "warm_up",
]


class PrefectServerError(RuntimeError):
    """The local Prefect server did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_env() -> dict[str, str]:
    """Settings that keep Prefect from printing noise that is not the user's business."""
    return {
        # the telemetry job of a server on SQLite prints "database is locked" tracebacks
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    }


def server_healthy(api_url: str, timeout: float = 2.0) -> bool:
    """True if a Prefect API answers at `api_url` (e.g. http://127.0.0.1:4200/api)."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextmanager
def local_server(
    *,
    home: Path | None = None,
    port: int | None = None,
    ui: bool = True,
    startup_timeout: float = 90.0,
    meanwhile: Callable[[], object] | None = None,
) -> Iterator[str]:
    """Run `prefect server start` for the duration of the block; yield its API URL.

    Args:
        home: PREFECT_HOME for the server (its SQLite database and log live there); a temp dir,
            removed at the end, if None.
        port: the port; a free one if None.
        ui: serve the web UI too (off in tests: it saves start-up time).
        startup_timeout: seconds to wait for /api/health before giving up.
        meanwhile: work to do while the server boots (seconds); if it raises, the server is
            stopped and the exception propagates.

    Raises:
        PrefectServerError: the server exited or did not answer in time; the message holds the
            tail of its log.
    """
    port = port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    with (
        tempfile.TemporaryDirectory(prefix="gradebook-prefect-")
        if home is None
        else nullcontext(str(home))
    ) as tmp:
        home = Path(tmp) / "home" if home is None else home
        home.mkdir(parents=True, exist_ok=True)
        log_path = home / "server.log"
        env = {
            **os.environ,
            **quiet_env(),
            "PREFECT_HOME": str(home),
            "PREFECT_API_URL": api_url,
            "PREFECT_UI_API_URL": api_url,
        }
        args = [sys.executable, "-m", "prefect", "server", "start"]
        args += ["--host", "127.0.0.1", "--port", str(port), "--analytics-off"]
        args += ["--ui"] if ui else ["--no-ui"]
        with open(log_path, "wb") as log:
            # own session: Ctrl-C in the terminal goes to us, and we stop the server in order;
            # and it gets SIGTERM if we die without stopping it (a killed test run)
            proc = subprocess.Popen(
                args,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death_preexec(signal.SIGTERM),
            )
        try:
            if meanwhile is not None:
                meanwhile()
            deadline = time.monotonic() + startup_timeout
            while not server_healthy(api_url, timeout=1.0):
                if proc.poll() is not None:
                    raise PrefectServerError(
                        f"prefect server exited with code {proc.returncode}: {_tail(log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise PrefectServerError(
                        f"prefect server did not answer at {api_url} within "
                        f"{startup_timeout:.0f}s{_busy()}; its log {log_path}: "
                        f"{_tail(log_path)}; try again once the machine is less busy, or "
                        "start one with `prefect server start` and export PREFECT_API_URL"
                    )
                time.sleep(0.25)
            warm_up(api_url)
            yield api_url
        finally:
            stop_process_group(proc)


def warm_up(api_url: str) -> None:
    """Pay a new server's slow first answer here, not in the first flow run."""
    # Every client's first call is GET /admin/version (its API version check). A new server
    # is slow to answer the first one and fast later (/health and other routes are fast from
    # the start), so pay it here, where the caller
    # waits for the server anyway, not inside the first flow run.
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/admin/version", timeout=5) as resp:
            resp.read()
    except (urllib.error.URLError, OSError, ValueError):
        pass  # not fatal: the flow's own call will report a server that does not answer


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process started with its own session, SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no server log)"
    said = [line.strip() for line in text if _says_something(line)]
    return " | ".join(said[-lines:]) or "(nothing but its start-up banner)"


def _says_something(line: str) -> bool:
    """Not a line of Prefect's ASCII-art banner or its box of hints."""
    body = line.strip().strip("|").strip()
    letters = sum(c.isalnum() for c in body)
    return letters >= max(3, len(body) // 2) and not body.startswith(
        ("Configure Prefect", "prefect config set", "View the API reference", "The dashboard")
    )


def _busy() -> str:
    """ " (load average 33.5 on 2 CPUs)" when the machine is overloaded: a likely cause."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cpus = os.cpu_count() or 1
    return f" (load average {load:.1f} on {cpus} CPUs)" if load > 2 * cpus else ""
