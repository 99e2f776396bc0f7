"""A command that waits on something slow says what it waits for, so it never looks hung.

The first command starts the local Prefect server (seconds): on a terminal (a real pty here)
a spinner says so while it waits; in a pipe or a log, one plain line once a wait is long.
"""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_kit import GRADEBOOK, shell_env
from gate_world import run_eval
from rich.console import Console

WAITING = "waiting for the local Prefect server to start"
STARTED = "started a local Prefect server"


class _Screen:
    """Everything a pty's master end receives, read on a thread; `seen` waits for a text."""

    def __init__(self, fd: int) -> None:
        self.fd, self.text, self.changed = fd, "", threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the child closed the pty
                chunk = b""
            with self.changed:
                self.text += chunk.decode(errors="replace")
                self.changed.notify_all()
            if not chunk:
                return

    def seen(self, text: str, timeout: float) -> str | None:
        """The screen so far once `text` is on it, or None after `timeout` seconds."""
        with self.changed:
            if self.changed.wait_for(lambda: text in self.text, timeout):
                return self.text
        return None


@pytest.mark.slow
def test_the_first_command_shows_a_spinner_while_the_server_starts(tmp_path: Path) -> None:
    from flows.runtime.background_server import stop_server

    log = run_eval(tmp_path / "logs", ["0", "1", "2"], metadata={"verifiers": ["math"]})
    home = tmp_path / "prefect-home"  # no server runs here yet: this command starts one
    env = shell_env(
        tmp_path / "client-home",
        GRADEBOOK_PREFECT_HOME=str(home),
        GRADEBOOK_PREFECT_PORT="0",
        TERM="xterm-256color",
        COLUMNS="120",
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [str(GRADEBOOK), "score", str(log), "--db", str(tmp_path / "g.duckdb")],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    os.close(slave)
    screen = _Screen(master)
    try:
        # while it waits, before the server is up, the terminal says what it waits for
        before = screen.seen(WAITING, timeout=300)
        assert before is not None, screen.text[-2000:]
        assert STARTED not in before
        assert proc.wait(timeout=600) == 0, screen.text[-3000:]
        done = screen.seen("scores written", timeout=30)
        assert done is not None and STARTED in done
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
        stop_server(home)


def test_a_wait_in_a_log_is_one_plain_line_and_a_quick_one_nothing(monkeypatch) -> None:
    from flows.runtime import console as console_mod

    out = io.StringIO()
    monkeypatch.setattr(console_mod, "err_console", Console(file=out, width=120))
    monkeypatch.setattr(console_mod, "PLAIN_AFTER_S", 0.05)
    with console_mod.waiting("something quick", after_s=0.05):
        pass
    with console_mod.waiting("workers picking up the runs", after_s=0.05):
        deadline = time.monotonic() + 30
        while "workers" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out.getvalue() == "gradebook: workers picking up the runs\n"
