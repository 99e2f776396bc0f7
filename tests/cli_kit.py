"""Running the real `gradebook` console script in a subprocess, as a user's shell would.

`CliRunner` runs a command inside the test process: it cannot show what reaches a user's
terminal (tracebacks printed at exit, stderr line counts, exit codes from `main()`), nor whether
a printed command runs from a shell where `gradebook` is not on the PATH (after `make demo`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GRADEBOOK = Path(sys.executable).parent / "gradebook"
VENV_BIN = str(GRADEBOOK.parent)


def shell_env(home: Path, *, api_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a fresh shell: the venv NOT on the PATH, its own PREFECT_HOME (so a
    test can tell whether a Prefect server was started), and PREFECT_API_URL only if given: a
    test whose commands run flows passes the session's server, or each of them would start a
    detached local server of its own that outlives the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != VENV_BIN
    )
    env["PREFECT_HOME"] = str(home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env.pop("GRADEBOOK_DB", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    if "PYTHONPATH" in extra and os.environ.get("PYTHONPATH"):
        extra = {**extra, "PYTHONPATH": extra["PYTHONPATH"] + os.pathsep + os.environ["PYTHONPATH"]}
    env.update(extra)
    return env


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> Ran:
    """Run `argv` (its first item the program) and return what a terminal would have shown."""
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=timeout, check=False)
    # decoded by hand: text=True would turn every "\r" into "\n" (universal newlines)
    return Ran(
        proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    )


def gradebook(*args: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> Ran:
    """`gradebook ARGS` started by its path, as `make demo` starts it."""
    return run([str(GRADEBOOK), *args], env, cwd, timeout)


def file_state(path: Path) -> tuple[str, int, int] | None:
    """(sha256, size, mtime_ns) of a file, None when it does not exist: equal before and after
    means the command left it untouched."""
    if not path.exists():
        return None
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns
