"""The process-wide stop request that the grading pool's loops poll.

A command's signal handlers (flows.runtime.interrupts) note the first SIGINT or SIGTERM here;
the pool reads it (`stop_signal()`), and a loop that waits on other descriptors waits on
`stop_fd()` too, to see a stop at once. Here, below the flows, because the pool is the engine
the flows drive and knows nothing of how a command handles its signals.
"""

from __future__ import annotations

import os

__all__ = ["request_stop", "stop_fd", "stop_signal"]

_first: list[int] = []  # the signal that asked this process to stop, once one did
_wake: list[int] = []  # a pipe (read end, write end), written once a stop is noted


def stop_signal() -> int | None:
    """The signal that asked this process to stop (None: none did)."""
    return _first[0] if _first else None


def request_stop(signum: int) -> bool:
    """Note that `signum` asked this process to stop; False (nothing noted) when a stop was
    noted already."""
    if _first:
        return False
    _first.append(signum)
    if _wake:
        try:
            os.write(_wake[1], b"!")
        except OSError:  # full (it is never read) or closed: readable all the same
            pass
    return True


def stop_fd() -> int:
    """A file descriptor that is readable once a stop has been noted (and stays so)."""
    if not _wake:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # a signal handler never blocks on it
        _wake.extend((read_end, write_end))
        if _first:
            os.write(write_end, b"!")
    return _wake[0]
