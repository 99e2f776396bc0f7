"""Terminal output: one rich console, progress bars, and keeping Prefect's own chatter out of it.

Prefect logs every flow and task run to the console at INFO, and its temporary server prints
start/stop lines and, on shutdown, tracebacks. Users of `gradebook` want the pipeline's
progress and a summary; the flow and task runs stay visible in the Prefect UI when a server is
used, because only the console handlers are silenced, not the API log handler.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = [
    "console",
    "err_console",
    "progress_bar",
    "quiet_prefect",
    "set_verbose",
    "shown",
    "terminal_safe",
    "verbose",
    "waiting",
]

# C0 and C1 controls but newline and tab, DEL, and the bidirectional overrides and isolates
# (text that displays in another order than it reads: "Trojan source").
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """`text` with every character that could steer a terminal shown as an escape (`\\x1b`)."""
    return _UNSAFE.sub(_escape, text)


def shown(text: object) -> str:
    """`text` from outside (a log, a file name, a label, model output) for a rich-markup line:
    its brackets escaped as markup and its control characters as `terminal_safe` shows them."""
    return escape(terminal_safe(str(text)))


console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
# Piped into a file or CI log, rich assumes 80 columns and folds the summary table's cells;
# a log reader has a wide window, so lay tables out as on a wide terminal unless told otherwise.
for _c in (console, err_console):
    if not _c.is_terminal and "COLUMNS" not in os.environ:
        _c.width = 120
_VERBOSE = False
_QUIETED = False

# Must be in the environment before prefect is first imported: its settings are read then.
# Inherited by the processes a command starts, e.g. `gradebook serve`'s flow runs: Prefect's
# console lines stay out of the terminal as in the command itself (a cancelled run's task runs
# each log a crash), while the API handler still ships every line to the UI; -v shows them.
_QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
    "PREFECT_LOGGING_LOG_PRINTS": "false",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",
    # prefect._internal's own handler: its services log every event they fail to send (a
    # server that went away) with the whole event, a page each; the command says it in one line
    "PREFECT_LOGGING_HANDLERS_DEBUG_LEVEL": "CRITICAL",
}


def set_verbose(on: bool) -> None:
    global _VERBOSE
    _VERBOSE = on


def verbose() -> bool:
    return _VERBOSE


def quiet_prefect(verbose: bool = False) -> None:
    """Hide Prefect's console logging (unless `verbose`); call before the first flow run, best
    before Prefect is imported (its logging is configured then, from the environment)."""
    global _QUIETED
    set_verbose(verbose)
    if verbose or _QUIETED:
        return
    _QUIETED = True
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "prefect" in sys.modules:
        # configured already, without these settings: again (it reads a YAML file)
        import prefect.logging.configuration as prefect_logging

        prefect_logging.setup_logging()
    # Silence only the console handlers: the API handler still ships run logs to the UI.
    names = ("prefect", "prefect.flow_runs", "prefect.task_runs", "prefect.server", "")
    for name in (*names, "prefect._internal"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not _is_api_handler(handler):
                handler.setLevel(logging.CRITICAL)
    for name in ("uvicorn", "uvicorn.error", "docket", "httpx"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # Prefect's API log worker writes each batch it cannot send to stderr unless this is off
    logging.raiseExceptions = False


def _is_api_handler(handler: logging.Handler) -> bool:
    return type(handler).__name__ == "APILogHandler"


@contextmanager
def progress_bar(*, transient: bool = False) -> Iterator[Progress]:
    """A rich progress display with a count, a bar, a percentage and the elapsed time."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    ) as progress:
        yield progress


# A log is read later: a plain "waiting" line there is for a wait that could look hung.
PLAIN_AFTER_S = 5.0


class Waiting:
    """What `waiting` yields: `update(text)` changes what the spinner says."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._status: Any = None
        self._lock = threading.Lock()

    def update(self, text: str) -> None:
        with self._lock:
            self.text = text
            if self._status is not None:
                self._status.update(f"gradebook: {text}")


@contextmanager
def waiting(what: str, *, after_s: float = 1.0, plain: bool = True) -> Iterator[Waiting]:
    """Say what the command waits on when the block takes longer than `after_s`, so a slow
    wait (a server starting, workers picking up runs) never looks hung.

    On a terminal: a spinner on stderr, erased when the block ends. Otherwise (a pipe, a CI
    log): one plain line on stderr, when `plain` and the block takes PLAIN_AFTER_S or longer;
    nothing when the block is quick.
    """
    state = Waiting(what)
    terminal = err_console.is_terminal

    def show() -> None:
        with state._lock:
            if done.is_set():
                return
            if terminal:
                state._status = err_console.status(f"gradebook: {state.text}")
                state._status.start()
            elif plain:
                err_console.print(f"gradebook: {state.text}", soft_wrap=True)

    done = threading.Event()
    timer = threading.Timer(after_s if terminal else max(after_s, PLAIN_AFTER_S), show)
    timer.daemon = True
    timer.start()
    try:
        yield state
    finally:
        with state._lock:
            done.set()
            timer.cancel()
            if state._status is not None:
                state._status.stop()
                state._status = None
