"""Run a producer one step ahead in a thread, so decoding a batch overlaps writing the last one.

Why a thread is enough: DuckDB releases the GIL while it appends and commits, so the Python
decoding of the next batch of samples runs on the other core meanwhile. The database is still
written by the calling thread only (one writer).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def prefetch(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Yield what `items` yields, producing up to `depth` items ahead in a background thread.

    An exception raised by `items` is re-raised here, at the point where its item would have
    been yielded. Closing this generator early stops the producer after its current item.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        ready.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put((_DONE, None))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            ready.put((_DONE, exc))

    worker = threading.Thread(target=produce, name="gradebook-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        # unblock a producer waiting to put, then let it finish its current item
        while worker.is_alive():
            try:
                ready.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()
