"""Turn the task specs of a sweep config into Inspect `Task` objects, in gradebook's process.

A spec is a bundled task name (`math_verified`), a task of an installed package
(`inspect_evals/gsm8k`) or a file spec (`path/to/file.py@task`). gradebook loads task files
itself and hands Inspect the `Task`, because Inspect 0.3.285 executes a task file under a
module name it never puts in `sys.modules` (`inspect_ai/_util/module.py`): a file with
`from __future__ import annotations` and a `@dataclass` then fails inside `dataclasses`, which
looks the class's module up in `sys.modules` to read its string annotations
("AttributeError: 'NoneType' object has no attribute '__dict__'"). Here the file is imported
the way importlib documents, registered before it runs, with the file's directory as the
working directory and on `sys.path` while it loads (what Inspect does too, so sibling imports
and relative data paths in the file's code behave the same). Relative paths in a config's task
args are not left to this: `sweeps.config` resolves them next to the config.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sweeps.config import ConfigError, SweepConfig
from warehouse.error_text import did_you_mean, one_line

if TYPE_CHECKING:
    from inspect_ai import Task

__all__ = ["BUNDLED_TASK_MODULES", "TaskLoadError", "check_tasks", "load_task"]

BUNDLED_TASK_MODULES = ("tasks.math", "tasks.code", "tasks.agentic")

_SPEC_HINT = "give a bundled task name, 'package/task' or 'path/file.py@task'"


class TaskLoadError(ValueError):
    """A task spec that does not give a Task; the message says why and what to do."""


def load_task(spec: str, args: Mapping[str, Any] | None = None) -> Task:
    """Create the Inspect Task a spec names, with its task args.

    Args:
        spec: a bundled task name, "package/task", or "file.py@task" ("file.py" alone when the
            file defines exactly one task). A relative file is taken from the current directory;
            `load_config` has already made the config's file specs, and the relative paths in
            its task args, absolute.
        args: keyword arguments of the @task function.

    Raises:
        TaskLoadError: the file is missing or fails to import, it has no such task, an arg is
            not a parameter of the task, or the task function raised.
    """
    args = dict(args or {})
    file, name = _split(spec)
    if file is not None:
        path = Path(file).resolve()
        if not path.is_file():
            raise TaskLoadError(f"file {file!r} not found; {_SPEC_HINT}")
        with _task_directory(path.parent):
            factories = _tasks_in(_import_file(path))
            return _create(_pick(factories, name, where=path.name), args)
    factories = _bundled_tasks()
    if name in factories:
        return _create(factories[name], args)
    from inspect_ai.util import registry_create

    try:  # tasks of installed packages, found through their Inspect entry points
        return registry_create("task", name, **args)
    except LookupError:
        bundled = ", ".join(sorted(factories)) or "none"
        hint = did_you_mean(name, [*factories, *_registered_tasks()])
        raise TaskLoadError(
            f"no task named {name!r}{hint} (bundled: {bundled}); {_SPEC_HINT}"
        ) from None
    except Exception as exc:
        raise TaskLoadError(
            f"creating it raised {one_line(exc)}; fix the task or its args"
        ) from None


def check_tasks(cfg: SweepConfig) -> int:
    """Load every task of a sweep once, so a bad spec stops the sweep before any model call.

    Returns:
        How many samples the sweep will generate (each task's dataset, cut by its limit, times
        its epochs, for every model).

    Raises:
        ConfigError: one line naming the config file, tasks[i], the spec and what to do.
    """
    samples = 0
    for i, task_cfg in enumerate(cfg.tasks):
        try:
            task = load_task(task_cfg.task, task_cfg.args)
        except TaskLoadError as exc:
            raise ConfigError(
                f"{cfg.source or '<config>'}: tasks[{i}] ({task_cfg.task}): {exc}"
            ) from None
        n = len(task.dataset)
        samples += min(n, task_cfg.limit or n) * task_cfg.epochs
    return samples * len(cfg.models)


def _split(spec: str) -> tuple[str | None, str | None]:
    """(file, task name) of a file spec; (None, name) for a registered name."""
    if spec.endswith(".py"):
        return spec, None
    file, sep, name = spec.rpartition("@")
    if sep and file.endswith(".py"):
        return file, name
    return None, spec


@contextlib.contextmanager
def _task_directory(directory: Path) -> Iterator[None]:
    entry = str(directory)
    sys.path.append(entry)
    try:
        with contextlib.chdir(directory):
            yield
    finally:
        sys.path.remove(entry)


def _import_file(path: Path) -> ModuleType:
    # One module name per file path, a valid identifier (Inspect uses the path itself): loading
    # the file again replaces the module, so each sweep sees the file as it is on disk now.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"gradebook_task_file_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TaskLoadError(f"{path} cannot be imported as Python; {_SPEC_HINT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before it runs: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        if not isinstance(exc, Exception):
            raise
        raise TaskLoadError(
            f"importing {path} raised {one_line(exc)}; fix the file (or install what it imports)"
        ) from None
    return module


def _tasks_in(module: ModuleType) -> dict[str, Any]:
    """The @task factories in a module's namespace, by task name (package prefix dropped)."""
    from inspect_ai.util import registry_info

    found: dict[str, Any] = {}
    for value in vars(module).values():
        if not callable(value):
            continue
        try:
            info = registry_info(value)
        except ValueError:  # not a registered object
            continue
        if info.type == "task":
            found[info.name.rsplit("/", 1)[-1]] = value
    return found


def _bundled_tasks() -> dict[str, Any]:
    # Bundled names resolve to the bundled modules, not to whatever registered that name last
    # (Inspect's registry is keyed by name, so a user's file may reuse one).
    found: dict[str, Any] = {}
    for module in BUNDLED_TASK_MODULES:
        try:
            found |= _tasks_in(importlib.import_module(module))
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return found


def _pick(factories: dict[str, Any], name: str | None, *, where: str) -> Any:
    tasks = ", ".join(sorted(factories)) or "none"
    if name is None:
        if len(factories) != 1:
            raise TaskLoadError(f"{where} defines tasks {tasks}; name one as '{where}@<task>'")
        return next(iter(factories.values()))
    if name not in factories:
        raise TaskLoadError(
            f"{where} has no @task named {name!r}; name one of its tasks ({tasks}) after '@'"
        )
    return factories[name]


def _create(factory: Any, args: dict[str, Any]) -> Task:
    name = getattr(factory, "__name__", "task")
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(args) - set(params))
        if unknown:
            raise TaskLoadError(
                f"{name} has no parameter(s) {unknown} (its parameters: "
                f"{', '.join(params) or 'none'}); fix the task's args"
            )
    needed = [
        n
        for n, p in params.items()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    missing = [n for n in needed if n not in args]
    if missing:
        raise TaskLoadError(f"{name} needs arg(s) {missing}; set them in the task's args")
    try:
        return factory(**args)
    except Exception as exc:
        raise TaskLoadError(
            f"{name}(...) raised {one_line(exc)}; fix the task or its args"
        ) from None


def _registered_tasks() -> list[str]:
    """The tasks Inspect's registry knows now (installed packages' among them, once looked up)."""
    from inspect_ai._util.registry import registry_find, registry_info

    return [registry_info(t).name for t in registry_find(lambda info: info.type == "task")]
