"""Where gradebook's local Prefect servers live: one home per compatible kind of server.

A server is shared by every command whose Prefect speaks its API and starts it the same way
(`server_key()`: Prefect's version and gradebook's server layout), whatever the interpreter,
virtualenv or checkout the command runs from. Servers that are not compatible never share a
home: under the state directory, `$XDG_STATE_HOME/gradebook/prefect` (else
`~/.local/state/gradebook/prefect`), each kind has its own (`prefect-3.9.1`: its database,
Prefect's pid file, gradebook's record, the leases of the commands using it). So a checkout on
another Prefect version starts its own server beside a running one instead of replacing it, and
an older Prefect never meets a database a newer one migrated.

GRADEBOOK_PREFECT_HOME, else PREFECT_HOME, names a home explicitly: it is used exactly as given
(the user chose it, e.g. to keep two checkouts fully apart), and noted in the state directory
so `gradebook server status` lists its server too. Gradebook versions before the leases kept
their server in the state directory itself: the *legacy* home, listed, never reused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "LAYOUT",
    "all_homes",
    "explicit_home",
    "legacy_home",
    "note_home",
    "prefect_home",
    "prefect_version",
    "server_key",
    "state_dir",
]

# Bump when the way the server is started changes: servers of each layout get their own home.
LAYOUT = 1
_ELSEWHERE = "elsewhere"  # in the state dir: one file per explicit home a server was started in
_MARKERS = ("gradebook-server.json", "server.pid", "users")


def prefect_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prefect")
    except PackageNotFoundError:
        return "unknown"


def server_key() -> dict[str, str]:
    """What a server must have been started with for this process to use it: the API it
    speaks (Prefect's version) and how gradebook starts it (LAYOUT). The interpreter, the
    virtualenv and gradebook's own version do not matter: the server runs Prefect only."""
    return {"layout": str(LAYOUT), "prefect": prefect_version()}


def state_dir() -> Path:
    """$XDG_STATE_HOME/gradebook/prefect, else ~/.local/state/gradebook/prefect."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return (base / "gradebook" / "prefect").resolve()


def explicit_home() -> Path | None:
    """The home GRADEBOOK_PREFECT_HOME, else PREFECT_HOME, names (None: neither is set)."""
    for var in ("GRADEBOOK_PREFECT_HOME", "PREFECT_HOME"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser().resolve()
    return None


def _home_name() -> str:
    name = f"prefect-{prefect_version()}"
    return name if LAYOUT == 1 else f"{name}-layout{LAYOUT}"


def prefect_home() -> Path:
    """The home of the server this process's commands use: the explicit one if set, else the
    state directory's home for this Prefect version and layout. Never ~/.prefect unless asked."""
    return explicit_home() or state_dir() / _home_name()


def legacy_home() -> Path:
    """Where gradebook kept its one server before servers were leased and kept per version."""
    return state_dir()


def note_home(home: Path) -> None:
    """Remember an explicit home outside the state directory, for `gradebook server status`."""
    base = state_dir()
    if home == base or home.parent == base:
        return
    mark = base / _ELSEWHERE / hashlib.sha256(str(home).encode()).hexdigest()[:16]
    try:
        if mark.is_file() and mark.read_text() == str(home):
            return
        mark.parent.mkdir(parents=True, exist_ok=True)
        tmp = mark.with_name(f".{mark.name}.{os.getpid()}")
        tmp.write_text(str(home))
        os.replace(tmp, mark)
    except OSError:
        pass  # a listing aid: never fail a command for it


def _has_server_files(home: Path) -> bool:
    return any((home / marker).exists() for marker in _MARKERS)


def all_homes() -> list[Path]:
    """Every home of this user that holds (or held) a gradebook server: this process's first,
    then the state directory's, the legacy one, and the explicit ones noted there. A note
    whose home is gone is dropped."""
    base = state_dir()
    homes = [prefect_home()]
    if base.is_dir():
        homes += sorted(p for p in base.iterdir() if p.is_dir() and _has_server_files(p))
        if _has_server_files(base):
            homes.append(base)
    for mark in sorted((base / _ELSEWHERE).glob("[0-9a-f]*")):
        try:
            home = Path(mark.read_text().strip())
        except OSError:
            continue
        if home.is_dir() and _has_server_files(home):
            homes.append(home)
        elif not home.exists():
            mark.unlink(missing_ok=True)
    return list(dict.fromkeys(homes))
