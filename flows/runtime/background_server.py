"""The local Prefect server that gradebook commands share: started once, detached, reused.

Without PREFECT_API_URL, the first command that runs a flow starts Prefect's own detached server
(`prefect server start --background`, which writes the server's pid to PREFECT_HOME/server.pid,
the file `prefect server stop` reads too), bound to 127.0.0.1, in gradebook's own Prefect home
(flows.runtime.server_homes: one per Prefect version, or the one the user names). It outlives
the command: later commands, from any checkout or virtualenv, find it and pay a health check
instead of its start. `gradebook server start|stop|status` manage it (flows/cli/server.py).

Beside Prefect's pid file gradebook keeps a record, `gradebook-server.json`: the port, when the
process started (a pid alone may name another process once the first is gone) and the key it
was started with (`server_key()`). A server is reused when its key matches and it answers.

Every command that uses the server holds a lease on it while it does
(flows.runtime.server_leases). A server with a live lease is never stopped by another command:
not as a leftover, not by `gradebook server stop` (unless `--force`). One nobody uses that
cannot be reused -- its process was killed, it hangs, it was started another way -- is a
leftover, stopped and replaced before any flow runs against it. A lock file serialises the
check-and-start, so commands started together share one server.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flows.runtime.procs import alive, environ_of, group_members, kill_group, start_ticks, wait_gone
from flows.runtime.server import PrefectServerError, free_port, quiet_env, server_healthy, warm_up
from flows.runtime.server_homes import (
    all_homes,
    explicit_home,
    legacy_home,
    note_home,
    prefect_home,
    server_key,
)
from flows.runtime.server_leases import Lease, holding, live_leases, recent_users

__all__ = [
    "STARTUP_TIMEOUT_S",
    "ServerInUse",
    "ServerInfo",
    "all_servers",
    "ensure_server",
    "find_server",
    "prefect_home",
    "stop_server",
]

STARTUP_TIMEOUT_S = 120.0  # a cold start migrates the database: 10-25 s on a busy 2-core host
DEFAULT_PORT = 4200  # Prefect's own default; any free port when it is taken
_RECORD = "gradebook-server.json"
_PID_FILE = "server.pid"  # Prefect's name (prefect.cli._server_utils.SERVER_PID_FILE_NAME)
_LOCK = "server.lock"
_LAUNCH_LOG = "server-launch.log"


def compatible(key: dict[str, str] | None) -> bool:
    """Whether a server started with `key` serves this process (None: the user started it)."""
    if key is None:
        return True
    return {k: key.get(k) for k in ("layout", "prefect")} == server_key()


@dataclass
class ServerInfo:
    """A local Prefect server as gradebook knows it.

    Attributes:
        home: its PREFECT_HOME.
        port: the port it listens on, on 127.0.0.1.
        pid: its process (None while its launcher runs).
        ticks: when that process started (`flows.runtime.procs.start_ticks`).
        key: `server_key()` as it was when it started; None for a server gradebook did not
            start (`prefect server start --background` in a PREFECT_HOME the user chose).
        database: its database (a file, or the setting that names it).
        state: "starting" or "up".
        started_here: this process started it.
    """

    home: Path
    port: int
    pid: int | None = None
    ticks: int | None = None
    key: dict[str, str] | None = None
    database: str = ""
    state: str = "starting"
    started_here: bool = field(default=False, compare=False)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def uptime_s(self) -> float | None:
        if self.ticks is None:
            return None
        try:
            since_boot = float(Path("/proc/uptime").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return max(0.0, since_boot - self.ticks / os.sysconf("SC_CLK_TCK"))

    def alive(self) -> bool:
        return self.pid is not None and alive(self.pid, self.ticks)

    @property
    def prefect(self) -> str:
        """The Prefect version it runs ("?" when gradebook did not start it)."""
        return (self.key or {}).get("prefect", "?")


class ServerInUse(PrefectServerError):
    """A server another command uses was not stopped (the message names who uses it)."""

    def __init__(self, message: str, info: ServerInfo, users: list[Lease]) -> None:
        super().__init__(message)
        self.info, self.users = info, users


# -- files in the home -----------------------------------------------------------------------


def _read_record(home: Path) -> ServerInfo | None:
    try:
        raw = json.loads((home / _RECORD).read_text())
        return ServerInfo(
            home=home,
            port=int(raw["port"]),
            pid=raw.get("pid"),
            ticks=raw.get("ticks"),
            key=raw.get("key"),
            database=str(raw.get("database", "")),
            state=str(raw.get("state", "starting")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, or not one we can trust: the server it describes is a leftover


def _write_record(info: ServerInfo) -> None:
    data = {k: v for k, v in asdict(info).items() if k not in ("home", "started_here")}
    tmp = info.home / f".{_RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, info.home / _RECORD)


def _read_pid_file(home: Path) -> int | None:
    try:
        return int((home / _PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _forget(home: Path) -> None:
    for name in (_RECORD, _PID_FILE):
        (home / name).unlink(missing_ok=True)


@contextmanager
def _locked(home: Path, timeout_s: float) -> Iterator[None]:
    """Hold the home's lock (one check-and-start at a time); released if we die."""
    with open(home / _LOCK, "a") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PrefectServerError(
                        f"another gradebook command has been starting the local Prefect server "
                        f"in {home} for {timeout_s:.0f}s; try again, or `gradebook server stop`"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _database(env: dict[str, str], home: Path) -> str:
    for var in ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL"):
        if env.get(var):
            return f"(set by {var})"
    return str(home / "prefect.db")


def _serves_home(pid: int, home: Path) -> bool:
    """Whether `pid` is a Prefect server process started for `home` (not a reused pid)."""
    env = environ_of(pid)
    return env is not None and env.get("PREFECT_HOME") == str(home) and _is_prefect(pid)


def _is_prefect(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"prefect" in cmd


def _cmdline_port(pid: int) -> int | None:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--port" and value.isdigit():
            return int(value)
    return None


# -- finding one -----------------------------------------------------------------------------


def _known(home: Path) -> ServerInfo | None:
    """The server the home's files describe (alive or not), adopting a pid the record lacks."""
    rec = _read_record(home)
    pid = _read_pid_file(home)
    if rec is None:
        # `prefect server start --background` run by hand in this home: the user's own server
        if pid is not None and alive(pid) and _serves_home(pid, home):
            port = _cmdline_port(pid)
            if port is not None:
                return ServerInfo(home, port, pid, start_ticks(pid), None, "", "up")
        return None
    if rec.pid is None and pid is not None and alive(pid) and _serves_home(pid, home):
        # the command that launched it died before it could record the pid
        if _cmdline_port(pid) == rec.port:
            rec.pid, rec.ticks = pid, start_ticks(pid)
    return rec


def _usable(info: ServerInfo | None, *, patience_s: float = 0.0) -> ServerInfo | None:
    """`info` if it is a live, current, answering server (waiting up to `patience_s`)."""
    if info is None or info.pid is None:
        return None
    if not compatible(info.key):
        return None
    if not info.alive() or _read_pid_file(info.home) != info.pid:
        return None
    deadline = time.monotonic() + patience_s
    while True:
        if server_healthy(info.api_url, timeout=2.0):
            return info
        if time.monotonic() > deadline or not info.alive():
            return None
        time.sleep(0.25)


def find_server(home: Path | None = None) -> ServerInfo | None:
    """The running, reusable server of `home` (default `prefect_home()`), or None."""
    home = home or prefect_home()
    return _usable(_known(home))


def server_at(api_url: str, home: Path | None = None) -> ServerInfo | None:
    """The local server of `home` (default `prefect_home()`) if it is the one at `api_url`."""
    info = _known(home or prefect_home())
    return info if info is not None and info.api_url == api_url.rstrip("/") else None


def leftover(home: Path | None = None) -> ServerInfo | None:
    """A server the home's files name that is not reusable (dead, hung, or started for another
    Prefect version or layout), or None. It is replaced only when no command uses it."""
    home = home or prefect_home()
    info = _known(home)
    if info is None or _usable(info) is not None:
        return None
    return info


def why_unusable(info: ServerInfo) -> str:
    """Why a server this process cannot use is not usable, in a few words."""
    if not info.alive():
        return f"its process (pid {info.pid}) is gone" if info.pid else "it never started"
    if not compatible(info.key):
        want = server_key()
        key = info.key or {}
        if key.get("prefect") != want["prefect"]:
            theirs, ours = key.get("prefect", "?"), want["prefect"]
            return f"it runs Prefect {theirs}, this gradebook Prefect {ours}"
        return f"it was started another way (layout {key.get('layout', '?')})"
    return "it does not answer"


def users_text(users: list[Lease]) -> str:
    """Who uses a server, for a one-line message: the first user and how many more."""
    first = users[0]
    since = time.strftime("%H:%M:%S", time.localtime(first.started_at))
    text = f"{first.checkout} (`{first.command}`, pid {first.pid}, since {since})"
    return text if len(users) == 1 else f"{text} and {len(users) - 1} more"


# -- starting and stopping ---------------------------------------------------------------------


def ensure_server(
    *,
    meanwhile: Callable[[], object] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    home: Path | None = None,
) -> ServerInfo:
    """The shared local server, started now if none is usable (`started_here` then).

    This process holds a lease on it during the call (`server_leases.holding`); a caller that
    goes on using the server holds one around the call and its use (as `prefect_session`).

    Args:
        meanwhile: work to do while a server boots (or at once if one is up); if it raises, a
            server started for this call is stopped again and the exception propagates.
        startup_timeout: seconds to wait for a new server to answer.
        home: its PREFECT_HOME (default `prefect_home()`).

    Raises:
        ServerInUse: the home's server cannot serve this process and another command uses it
            (only in a home named explicitly: the state directory's homes are per Prefect
            version and layout).
        PrefectServerError: no server could be started; the message says why and what to do.
    """
    home = home or prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    if home == explicit_home():
        note_home(home)
    # The lease first, then the check under the lock: a `server stop` or a replacement in
    # another process either sees this lease or has finished before the check.
    with holding(home), _locked(home, startup_timeout + 30):
        info = _known(home)
        # a server of this version still booting (its starter died) or slow under load
        patience = startup_timeout if info is not None and info.state == "starting" else 15
        found = _usable(info, patience_s=patience)
        if found is None:
            users = live_leases(home)
            if info is not None and info.alive() and users:
                raise ServerInUse(
                    f"the local Prefect server in {home} (pid {info.pid}, {info.ui_url}) cannot "
                    f"serve this command: {why_unusable(info)}; {users_text(users)} uses it, so "
                    "it was left running. Wait for that command, set GRADEBOOK_PREFECT_HOME to "
                    "another directory, or stop it with `gradebook server stop --force`",
                    info,
                    users,
                )
            _stop(info, home)
            return _start(home, meanwhile, startup_timeout)
    if meanwhile is not None:
        meanwhile()
    return found


def stop_server(home: Path | None = None, *, force: bool = False) -> ServerInfo | None:
    """Stop the home's server (whatever its state) and forget it; returns what was stopped.

    Args:
        force: stop it even while other commands use it (they then fail, saying so).

    Raises:
        ServerInUse: another command uses it and `force` is not set; nothing was stopped.
    """
    home = home or prefect_home()
    if not home.is_dir():
        return None
    with _locked(home, STARTUP_TIMEOUT_S):
        info = _known(home)
        if not force and info is not None and info.alive():
            users = live_leases(home)
            if users:
                raise ServerInUse(
                    f"the local Prefect server at {info.ui_url} (pid {info.pid}) is in use by "
                    f"{users_text(users)}; it was left running. Stop that command first, or "
                    "`gradebook server stop --force` (the commands using it then fail)",
                    info,
                    users,
                )
        stopped = _stop(info, home)
    return info if stopped else None


def _stop(info: ServerInfo | None, home: Path) -> bool:
    """Stop the server `info` describes if its process is still the one recorded; forget it."""
    pids = {p for p in (info.pid if info else None, _read_pid_file(home)) if p is not None}
    stopped = False
    for pid in pids:
        ticks = info.ticks if info is not None and info.pid == pid else None
        if alive(pid, ticks) and _serves_home(pid, home):
            os.kill(pid, signal.SIGTERM)
            if not wait_gone(pid, 20.0, ticks):
                os.kill(pid, signal.SIGKILL)
                wait_gone(pid, 5.0, ticks)
            stopped = True
    _forget(home)
    return stopped


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_port() -> int:
    wanted = os.environ.get("GRADEBOOK_PREFECT_PORT", "")
    port = int(wanted) if wanted.isdigit() else DEFAULT_PORT
    return port if port and _port_free(port) else free_port()


def _server_env(home: Path, api_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT__")}
    env.update(quiet_env())
    env.update(
        {"PREFECT_HOME": str(home), "PREFECT_API_URL": api_url, "PREFECT_UI_API_URL": api_url}
    )
    return env


def _start(
    home: Path, meanwhile: Callable[[], object] | None, startup_timeout: float
) -> ServerInfo:
    port = _pick_port()
    for attempt in range(3):
        info = ServerInfo(home, port, key=server_key())
        env = _server_env(home, info.api_url)
        info.database = _database(env, home)
        _write_record(info)  # before the launch: a starter that dies leaves a record to find
        args = [sys.executable, "-m", "prefect", "server", "start", "--background"]
        args += ["--host", "127.0.0.1", "--port", str(port), "--analytics-off", "--ui"]
        log_path = home / _LAUNCH_LOG
        with open(log_path, "wb") as log:
            # its own session: no terminal signal (Ctrl-C) reaches it, and the server it starts
            # is in this process group
            launcher = subprocess.Popen(
                args, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            if meanwhile is not None and attempt == 0:
                meanwhile()
            deadline = time.monotonic() + startup_timeout
            if _wait_exit(launcher, deadline) != 0:
                text = _tail(log_path)
                if "already in use" in text and attempt < 2:
                    port = free_port()
                    continue
                raise PrefectServerError(
                    f"`prefect server start --background` failed (exit {launcher.returncode}): "
                    f"{text}"
                )
            pid = _read_pid_file(home)
            if pid is None:
                raise PrefectServerError(f"the Prefect server wrote no pid file in {home}")
            info.pid, info.ticks = pid, start_ticks(pid)
            _write_record(info)
            if not _wait_healthy(info, deadline):
                if not info.alive() and not _port_free(port) and attempt < 2:
                    _forget(home)  # another process took the port between check and bind
                    port = free_port()
                    continue
                raise PrefectServerError(_why_not_up(info, startup_timeout))
            warm_up(info.api_url)
            info.state = "up"
            _write_record(info)
            info.started_here = True
            return info
        except BaseException:
            # nobody used it yet (a bad task found meanwhile, Ctrl-C): leave nothing behind;
            # the launcher and the server it started are one process group
            kill_group(launcher.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10.0
            while group_members(launcher.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            kill_group(launcher.pid, signal.SIGKILL)
            launcher.wait()
            _forget(home)
            raise
    raise PrefectServerError(f"no free port for a local Prefect server (last tried {port})")


def _wait_exit(proc: subprocess.Popen[bytes], deadline: float) -> int:
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise PrefectServerError("`prefect server start --background` did not return") from None


def _wait_healthy(info: ServerInfo, deadline: float) -> bool:
    while not server_healthy(info.api_url, timeout=1.0):
        if not info.alive() or time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def _why_not_up(info: ServerInfo, timeout: float) -> str:
    how = (
        f"PREFECT_HOME={info.home} {Path(sys.executable).parent / 'prefect'} server start "
        f"--port {info.port}"
    )
    if info.alive():
        return (
            f"the local Prefect server (pid {info.pid}) did not answer at {info.api_url} within "
            f"{timeout:.0f}s; see why with `{how}` (after `gradebook server stop`)"
        )
    return f"the local Prefect server exited while starting; see why with `{how}`"


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no output)"
    text = [re.sub(r"\s+", " ", ln) for ln in text[-lines:]]
    return " | ".join(text) or "(no output)"


def describe(info: ServerInfo) -> dict[str, Any]:
    """What `gradebook server status` shows of a server."""
    up = info.uptime_s() if info.alive() else None
    return {
        "ui": info.ui_url,
        "api": info.api_url,
        "pid": info.pid,
        "uptime": _duration(up) if up is not None else "-",
        "prefect": info.prefect,
        "database": info.database or "(unknown: not started by gradebook)",
        "home": str(info.home),
    }


def server_facts(home: Path) -> dict[str, Any] | None:
    """A home's server as `gradebook server status --json` lists it (None: it has none).

    `state` is "running", "starting", "not answering" or "gone" (its process is); `users` are
    the commands using it now, `recent` the other checkouts that used it lately; `legacy`: an
    older gradebook started it (it records no users).
    """
    info = _known(home)
    if info is None:
        return None
    if not info.alive():
        state = "gone"
    elif server_healthy(info.api_url, timeout=1.0):
        state = "running"
    else:
        state = "starting" if info.state == "starting" else "not answering"
    users = live_leases(home, include_own=True)
    using = {(u.checkout, u.venv) for u in users}
    recent = [r for r in recent_users(home) if (r.checkout, r.venv) not in using]
    return {
        "state": state,
        "this_checkout": home == prefect_home(),
        "compatible": compatible(info.key),
        "legacy": home == legacy_home(),
        **describe(info),
        "users": [u.describe() for u in users],
        "recent": [r.describe() for r in recent],
    }


def all_servers() -> list[dict[str, Any]]:
    """Every gradebook server of this user (`server_facts` of each home), this process's first."""
    return [facts for home in all_homes() if (facts := server_facts(home)) is not None]


def _duration(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h}h {m:02d}m"
    if h:
        return f"{h}h {m:02d}m"
    return f"{m}m {s:02d}s"
