"""The task images gradebook built, bounded: least recently used removed first, past a disk cap.

SWE-style tasks bring one image per sample, so a sweep can fill the Engine's disk. Every use of
a task image (a sample started in it, a workspace restored into it) touches a mark in the cache
directory (`<cache>/task-images/<image id>`: its mtime is the last use, written without a lock);
`prune` lists the images this user built on this host (gradebook's labels:
scorers.sandbox.task_image), and removes the least recently used (never used here: oldest
first) until the rest fit the cap.

It never removes an image it did not build (no label, another user's or host's), and never
forces: an image a container still uses (another checkout's sample, another test) is kept,
and counted. Sizes are the Engine's per image: layers two images share count in both, so the
cap is on the most the images could take, never less.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scorers.identity.cache import cache_dir
from scorers.sandbox.task_image import BUILT_BY_LABEL, RECIPE_LABEL, built_by

__all__ = ["CAP_ENV", "Pruned", "cap_bytes", "mark_used", "prune"]

CAP_ENV = "GRADEBOOK_TASK_IMAGES_MAX_GB"  # `[workspaces] task_images_max_gb` of a sweep config
DEFAULT_CAP_GB = 50.0


def cap_bytes() -> int:
    """The disk cap on this user's task images (`GRADEBOOK_TASK_IMAGES_MAX_GB`, default 50)."""
    try:
        gb = float(os.environ.get(CAP_ENV) or DEFAULT_CAP_GB)
    except ValueError:
        gb = DEFAULT_CAP_GB
    return int(gb * 1024**3)


def _marks() -> Path:
    return cache_dir() / "task-images"


def mark_used(image_id: str) -> None:
    """Record that a task image was used now (best effort: a cache, never an error)."""
    try:
        path = _marks() / image_id.removeprefix("sha256:")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path)
    except OSError:
        pass


def _last_use(image: dict[str, Any]) -> float:
    try:
        return (_marks() / str(image["Id"]).removeprefix("sha256:")).stat().st_mtime
    except OSError:
        return float(image.get("Created") or 0)


@dataclass(frozen=True)
class Pruned:
    """What `prune` did: the images removed, those kept because a container uses them, and
    the bytes this user's task images take now."""

    removed: list[str]
    in_use: list[str]
    bytes_left: int


def prune(client: Any, max_bytes: int, *, keep: frozenset[str] = frozenset()) -> Pruned:
    """Remove this user's least recently used task images until they take at most `max_bytes`.

    Args:
        client: a `docker.DockerClient`.
        max_bytes: the disk cap on this user's task images.
        keep: image IDs never removed (the ones the caller is about to use).
    """
    import docker.errors

    mine = built_by()
    images = [
        i
        for i in client.api.images(filters={"label": [RECIPE_LABEL, f"{BUILT_BY_LABEL}={mine}"]})
        if (i.get("Labels") or {}).get(BUILT_BY_LABEL) == mine
    ]
    total = sum(int(i.get("Size") or 0) for i in images)
    removed, in_use = [], []
    for image in sorted(images, key=_last_use):
        if total <= max_bytes:
            break
        if image["Id"] in keep:
            continue
        try:
            # every tag: removing by ID with several tags needs force, which is never used
            for tag in image.get("RepoTags") or [image["Id"]]:
                client.api.remove_image(tag, force=False, noprune=False)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError:  # 409: a container uses it; it stays
            in_use.append(image["Id"])
            continue
        total -= int(image.get("Size") or 0)
        removed.append(image["Id"])
        (_marks() / str(image["Id"]).removeprefix("sha256:")).unlink(missing_ok=True)
    return Pruned(removed, in_use, max(total, 0))
