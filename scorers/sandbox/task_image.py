"""A task's own images: built from its recipe on this Engine (no registry), found again by the
recipe's digest, and described for the containers that run them.

Each service with a `build` becomes `gradebook-task:<recipe digest[:16]>-<service>`, built with
the Docker SDK from the recipe archive itself (scorers.sandbox.recipe): the image is what the
archive says, whether it is built at generation or rebuilt at scoring from the copy in a
workspace store. A tag already on the Engine is reused; a missing one is built once, under the
machine-wide build lock (another process building the same recipe is waited for). Every image
built carries gradebook's labels: the recipe, the service, and who built it (the image cache
removes only those: scorers.sandbox.image_cache).

A service that names an `image` without a build, and a `GradebookSandboxConfig(image=...)`,
must be on the Engine: nothing is pulled.
"""

from __future__ import annotations

import getpass
import io
import re
import socket
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scorers.sandbox.image import build_lock
from scorers.sandbox.recipe import Recipe, Service, unpack_recipe

__all__ = [
    "BUILT_BY_LABEL",
    "RECIPE_LABEL",
    "TASK_IMAGE_REPOSITORY",
    "RunImage",
    "TaskImageUnavailable",
    "build_service",
    "local_image",
    "recipe_images",
    "task_image_tag",
    "workdir_files",
    "workdir_owner",
]

TASK_IMAGE_REPOSITORY = "gradebook-task"
RECIPE_LABEL = "gradebook.task-recipe"  # the recipe's sha256, on every image gradebook builds
SERVICE_LABEL = "gradebook.task-service"
BUILT_BY_LABEL = "gradebook.built-by"  # user@host that built it (the cache removes only its own)


class TaskImageUnavailable(RuntimeError):
    """A task's image is not on this Engine and could not be built; the message says which."""


@dataclass(frozen=True)
class RunImage:
    """An image a sandbox runs, and how its service runs it.

    Attributes:
        ref: what containers are created from (a tag or an image ID).
        image_id: the Engine's ID of it (`sha256:...`).
        workdir: the working directory (the service's, else the image's, else /work).
        user: who commands run as (the service's, else the image's, else root).
        environment: the service's variables.
        service: the recipe's service name (None: not from a recipe).
        recipe: the recipe it was built from (None: an image named, not built).
        mem_limit_mb, cpus: the service's own caps, when lower ones were asked for.
    """

    ref: str
    image_id: str
    workdir: str
    user: str
    environment: dict[str, str] = field(default_factory=dict)
    service: str | None = None
    recipe: Recipe | None = None
    mem_limit_mb: int | None = None
    cpus: float | None = None


def task_image_tag(digest: str, service: str) -> str:
    """The tag of a recipe's service image (a name the tag grammar accepts)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", service)[:40]
    return f"{TASK_IMAGE_REPOSITORY}:{digest[:16]}-{safe}"


def built_by() -> str:
    """Who builds this process's images: user@host (the image cache's notion of "ours")."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        import os

        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _find(client: Any, ref: str) -> Any | None:
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def local_image(client: Any, ref: str, *, why: str) -> Any:
    """An image on this Engine by tag or ID.

    Raises:
        TaskImageUnavailable: it is not there (`why` says who named it).
    """
    found = _find(client, ref)
    if found is None:
        raise TaskImageUnavailable(
            f"image {ref} ({why}) is not on this Docker Engine and nothing is pulled: "
            "build or `docker load` it first"
        )
    return found


def build_service(
    client: Any, recipe: Recipe, service: Service, *, network: bool = True
) -> tuple[str, bool]:
    """The image of a recipe's service with a `build`, built unless its tag is on the Engine.

    Args:
        client: a `docker.DockerClient`.
        recipe: the recipe.
        service: one of its services with a `build`.
        network: whether the build's RUN steps may reach the network (False for a rebuild
            from a stored recipe, which came with a log: its steps get none).

    Returns:
        (the tag, whether this call built it).

    Raises:
        TaskImageUnavailable: the build failed (its last error line says why).
    """
    tag = task_image_tag(recipe.digest, service.name)
    if _find(client, tag) is not None:
        return tag, False
    with build_lock(tag):
        if _find(client, tag) is not None:
            return tag, False
        with tempfile.TemporaryDirectory(prefix="gradebook-recipe-") as tmp:
            unpack_recipe(recipe.archive, Path(tmp))
            context = Path(tmp) / service.context
            _build(client, context, service, tag, recipe.digest, network)
    return tag, True


