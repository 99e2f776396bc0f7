"""gradebook commands as messages print them, so that they run as printed.

A fix-it line ("re-score it with `gradebook rescore ...`") is only useful if pasting it works:
its options must exist, its arguments must be shell-quoted, and `gradebook` itself must be
found. After `make demo` the console script is `.venv/bin/gradebook`, not on the PATH, so a
message names the program the way this process was started when bare `gradebook` would not
find it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["command", "program"]

NAME = "gradebook"


def program() -> str:
    """How the user's shell runs gradebook: `gradebook` when that finds the running program (or
    this process is not the CLI), else the path the CLI was started by, as typed
    (`.venv/bin/gradebook`)."""
    argv0 = sys.argv[0] if sys.argv else ""
    on_path = shutil.which(NAME)
    if Path(argv0).name != NAME or os.sep not in argv0:
        if on_path or Path(argv0).name == NAME:
            return NAME
        # not the CLI (a test, a Prefect worker): the console script beside this interpreter
        beside = Path(sys.executable).parent / NAME
        return shlex.quote(str(beside)) if beside.is_file() else NAME
    if on_path and _same_file(on_path, argv0):
        return NAME
    return shlex.quote(argv0)


def command(*args: str | os.PathLike[str]) -> str:
    """`gradebook ARGS...` as one shell line: the program as `program()` spells it, each argument
    quoted for a POSIX shell (paths with spaces, SQL with quotes)."""
    return " ".join([program(), *(shlex.quote(os.fspath(a)) for a in args)])


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
