"""SIGINT and SIGTERM stop a command: the first asks it to stop, a second ends it at once.

Python turns Ctrl-C into KeyboardInterrupt, but SIGTERM (what `timeout`, systemd and CI send)
kills a process without any cleanup, and inside a Prefect flow run Prefect's handler turns it into
an exception that Inspect takes for a sample error: a sweep sent SIGTERM ran on for minutes.
While `stop_on_signals()` is active (main thread only), either signal acts like the first
Ctrl-C: it is remembered (`stop_signal()`) and KeyboardInterrupt is raised where the program is,
so what is in flight unwinds as it does on Ctrl-C -- Inspect writes its log as cancelled, the
grading pool closes its workers, an open warehouse transaction rolls back. Code that can finish
in order (a sweep ingests what was generated) checks `stop_signal()`. A second signal exits the
process at once with 128 + its number: nothing waits, and what was committed stays committed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = [
    "during_eval",
    "exit_code",
    "note_stop",
    "signal_name",
    "stop_on_signals",
    "stop_signal",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_first: list[int] = []  # the signal that asked this process to stop, once one did


def stop_signal() -> int | None:
    """The signal that asked this process to stop (None: none did)."""
    return _first[0] if _first else None


def exit_code(signum: int) -> int:
    """The conventional exit status after a signal: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def note_stop(signum: int) -> None:
    """Remember that `signum` asked this process to stop, and say so (one line); a second
    request exits the process at once."""
    if _first:
        # the second: exit now, from here (no unwinding, no atexit work that could wait)
        try:
            sys.stderr.write(f"gradebook: {signal_name(signum)} again: exiting now\n")
            sys.stderr.flush()
        finally:
            os._exit(exit_code(signum))
    _first.append(signum)
    sys.stderr.write(f"gradebook: {signal_name(signum)}: stopping (again to exit at once)\n")
    sys.stderr.flush()


def _handler(signum: int, frame: FrameType | None) -> None:
    note_stop(signum)
    raise KeyboardInterrupt


def _term_during_eval(signum: int, frame: FrameType | None) -> None:
    note_stop(signum)
    signal.raise_signal(signal.SIGINT)  # what asyncio turns into a clean cancel of the eval


@contextmanager
def _handlers(handlers: dict[int, Callable[[int, FrameType | None], object]]) -> Iterator[None]:
    """These signal handlers inside the block, the previous ones back after it (in the main
    thread only: elsewhere Python refuses signal handlers, and the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in handlers}
    for s, handler in handlers.items():
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:
                signal.signal(s, handler)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM stop the program as the module doc says.

    Nests: an inner block (e.g. inside a Prefect flow run, whose engine installs its own SIGTERM
    handler) puts its caller's handlers back on exit. Outside the main thread it does nothing.
    """
    with _handlers({s: _handler for s in _SIGNALS}):
        yield


@contextmanager
def during_eval() -> Iterator[None]:
    """Around an Inspect `eval()` inside `stop_on_signals()`: let asyncio stop it.

    An eval is an asyncio run, and asyncio handles Ctrl-C itself when it finds Python's default
    handler: the first SIGINT cancels the eval cleanly, Inspect writes its log as `cancelled`
    and `eval()` returns without it (a KeyboardInterrupt raised into the running event loop
    instead can leave it hanging). So SIGINT gets the default handler here, and SIGTERM is
    noted, then turned into a SIGINT. The caller notes a SIGINT stop from what `eval()`
    returned; a second Ctrl-C while Inspect finishes its cancelled log raises KeyboardInterrupt.
    """
    with _handlers({signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _term_during_eval}):
        yield
