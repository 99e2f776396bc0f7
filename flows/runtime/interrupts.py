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

Code that stops better by finishing what is in hand than by unwinding (the scoring stage writes
the results graded) runs inside `stop_softly()`: there the first signal only asks (it is noted,
`stop_fd()` becomes readable for a loop that waits on other descriptors, nothing is raised), the
code says what it does with one `say_stopping()` line and stops; a block inside it that cannot
poll (a chunk graded in this process) is `interruptible()`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

from scorers.workers.stop import request_stop, stop_fd, stop_signal

T = TypeVar("T")

__all__ = [
    "during_eval",
    "exit_code",
    "finished_result",
    "interruptible",
    "note_stop",
    "say_stopping",
    "signal_name",
    "stop_fd",
    "stop_on_signals",
    "stop_signal",
    "stop_softly",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_soft: list[bool] = []  # one entry per `stop_softly()` block the main thread is in


def exit_code(signum: int) -> int:
    """The conventional exit status after a signal: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def note_stop(signum: int, *, say: bool = True) -> None:
    """Remember that `signum` asked this process to stop, and say so (one line; `say=False`:
    the caller says what the stop does, `say_stopping`); a second request exits the process
    at once."""
    if not request_stop(signum):
        # the second: exit now, from here (no unwinding, no atexit work that could wait)
        try:
            sys.stderr.write(f"gradebook: {signal_name(signum)} again: exiting now\n")
            sys.stderr.flush()
        finally:
            os._exit(exit_code(signum))
    if say:
        sys.stderr.write(f"gradebook: {signal_name(signum)}: stopping (again to exit at once)\n")
        sys.stderr.flush()


def say_stopping(doing: str) -> None:
    """The one line of a stop that `stop_softly` noted without a word: what the program does
    before it exits ("gradebook: SIGINT: stopping: writing 33,750 graded results (Ctrl-C again
    to exit at once)")."""
    signum = stop_signal()
    if signum is None:
        return
    again = "Ctrl-C again" if signum == signal.SIGINT else "again"
    sys.stderr.write(
        f"gradebook: {signal_name(signum)}: stopping: {doing} ({again} to exit at once)\n"
    )
    sys.stderr.flush()


def _handler(signum: int, frame: FrameType | None) -> None:
    note_stop(signum)
    raise KeyboardInterrupt


def _asking(signum: int, frame: FrameType | None) -> None:
    note_stop(signum, say=False)


def _quiet_handler(signum: int, frame: FrameType | None) -> None:
    note_stop(signum, say=False)
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
def stop_softly() -> Iterator[None]:
    """Inside the block, the first SIGINT or SIGTERM only asks the program to stop: it is
    noted (`stop_signal()`, `stop_fd()`), nothing is raised and nothing is said; the code polls,
    says what it does (`say_stopping`) and stops in order. A second signal exits at once.

    For work that stops better by finishing what is in hand (the scoring stage writes what
    was graded) than by unwinding. Outside the main thread it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stop_fd()  # the pipe exists before a handler may write it
    with _handlers({s: _asking for s in _SIGNALS}):
        _soft.append(True)
        try:
            yield
        finally:
            _soft.pop()


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside `stop_softly()`, a block that cannot poll (it runs a verifier in this process):
    a stop raises KeyboardInterrupt in it, also one noted before the block (raised on entry).
    The stop is not said here either: the code that catches it says what it does. Outside
    `stop_softly()` (or the main thread) the block runs as it is."""
    if not _soft or threading.current_thread() is not threading.main_thread():
        yield
        return
    with _handlers({s: _quiet_handler for s in _SIGNALS}):
        if stop_signal() is not None:
            raise KeyboardInterrupt
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


def finished_result(state: Any, kind: type[T]) -> T:
    """What a flow run that ended in `state` (a Prefect State, from `flow(..., return_state=
    True)`) hands back: its result, also when a stop ended it Cancelled with a result of `kind`
    as its data; any other failure raises as the flow did."""
    if state.is_cancelled():
        data = state.result(raise_on_failure=False)
        if isinstance(data, kind):
            return data
    return state.result()
