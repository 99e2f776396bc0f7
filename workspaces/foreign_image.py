"""The image a sample of a log made elsewhere is restored into: one whose log has no workspace
record (Inspect's own `docker` sandbox, or gradebook's with capture off) but names its sandbox.

Such a log says in `eval.sandbox` which compose file or Dockerfile its samples ran in
(`("docker", "compose.yaml")`, relative to the task's directory) and in `eval.task_file`
where the task was. When that file is at hand, its image is built here and the scorer's
sandboxes start in it, one per compose service, as gradebook's provider runs them:

1. under `--task-dir DIR` (`GRADEBOOK_TASK_DIR`), when given;
2. else beside the log's task file, when that path exists on this machine.

The task file is never imported or run: only its directory is looked in. The file found is
read as gradebook's provider reads a task's recipe (scorers.sandbox.recipe: a refused key
leaves the sample `unscored`, `sandbox_unavailable`, in one line), built once per recipe
(labelled, under the image cache's cap). A build from beside a log's task file gets no
network for its steps (the log chose that directory); one from `--task-dir` does, as at
generation (the user named it).

When the file is not at hand, or the log names another kind of sandbox, the sample is
restored into gradebook's image, and the verdict's metadata says so (`stand_in`): never
silently another image. In a stand-in, a command the image lacks (exit 127: what a task's own
tool gives there) leaves the sample `unscored` (`sandbox_unavailable`), never graded wrong.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from scorers.sandbox.image_cache import cap_bytes, mark_used, prune
from scorers.sandbox.recipe import Recipe, RecipeError, is_recipe_file, read_recipe
from scorers.sandbox.task_image import RunImage, build_service, local_image, run_image

if TYPE_CHECKING:
    from inspect_ai.util import ExecResult

__all__ = [
    "FOREIGN_KEY",
    "FOREIGN_MARK",
    "TASK_DIR_ENV",
    "Foreign",
    "foreign_image",
    "missing_tool",
    "resolve_foreign",
]

TASK_DIR_ENV = "GRADEBOOK_TASK_DIR"  # `--task-dir` of `gradebook score` and `rescore`
FOREIGN_KEY = "run_sandbox"  # in the scoring stage's state (warehouse.task_state_columns)
FOREIGN_MARK = '"eval_sandbox"'  # in that state only when the run named a sandbox
_RUNNERS = ("docker", "gradebook")  # the sandboxes whose compose file gradebook can run


@dataclass(frozen=True)
class Foreign:
    """What a sample with no workspace record is restored into.

    Attributes:
        names: its sandboxes' names (the recipe's services, the default first); empty: any
            name asked for, in gradebook's image.
        recipe: the recipe found (None: gradebook's image).
        found: the config file it was read from.
        network: whether the build's steps may reach the network.
        stand_in: why gradebook's image stands in for the one the sample ran in (None: it is
            the right one, or the recipe's image is used).
        refused: the recipe found cannot be run (one line): the sample is unscored.
    """

    names: tuple[str, ...] = ()
    recipe: Recipe | None = None
    found: str | None = None
    network: bool = False
    stand_in: str | None = None
    refused: str | None = None


# by config file (path, size, mtime): read once per process while the file is unchanged
_RECIPES: dict[tuple[str, int, int], Recipe | RecipeError] = {}
_LOCK = threading.Lock()


def resolve_foreign(run_sandbox: Any, task_dir: str | None) -> Foreign | None:
    """What a sample whose log has no workspace record is restored into.

    Args:
        run_sandbox: the run's `{"eval_sandbox": ..., "task_file": ...}` as the scoring stage
            hands it over (from the log: hostile, checked here); None: the run named no sandbox.
        task_dir: `--task-dir`, when given.

    Returns:
        None when gradebook's image is the one the sample ran in (or it ran in none).
    """
    if run_sandbox is None:
        return None
    spec = run_sandbox.get("eval_sandbox") if isinstance(run_sandbox, dict) else None
    kind = spec.get("type") if isinstance(spec, dict) else None
    config = spec.get("config") if isinstance(spec, dict) else None
    task_file = run_sandbox.get("task_file") if isinstance(run_sandbox, dict) else None
    if not isinstance(kind, str):
        return Foreign(
            stand_in="the log's sandbox spec is unreadable; restored into gradebook's image"
        )
    if kind == "gradebook" and (config is None or isinstance(config, dict)):
        image = config.get("image") if isinstance(config, dict) else None
        if not image:
            return None  # gradebook's own image: the one it ran in
        return Foreign(stand_in=f"ran in image {str(image)[:200]!r}, named by its sandbox config, "
                                "with no workspace record; restored into gradebook's image")  # fmt: skip
    if kind not in _RUNNERS or not is_recipe_file(config):
        what = f"{config!r}" if isinstance(config, str) else "no compose file named"
        return Foreign(stand_in=f"ran under the {kind[:40]!r} sandbox ({what[:200]}); restored "
                                "into gradebook's image")  # fmt: skip
    assert isinstance(config, str)
    name = _relative(config)
    places: list[tuple[str, bool]] = [(task_dir, True)] if task_dir else []
    if isinstance(task_file, str) and task_file and "\x00" not in task_file:
        places.append((os.path.dirname(os.path.abspath(task_file)), False))
    for where, trusted in places:
        path = Path(where, name)
        try:
            if name and path.is_file():
                return _found(str(path.resolve()), trusted)
        except (OSError, ValueError):  # a path this machine cannot even look at: not found
            continue
    looked = " or ".join(str(Path(w, name or "?")) for w, _ in places)[:300]
    return Foreign(
        stand_in=(
            f"{config[:100]!r} of the {kind!r} sandbox not found: gradebook's image stands in; "
            "pass --task-dir with the task's directory to score in its own image "
            f"({('looked at ' + looked) if looked else 'the log names no task file'})"
        )
    )


def _relative(config: str) -> str:
    """The config file's path under the task's directory ("" when it would leave it)."""
    path = PurePosixPath(config.replace("\\", "/"))
    if path.is_absolute():
        return path.name  # an absolute path of the machine that wrote the log: its name
    if ".." in path.parts or "\x00" in config:
        return ""
    return str(path)


def _found(path: str, trusted: bool) -> Foreign:
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        recipe = _RECIPES.get(key)
        if recipe is None:
            try:
                recipe = read_recipe(path)
            except RecipeError as exc:
                recipe = exc
            _RECIPES[key] = recipe
    if isinstance(recipe, RecipeError):
        return Foreign(found=path, refused=str(recipe))
    names = tuple(s.name for s in recipe.services)
    return Foreign(names=names, recipe=recipe, found=path, network=trusted)


def foreign_image(client: Any, foreign: Foreign, name: str) -> RunImage:
    """The image of the recipe's service `name`, built here unless its tag is on the Engine
    (blocking: a build may take minutes).

    Raises:
        TaskImageUnavailable: the build failed, or an image it names is not on the Engine.
        RecipeError: the recipe has no such service.
    """
    assert foreign.recipe is not None
    recipe = foreign.recipe
    service = recipe.service(name)
    if service.dockerfile is None:
        assert service.image is not None
        ref = service.image
        image = local_image(client, ref, why=f"named by services.{service.name} of {foreign.found}")
    else:
        ref, built = build_service(client, recipe, service, network=foreign.network)
        image = local_image(client, ref, why=f"built from {foreign.found}")
        if built:
            prune(client, cap_bytes(), keep=frozenset({image.id}))
    mark_used(image.id)
    return run_image(image, ref, service=service, recipe=recipe)


def missing_tool(result: ExecResult[str]) -> bool:
    """Whether a command's result says its program is not in the image (the shell's 127, or
    the Engine's when it cannot find the executable)."""
    if result.returncode == 127:
        return True
    said = f"{result.stderr} {result.stdout}"
    return result.returncode == 126 and "not found" in said
