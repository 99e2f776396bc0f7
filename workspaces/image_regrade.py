"""Which verdicts of a sandbox scorer to grade again because their task image was rebuilt.

A verdict graded in a task's own image names that image's ID (`scores.image_id`,
warehouse.verdict_images). The image restore would use now is the recorded one when the Engine
has it, else the one built from the recipe (workspaces.restore_image). When the Engine has that
image and its ID differs from the verdict's (the image was rebuilt, or the recorded one came
back), the sample is graded again, as attempt n + 1 under the same fingerprint: a changed image
re-grades as a changed verifier does.

When the Engine has neither image, the verdict stands: checking costs no build, and "nothing to
score" stays a few lookups (one per distinct image). Logs from elsewhere (no workspace record)
are not checked: their image is built from task files found at scoring time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from warehouse.verdict_images import restored_images
from workspaces.record import WorkspaceRecord
from workspaces.restore_image import current_image_id

if TYPE_CHECKING:
    from scorers.registry import Verifier
    from warehouse import Warehouse

__all__ = ["rebuilt_image_samples"]


def rebuilt_image_samples(
    wh: Warehouse, verifier: Verifier, digest: str, run_ids: Sequence[str] | None = None
) -> list[tuple[str, str, int]]:
    """The (run_id, sample_id, epoch) keys whose current verdict by `verifier` under `digest`
    was graded in a task image other than the one the Engine would restore them into now
    (`Warehouse.samples_to_score(regrade=...)` grades them again).

    Empty for a verifier that restores no sandbox (no query), when no verdict names a task
    image (no Engine call), or when the Engine does not answer (a restore would leave them
    unscored: the verdicts stand).
    """
    if not verifier.params.get("sandbox"):
        return []
    rows = wh.image_verdicts(verifier.name, digest, run_ids)
    if not rows:
        return []
    client = _client()
    if client is None:
        return []
    now: dict[tuple[str, str | None, str | None], str | None] = {}
    stale = []
    for run_id, sample_id, epoch, metadata, record_json in rows:
        record = _record(record_json)
        if record is None:
            continue
        for name, used in restored_images(metadata).items():
            box = record.named(name)
            if box is None or not box.image_id:
                continue
            key = (box.image_id, box.recipe, box.service)
            if key not in now:
                now[key] = current_image_id(client, box)
            if now[key] is not None and now[key] != used:
                stale.append((run_id, sample_id, epoch))
                break
    return stale


def _record(text: str | None) -> WorkspaceRecord | None:
    if not text:
        return None
    try:
        return WorkspaceRecord.model_validate_json(text)
    except ValueError:  # a damaged record: its restore says so, row by row
        return None


def _client() -> Any | None:
    import docker
    import docker.errors

    try:
        # only image lookups: an Engine that does not answer them in seconds grades nothing
        client = docker.from_env(timeout=10)
        client.ping()
    except docker.errors.DockerException:
        return None
    return client
