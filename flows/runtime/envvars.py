"""Environment variables set for the length of a block, then put back as they were."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["environ_set"]


@contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` in `os.environ` inside the block; on exit, even by an exception, restore them.

    A variable that was unset before is unset again (not left as ""), so a caller's own
    settings, e.g. a `LOCAL_BASE_URL` pointing at their model server, survive the block.
    Only the keys in `values` are restored: other changes made inside the block stay.
    """
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
