"""Run the real `gradebook` CLI in this process and SIGKILL it at a chosen point (test material).

    python tests/killpoint.py WHERE REPORT gradebook-args...

WHERE is `write:N:before` (inside the Nth `Warehouse.write` transaction, every statement run,
not committed), `write:N:after` (that transaction committed, its connection not yet closed, so
the commit is only in DuckDB's WAL) or `call:MODULE:NAME:N` (on entering the Nth call of that
function), or `none`. Just before dying the process writes its descendants' pids to REPORT
(JSON), so the test can check that none of them outlives it. Nothing is mocked: the process is
the CLI, the kill is a real SIGKILL.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _die(report: str) -> None:
    import psutil

    children = [p.pid for p in psutil.Process().children(recursive=True)]
    Path(report).write_text(json.dumps({"pid": os.getpid(), "children": children}))
    os.kill(os.getpid(), signal.SIGKILL)


class _Connection:
    """A DuckDB connection whose close() can be made to kill the process (commit done, no
    checkpoint yet: what is committed lives in the WAL only)."""

    armed: str | None = None

    def __init__(self, con: Any) -> None:
        self._con = con

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    def close(self) -> None:
        if _Connection.armed:
            _die(_Connection.armed)
        self._con.close()


def _arm_writes(n: int, when: str, report: str) -> None:
    import warehouse.store as store

    real_connect = store.connect
    store.connect = lambda *a, **k: _Connection(real_connect(*a, **k))
    real_write = store.Warehouse.write
    count = [0]

    @contextmanager
    def write(self: Any):
        count[0] += 1
        mine = count[0] == n
        with real_write(self) as con:
            yield con
            if mine and when == "before":
                _die(report)
            if mine and when == "after":
                _Connection.armed = report  # the real write commits, then closes: die there
        # (unreachable for the armed write)

    store.Warehouse.write = write  # type: ignore[method-assign]


def _arm_call(module: str, name: str, n: int, report: str) -> None:
    mod = importlib.import_module(module)
    owner, attr = mod, name
    if "." in name:
        cls, attr = name.split(".", 1)
        owner = getattr(mod, cls)
    real = getattr(owner, attr)
    count = [0]

    @wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] == n:
            _die(report)
        return real(*args, **kwargs)

    setattr(owner, attr, wrapper)


def main() -> None:
    where, report, *args = sys.argv[1:]
    sys.path.insert(0, str(ROOT))
    kind, _, rest = where.partition(":")
    if kind == "write":
        n, when = rest.split(":")
        _arm_writes(int(n), when, report)
    elif kind == "call":
        module, name, n = rest.split(":")
        _arm_call(module, name, int(n), report)
    import flows.score_writes
    import warehouse.eval_archive

    # small batches, so that small logs give several write transactions to be killed in: every
    # graded chunk is written as it arrives (not paced to a second, and not gathered with the
    # chunks that came back during the write before it), 500 samples per ingest batch
    flows.score_writes.BATCH_INTERVAL_S = 0.0
    flows.score_writes.WRITE_PACE = 0.0
    flows.score_writes.BATCH_MAX_ROWS = 1
    warehouse.eval_archive.DIRECT_BATCH = 500
    from flows.cli import main as cli

    sys.argv = ["gradebook", *args]
    cli()


if __name__ == "__main__":
    main()