def _build(
    client: Any, context: Path, service: Service, tag: str, digest: str, network: bool
) -> None:
    import docker.errors

    log = io.StringIO()
    error = None
    try:
        # the classic builder, as docker-py drives it: `.dockerignore` is honoured
        for chunk in client.api.build(
            path=str(context),
            dockerfile=service.dockerfile,
            tag=tag,
            labels={RECIPE_LABEL: digest, SERVICE_LABEL: service.name, BUILT_BY_LABEL: built_by()},
            buildargs=service.build_args or None,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode=None if network else "none",
            decode=True,
        ):
            log.write(str(chunk.get("stream", "")))
            if "error" in chunk:
                error = str(chunk["error"])
    except docker.errors.DockerException as exc:
        error = str(exc)
    if error is None and _find(client, tag) is None:
        error = "the build ended without an image"
    if error is not None:
        last = " ".join(error.split())[-300:]
        raise TaskImageUnavailable(
            f"building service {service.name!r} of recipe {digest[:12]} failed: {last}"
        )


def recipe_images(client: Any, recipe: Recipe) -> dict[str, RunImage]:
    """Every service's image (built where needed) and how it runs, by service name.

    Raises:
        TaskImageUnavailable: a build failed, or an `image` it names is not on the Engine.
    """
    out = {}
    for service in recipe.services:
        if service.dockerfile is not None:
            ref, _ = build_service(client, recipe, service)
            why = f"built from recipe {recipe.digest[:12]}"
        else:
            assert service.image is not None
            ref, why = service.image, f"named by services.{service.name} of {recipe.config}"
        image = local_image(client, ref, why=why)
        out[service.name] = run_image(image, ref, service=service, recipe=recipe)
    return out


_WORKDIR_FILES: dict[tuple[str, str], bytes] = {}


def workdir_files(client: Any, image_id: str, path: str, cap: int) -> bytes:
    """The image's own files at `path` (its working directory) as a tar whose members lie
    under `path`'s last component; b"" when the image has nothing there. Read once per image
    and path from a created, never started, container (the sandbox's own working directory is
    a tmpfs, which hides them).

    Raises:
        TaskImageUnavailable: they exceed `cap` bytes (the sandbox's work space).
    """
    import docker.errors

    from scorers.sandbox.pool import _PID_NAMESPACE, LABEL, OWNER_LABEL, PIDNS_LABEL, owner_label

    key = (image_id, path)
    if key in _WORKDIR_FILES:
        return _WORKDIR_FILES[key]
    api = client.api
    labels = {LABEL: "1", OWNER_LABEL: owner_label(), PIDNS_LABEL: _PID_NAMESPACE}
    created = api.create_container(
        image_id, None, entrypoint=["true"], network_disabled=True, labels=labels
    )["Id"]
    data = bytearray()
    try:
        try:
            stream, _ = api.get_archive(created, path)
        except docker.errors.NotFound:
            stream = []
        for chunk in stream:
            data += chunk
            if len(data) > cap:
                raise TaskImageUnavailable(
                    f"image {image_id.removeprefix('sha256:')[:12]}: its files at {path} exceed "
                    f"the sandbox's work space of {cap // 2**20} MiB"
                )
    finally:
        try:
            api.remove_container(created, force=True)
        except docker.errors.APIError:  # removed already (a reaper): nothing left
            pass
    _WORKDIR_FILES[key] = bytes(data)
    return _WORKDIR_FILES[key]


def workdir_owner(files: bytes) -> tuple[int, int] | None:
    """(uid, gid) of the working directory itself in a `workdir_files` tar (None: empty)."""
    if not files:
        return None
    with tarfile.open(fileobj=io.BytesIO(files), mode="r:") as tar:
        first = tar.next()
    if first is None or not first.isdir() or "/" in first.name.strip("/"):
        return None
    return first.uid, first.gid


def run_image(
    image: Any, ref: str, *, service: Service | None = None, recipe: Recipe | None = None
) -> RunImage:
    """How a service (or, with none, the image alone) runs an image the Engine holds."""
    config = image.attrs.get("Config") or {}
    image_workdir = config.get("WorkingDir") or ""
    workdir = (service and service.working_dir) or (
        image_workdir if image_workdir not in ("", "/") else "/work"
    )
    user = (service and service.user) or config.get("User") or "0"
    return RunImage(
        ref=ref,
        image_id=image.id,
        workdir=workdir,
        user=user,
        environment=dict(service.environment) if service else {},
        service=service.name if service else None,
        recipe=recipe,
        mem_limit_mb=service.mem_limit_mb if service else None,
        cpus=service.cpus if service else None,
    )
