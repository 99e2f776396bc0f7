"""The task image a sandbox scorer's verdict was graded in, as the score row's `image_id`.

A sandbox scorer restores each sample's workspace into the image the agent ran in
(workspaces.restore), and says which in the verdict's metadata:
`sandbox.restored.<name>.image_id`. That image is not in the verifier's fingerprint (it is
the sample's, not the verifier's), so the row carries it in a column of its own: the write
path lets a later attempt supersede a *scored* row only when the image changed
(warehouse.score_attempts), and `current_scores` checks only rows with an image (or unscored
ones) against the superseded set, which costs the rest of the table a null test.

The value is the image ID when one sandbox ran in a task image, else `name=ID` pairs sorted by
name and joined by commas; NULL for every other row (gradebook's own image, no sandbox).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["image_id_of", "image_ids", "restored_images"]

# a verdict restored into a task image names it under this key; rows without the text are
# never parsed (a 200,000-row math batch costs one substring scan)
_MARK = '"image_id"'


def restored_images(metadata: Any) -> dict[str, str]:
    """Sandbox name -> the task image ID its verdict was graded in (empty: none), from a score
    row's metadata (a JSON string or a dict; anything else, or malformed, is none)."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return {}
    sandbox = metadata.get("sandbox") if isinstance(metadata, dict) else None
    restored = sandbox.get("restored") if isinstance(sandbox, dict) else None
    if not isinstance(restored, dict):
        return {}
    return {
        str(name): r["image_id"]
        for name, r in restored.items()
        if isinstance(r, dict) and isinstance(r.get("image_id"), str) and r["image_id"]
    }


def image_id_of(images: dict[str, str]) -> str | None:
    """The `image_id` column's value for these sandboxes' images (None: no task image)."""
    if not images:
        return None
    if len(images) == 1:
        return next(iter(images.values()))
    return ",".join(f"{name}={images[name]}" for name in sorted(images))


def image_ids(metadata: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The `image_id` column for score rows with this `metadata` column (strings)."""
    n = len(metadata)
    marked = pc.fill_null(pc.match_substring(metadata, _MARK), False)
    if n == 0 or not pc.any(marked).as_py():
        return pa.nulls(n, pa.string())
    values: list[str | None] = [None] * n
    for i in pc.indices_nonzero(marked).to_pylist():
        values[i] = image_id_of(restored_images(metadata[i].as_py()))
    return pa.array(values, pa.string())
