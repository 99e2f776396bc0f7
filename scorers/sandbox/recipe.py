"""A task's own image recipe: a compose file or a Dockerfile, read into what gradebook's sandbox
can honour, and kept as one content-addressed archive.

`read_recipe(path)` reads `sandbox=("gradebook", "compose.yaml")` or `("gradebook",
"Dockerfile")` (a path relative to the task's directory, as Inspect resolves it) and packs the
recipe: the config file and every build context under its directory, as a canonical tar (sorted,
owners and times fixed, regular files, directories and links only), whose sha256 is the
recipe's identity. The same bytes are what the image is built from (scorers.sandbox.task_image),
what the workspace store keeps beside a captured workspace, and what a rebuild reads back.

A compose file is checked against gradebook's lockdown (no network, capabilities dropped, a
writable workspace): `build` (context, dockerfile, args), `image`, `working_dir`,
`environment`, `user` are honoured; `network_mode: none`, `init`, `command`, `mem_limit`, `cpus`
and `x-*` keys are accepted (the lockdown already does what they ask, or caps lower); anything
else is refused in one line naming the key (`ports`, `volumes`, `privileged`, `networks`, ...).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "COMPOSE_NAMES",
    "Recipe",
    "RecipeError",
    "Service",
    "is_recipe_file",
    "parse_recipe",
    "read_recipe",
    "unpack_recipe",
]

COMPOSE_NAMES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")
MAX_RECIPE_BYTES = 64 * 1024 * 1024
_SKIP_DIRS = frozenset({"__pycache__", ".git"})  # never part of an image's recipe

# what a service may say, and why each accepted key needs nothing from gradebook
_HONOURED = frozenset({"build", "image", "working_dir", "environment", "user"})
_NO_OPS = frozenset({"init", "command", "network_mode", "mem_limit", "cpus", "depends_on"})
_REFUSED = {
    "ports": "published ports cannot be honoured: the sandbox has no network",
    "expose": "exposed ports cannot be honoured: the sandbox has no network",
    "volumes": "host volumes cannot be honoured: only the workspace is writable",
    "privileged": "privileged containers cannot be honoured: every capability is dropped",
    "cap_add": "added capabilities cannot be honoured: every capability is dropped",
    "networks": "networks between services cannot be honoured: each sandbox has no network",
    "network_mode": "only `network_mode: none` can be honoured: the sandbox has no network",
}
_TOP_LEVEL = frozenset({"services", "version", "name"})
_BUILD_KEYS = frozenset({"context", "dockerfile", "args"})


class RecipeError(ValueError):
    """A recipe gradebook cannot honour or read; the message is one line naming the key."""


@dataclass(frozen=True)
class Service:
    """One service of a recipe: one named sandbox.

    Attributes:
        name: the service's name (`sandbox("name")`; "default" for a Dockerfile's only one).
        context: the build context, relative to the recipe's root ("" when `image` only).
        dockerfile: the Dockerfile, relative to the context (None when `image` only).
        image: the image a service names without a build (must be on the Engine).
        working_dir: the sandbox's working directory (None: the image's own, else /work).
        environment: variables every command in it sees.
        user: who commands run as (None: the image's own user).
        build_args: the build's `args`.
        mem_limit_mb: a memory cap lower than gradebook's, when the file asks for one.
        cpus: a CPU cap lower than gradebook's, when the file asks for one.
    """

    name: str
    context: str = ""
    dockerfile: str | None = None
    image: str | None = None
    working_dir: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    mem_limit_mb: int | None = None
    cpus: float | None = None


@dataclass(frozen=True)
class Recipe:
    """A task's image recipe: its services, the archive they are built from, and its digest.

    Attributes:
        config: the config file's name inside the archive (at its root).
        services: by name, the default first.
        archive: the canonical tar of the config file and the build contexts.
        digest: the archive's sha256 (the recipe's identity; its address in a workspace store).
    """

    config: str
    services: tuple[Service, ...]
    archive: bytes
    digest: str

    def service(self, name: str) -> Service:
        found = next((s for s in self.services if s.name == name), None)
        if found is None:
            raise RecipeError(f"recipe {self.config}: no service {name!r}")
        return found


def is_recipe_file(config: Any) -> bool:
    """Whether a sandbox config names a compose file or a Dockerfile."""
    if not isinstance(config, str):
        return False
    name = PurePosixPath(config).name
    return (
        name in COMPOSE_NAMES
        or name.endswith(("-compose.yaml", ".compose.yaml"))
        or _is_dockerfile(name)
    )


def _is_dockerfile(name: str) -> bool:
    return name == "Dockerfile" or name.startswith("Dockerfile.") or name.endswith(".Dockerfile")


def read_recipe(path: str | Path) -> Recipe:
    """The recipe a config file names, packed from its directory.

    Raises:
        RecipeError: the file is missing, unreadable, refused, or its contexts are too big.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise RecipeError(f"sandbox config {path} not found: give a compose file or Dockerfile")
    root = path.parent
    services = _services(path.name, path.read_bytes(), where=str(path))
    members = {path.name}
    for service in services:
        if service.dockerfile is not None:
            members.add(service.context or ".")
    archive = _pack(root, sorted(members))
    return Recipe(path.name, services, archive, hashlib.sha256(archive).hexdigest())


