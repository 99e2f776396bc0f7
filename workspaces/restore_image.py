"""Which image a captured sandbox is restored into: the task's own, when it ran in one.

A record of gradebook's provider running a task's own image names that image's ID and, when it
was built, its recipe (kept in the workspace store beside the workspace). At restore:

1. the Engine has that image ID: that very image;
2. it does not, and a store holds the recipe: the image rebuilt from the recipe (once per
   recipe and Engine: a tag another process built meanwhile is reused), its new ID said in the
   evidence beside the one recorded;
3. neither: `TaskImageUnavailable`, saying which (the sample is left unscored,
   `sandbox_unavailable`, never graded in another image).

A record with no image ID (gradebook's own image, another provider's sandbox) is restored into
gradebook's sandbox image, as before.
"""

from __future__ import annotations

import threading
from typing import Any

from scorers.sandbox.image_cache import cap_bytes, mark_used, prune
from scorers.sandbox.recipe import RecipeError, parse_recipe
from scorers.sandbox.task_image import (
    RunImage,
    TaskImageUnavailable,
    build_service,
    local_image,
    run_image,
    task_image_tag,
)
from workspaces.record import SandboxRecord
from workspaces.store import ObjectMissing, ObjectUnusable, open_store

__all__ = ["current_image_id", "restore_image"]

_RECIPE_CAP = 64 * 1024 * 1024
_REBUILT: dict[tuple[str, str], RunImage] = {}  # (recipe digest, service) -> its image here
_LOCK = threading.Lock()


def _found(client: Any, ref: str) -> Any | None:
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def _run_as_recorded(image: Any, ref: str, record: SandboxRecord) -> RunImage:
    """The image run as the record says its sandbox ran (user, variables, working dir)."""
    base = run_image(image, ref)
    return RunImage(
        ref=ref,
        image_id=image.id,
        workdir=record.workdir or base.workdir,
        user=record.user or base.user,
        environment=dict(record.environment),
        service=record.service,
    )


def restore_image(client: Any, record: SandboxRecord, stores: list[str]) -> RunImage | None:
    """The task image a sandbox record is restored into (None: gradebook's own image).

    Args:
        client: a `docker.DockerClient` whose Engine answers.
        record: the captured sandbox.
        stores: the workspace stores to read a recipe from, in order.

    Raises:
        TaskImageUnavailable: the image is not on the Engine and cannot be rebuilt (one line
            saying which).
    """
    if not record.image_id:
        return None
    image = _found(client, record.image_id)
    if image is not None:
        mark_used(image.id)
        return _run_as_recorded(image, record.image_id, record)
    short = record.image_id.removeprefix("sha256:")[:12]
    if not record.recipe or not record.recipe_config or not record.service:
        raise TaskImageUnavailable(
            f"image {record.image or short} ({short}) of sandbox {record.name!r} is not on this "
            "Docker Engine and no recipe was recorded to rebuild it: load the image, then "
            "grade again with --retry-unscored"
        )
    key = (record.recipe, record.service)
    with _LOCK:
        rebuilt = _REBUILT.get(key)
        if rebuilt is None or _found(client, rebuilt.ref) is None:
            rebuilt = _REBUILT[key] = _rebuild(client, record, stores, short)
    mark_used(rebuilt.image_id)
    return RunImage(
        ref=rebuilt.ref,
        image_id=rebuilt.image_id,
        workdir=record.workdir or rebuilt.workdir,
        user=record.user or rebuilt.user,
        environment=dict(record.environment),
        service=record.service,
        recipe=rebuilt.recipe,
    )


def current_image_id(client: Any, record: SandboxRecord) -> str | None:
    """The ID of the image `restore_image` would restore this record into now, when the Engine
    has it: the recorded image, else the one built from its recipe (by any process). None when
    neither is here (a restore would rebuild it) or the record ran in gradebook's image.
    Nothing is built."""
    if not record.image_id:
        return None
    image = _found(client, record.image_id)
    if image is None and record.recipe and record.service:
        image = _found(client, task_image_tag(record.recipe, record.service))
    return image.id if image is not None else None


def _rebuild(client: Any, record: SandboxRecord, stores: list[str], short: str) -> RunImage:
    assert record.recipe and record.recipe_config and record.service
    archive = None
    for root in stores:
        try:
            archive = open_store(root).get(record.recipe, _RECIPE_CAP)
            break
        except (ObjectMissing, OSError):
            continue
        except ObjectUnusable as exc:
            raise TaskImageUnavailable(f"recipe of image {short}: {exc}") from None
    if archive is None:
        raise TaskImageUnavailable(
            f"image {short} of sandbox {record.name!r} is not on this Docker Engine, and its "
            f"recipe {record.recipe[:12]} is in none of the stores {', '.join(stores)}: load "
            "the image or mount the store, then grade again with --retry-unscored"
        )
    try:
        recipe = parse_recipe(archive, record.recipe_config)
        service = recipe.service(record.service)
    except RecipeError as exc:
        raise TaskImageUnavailable(f"recipe of image {short}: {exc}") from None
    if service.dockerfile is None:
        raise TaskImageUnavailable(
            f"image {service.image} ({short}) of sandbox {record.name!r} is not on this Docker "
            "Engine and its recipe names it without a build: load it, then grade again"
        )
    # the recipe came with a log (hostile input): its build steps get no network
    tag, built = build_service(client, recipe, service, network=False)
    image = local_image(client, tag, why=f"rebuilt from recipe {recipe.digest[:12]}")
    if built:
        prune(client, cap_bytes(), keep=frozenset({image.id}))
    return run_image(image, tag, service=service, recipe=recipe)
