"""The sandbox image: where its recipe lives, its tag, and how to build it with no registry.

The tag is a hash of every file in the recipe directory (infra/sandbox/), so a changed recipe
builds a new image and an unchanged one is reused. The base is always a debootstrap root
filesystem from the machine's apt mirror, imported with `docker import`: the same recipe gives
the same Debian + python3 whether or not a registry is reachable.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

IMAGE_REPOSITORY = "gradebook-sandbox"
# The repository root when the project is installed editable (the only way it is installed).
# A checkout keeps the recipe in infra/sandbox/; a wheel carries the same files inside the package
# (pyproject's force-include), so an installed gradebook builds the same image.
_CHECKOUT_RECIPE = Path(__file__).resolve().parents[2] / "infra" / "sandbox"
RECIPE_DIR = (
    _CHECKOUT_RECIPE
    if _CHECKOUT_RECIPE.is_dir()
    else Path(__file__).resolve().parent / "_sandbox_recipe"
)
IMAGE_ENV = "GRADEBOOK_SANDBOX_IMAGE"


class ImageBuildError(RuntimeError):
    """The sandbox image could not be built; the message says what to do."""


@dataclass(frozen=True)
class SandboxUsers:
    harness_uid: int
    sandbox_uid: int


def recipe_digest(recipe_dir: Path = RECIPE_DIR) -> str:
    """Hex sha256 over the names and contents of every file in the recipe directory."""
    if not recipe_dir.is_dir():
        raise ImageBuildError(
            f"sandbox recipe directory {recipe_dir} not found: pass --recipe or set {IMAGE_ENV}"
        )
    h = hashlib.sha256()
    for path in sorted(p for p in recipe_dir.rglob("*") if p.is_file()):
        h.update(path.relative_to(recipe_dir).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def image_tag(recipe_dir: Path = RECIPE_DIR) -> str:
    """The image the sandbox runs: `$GRADEBOOK_SANDBOX_IMAGE`, else the recipe's hash tag."""
    override = os.environ.get(IMAGE_ENV)
    if override:
        return override
    return f"{IMAGE_REPOSITORY}:{recipe_digest(recipe_dir)[:16]}"


def sandbox_users(recipe_dir: Path = RECIPE_DIR) -> SandboxUsers:
    """The harness and submission uids the recipe bakes into the image (users.env)."""
    values: dict[str, str] = {}
    env_file = recipe_dir / "users.env"
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.strip().startswith("#"):
                values[key.strip()] = value.strip()
    return SandboxUsers(
        harness_uid=int(values.get("HARNESS_UID", 10001)),
        sandbox_uid=int(values.get("SANDBOX_UID", 10002)),
    )


def build_image(
    recipe_dir: Path = RECIPE_DIR, *, force: bool = False, client: object | None = None
) -> tuple[str, bool]:
    """Build the sandbox image unless an image with the recipe's tag already exists.

    Args:
        recipe_dir: the directory holding build_rootfs.sh and users.env.
        force: rebuild even when the tag exists.
        client: a `docker.DockerClient`; one from the environment when None.

    Returns:
        (tag, built): built is False when an existing image was reused.
    """
    import docker
    import docker.errors

    tag = f"{IMAGE_REPOSITORY}:{recipe_digest(recipe_dir)[:16]}"
    try:
        dc = client or docker.from_env(timeout=600)
        dc.ping()
    except docker.errors.DockerException as exc:
        raise ImageBuildError(
            f"Docker Engine is not reachable ({exc}): run infra/docker/ensure_docker.sh "
            "(or `make services`) first"
        ) from exc

    def have_image() -> bool:
        try:
            dc.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False

    if not force and have_image():
        return tag, False
    # Two checkouts (or two `make services`) building the same tag at once would each run
    # debootstrap and import, and the second import would take the tag from under the first:
    # one builds, the other waits for it and then finds the tag.
    with build_lock(tag):
        if not force and have_image():
            return tag, False
        users = sandbox_users(recipe_dir)
        with tempfile.TemporaryDirectory(prefix="gradebook-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            result = subprocess.run(["bash", str(recipe_dir / "build_rootfs.sh"), str(rootfs)])
            if result.returncode != 0:
                raise ImageBuildError(
                    f"build_rootfs.sh failed (exit {result.returncode}): see its messages above"
                )
            import_rootfs(dc, rootfs, tag, users)
        dc.images.get(tag)  # raises if the import silently produced nothing
    return tag, True


@contextmanager
def build_lock(tag: str) -> Iterator[None]:
    """Hold the machine-wide lock for building sandbox images, gradebook's and tasks' own (a
    file lock in the temp dir, which every user and checkout on the machine shares, as they
    share the Engine)."""
    path = Path(tempfile.gettempdir()) / "gradebook-sandbox-build.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:  # another user's lock file: a read-only descriptor locks as well
        fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"sandbox image {tag}: another process is building it; waiting for it",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def import_rootfs(client: object, rootfs: Path, tag: str, users: SandboxUsers) -> None:
    """`docker import` a root filesystem directory as `tag`, running as the submission uid."""
    with tempfile.TemporaryDirectory(prefix="gradebook-import-") as tmp:
        archive = Path(tmp) / "rootfs.tar"
        # tarfile keeps owners, modes, symlinks and device nodes, which `docker import` needs.
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        repository, _, version = tag.partition(":")
        client.api.import_image(  # type: ignore[attr-defined]
            src=str(archive),
            repository=repository,
            tag=version,
            changes=[
                f"USER {users.sandbox_uid}:{users.sandbox_uid}",
                "WORKDIR /work",
                "ENV PATH=/usr/local/bin:/usr/bin:/bin HOME=/work LANG=C.UTF-8",
                'CMD ["sleep", "infinity"]',
                f"LABEL gradebook.recipe={tag}",
            ],
        )