def parse_recipe(archive: bytes, config: str) -> Recipe:
    """A recipe from its archive (read back from a store: checked again, never trusted)."""
    data = _member(archive, config)
    services = _services(config, data, where=f"recipe {config}")
    return Recipe(config, services, archive, hashlib.sha256(archive).hexdigest())


def unpack_recipe(archive: bytes, into: Path) -> None:
    """Extract a recipe archive (Python's `data` filter: nothing outside `into`, no devices)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        tar.extractall(into, filter="data")


def _member(archive: bytes, name: str) -> bytes:
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            member = tar.extractfile(name)
            if member is None:
                raise KeyError(name)
            return member.read(MAX_RECIPE_BYTES)
    except (KeyError, tarfile.TarError) as exc:
        raise RecipeError(f"recipe archive has no readable {name!r} ({exc})") from None


def _services(name: str, data: bytes, *, where: str) -> tuple[Service, ...]:
    if _is_dockerfile(name):
        return (Service(name="default", context=".", dockerfile=name),)
    import yaml

    try:
        doc = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        why = " ".join(str(exc).split())[:200]
        raise RecipeError(f"{where}: not a YAML compose file ({why})") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("services"), dict)
        or not doc["services"]
    ):
        raise RecipeError(f"{where}: a compose file needs a `services` mapping")
    for key in doc:
        if key in ("volumes", "networks", "secrets", "configs") and doc[key]:
            raise RecipeError(f"{where}: {key}: {_REFUSED.get(key, 'cannot be honoured')}")
        if key not in _TOP_LEVEL and not str(key).startswith("x-") and doc[key]:
            raise RecipeError(f"{where}: {key}: not supported by gradebook's sandbox")
    services = [_service(str(n), body, where) for n, body in doc["services"].items()]
    # Inspect's rule: the service marked `x-default`, else one named "default", else the first
    bodies = list(doc["services"].values())
    marked = [s for s, b in zip(services, bodies, strict=True) if (b or {}).get("x-default")]
    first = marked[0] if marked else next((s for s in services if s.name == "default"), services[0])
    return (first, *[s for s in services if s is not first])


def _service(name: str, body: Any, where: str) -> Service:
    at = f"{where}: services.{name}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", name):
        raise RecipeError(f"{at}: a service name must be letters, digits, '_', '.', '-'")
    body = body or {}
    if not isinstance(body, dict):
        raise RecipeError(f"{at}: must be a mapping")
    for key, value in body.items():
        key = str(key)
        if key.startswith("x-") or key in _HONOURED or value in (None, False, [], {}):
            continue  # `privileged: false`, `ports: []` ask for nothing
        if key == "network_mode" and value == "none":
            continue
        if key in _NO_OPS and key != "network_mode":
            continue
        raise RecipeError(f"{at}.{key}: {_REFUSED.get(key, 'not supported by gradebook sandbox')}")
    context, dockerfile, args = _build(body.get("build"), at)
    image = body.get("image")
    if dockerfile is None and not isinstance(image, str):
        raise RecipeError(f"{at}: needs `build` or `image`")
    working_dir = body.get("working_dir")
    if working_dir is not None and not (
        isinstance(working_dir, str) and working_dir.startswith("/")
    ):
        raise RecipeError(f"{at}.working_dir: must be an absolute path")
    user = body.get("user")
    return Service(
        name=name,
        context=context,
        dockerfile=dockerfile,
        image=image if dockerfile is None else None,
        working_dir=os.path.normpath(working_dir) if working_dir else None,
        environment=_environment(body.get("environment"), f"{at}.environment"),
        user=str(user) if user is not None else None,
        build_args=args,
        mem_limit_mb=_megabytes(body.get("mem_limit"), f"{at}.mem_limit"),
        cpus=float(body["cpus"]) if body.get("cpus") is not None else None,
    )


def _build(build: Any, at: str) -> tuple[str, str | None, dict[str, str]]:
    if build is None:
        return "", None, {}
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise RecipeError(f"{at}.build: must be a context path or a mapping")
    for key in build:
        if key not in _BUILD_KEYS:
            raise RecipeError(f"{at}.build.{key}: not supported by gradebook sandbox")
    context = os.path.normpath(str(build.get("context", ".")))
    if os.path.isabs(context) or context == ".." or context.startswith("../"):
        raise RecipeError(f"{at}.build.context: must lie inside the compose file's directory")
    dockerfile = os.path.normpath(str(build.get("dockerfile", "Dockerfile")))
    if os.path.isabs(dockerfile) or dockerfile.startswith(".."):
        raise RecipeError(f"{at}.build.dockerfile: must lie inside its build context")
    return context, dockerfile, _environment(build.get("args"), f"{at}.build.args")


def _environment(value: Any, at: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        out = {}
        for item in value:
            key, _, val = str(item).partition("=")
            out[key] = val
        return out
    raise RecipeError(f"{at}: must be a mapping or a list of NAME=value")


def _megabytes(value: Any, at: str) -> int | None:
    if value is None:
        return None
    found = re.fullmatch(r"\s*([\d.]+)\s*([bkmg]?)b?\s*", str(value).lower())
    if not found:
        raise RecipeError(f"{at}: not a size like 512m or 0.5gb")
    scale = {"": 1 / 2**20, "b": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024}[found.group(2)]
    return max(1, int(float(found.group(1)) * scale))


def _pack(root: Path, members: list[str]) -> bytes:
    """A canonical tar of `members` (files or directories under `root`)."""
    paths: dict[str, Path] = {}
    for member in members:
        top = root / member
        if not top.exists():
            raise RecipeError(f"recipe: {top} not found (a build context or the config file)")
        if top.is_file() or member != ".":
            paths[member] = top
        if top.is_file():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for entry in [*dirnames, *filenames]:
                full = Path(dirpath) / entry
                paths[full.relative_to(root).as_posix()] = full
    buffer = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(paths):
            full = paths[name]
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if full.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(full), 0o777
                tar.addfile(info)
            elif full.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif full.is_file():
                data = full.read_bytes()
                total += len(data)
                if total > MAX_RECIPE_BYTES:
                    raise RecipeError(
                        f"recipe: the build contexts under {root} exceed "
                        f"{MAX_RECIPE_BYTES // 2**20} MiB: give the image its own directory"
                    )
                info.size = len(data)
                info.mode = 0o755 if os.access(full, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
