"""Inspect's start-up hooks for a process that knows which scorers it runs: only the installed
entry points it needs are loaded.

Inspect's `init_hooks` (run before a process's first model, a judge's included) loads every
installed `inspect_ai` entry point, so that hooks an installed package registers see every
model call. Loading one can take seconds (inspect_evals' registry imports ~150 task modules:
2-5 s here), and most register only things a command finds by name: tasks, solvers, scorers,
metrics. A judge-graded stage that runs Inspect's own `model_graded_qa` names none of them.

`init_hooks_for(scorers)` loads:

- the entry point of each package a scorer is named under (`pkg/name`), and every entry point
  when a scorer is neither namespaced nor an Inspect built-in (its package is not known);
- every entry point that registers anything but named things (`NAMED_ONLY`): hooks, model
  providers, sandboxes... An entry point's kinds are recorded, per environment, the first time
  a process loads them all here (each loaded on its own, the registry compared before and
  after); until then, and whenever the environment or an entry point's module file changes,
  every entry point is loaded, as Inspect does.

then runs Inspect's `init_hooks` as it is, with Inspect told that its entry points are loaded
(what is left out registers only objects that are found by name, and nothing in this process
names them), so it does not load the rest: the hooks Inspect finds and runs are the same as
with everything loaded. Not graded code (no verifier's fingerprint covers it): what it loads
decides no verdict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

__all__ = ["NAMED_ONLY", "init_hooks_for", "needed_packages"]

# Registry kinds an installed package's objects are only ever found by, by name (a task, a
# solver...): an entry point registering only these changes nothing for a command that does
# not name them. Hooks run unnamed; model providers and sandboxes are looked up by a name
# that does not say its package: those entry points are always loaded.
NAMED_ONLY = frozenset({"task", "solver", "scorer", "metric", "agent", "tool", "score_reducer"})
_KINDS_FILE = "entry-point-kinds-1.json"
_KINDS_ENVS = 16


def needed_packages(scorers: Iterable[str]) -> set[str] | None:
    """The packages whose entry points these scorers need (None: not known, load them all).

    `pkg/name`: that package's; an Inspect built-in (`model_graded_qa`): none; any other name
    (a file's scorer, a name an installed package provides unqualified): not known."""
    import inspect_ai.scorer  # noqa: F401 - registers the built-ins, without entry points
    from inspect_ai._util.registry import registry_has

    packages: set[str] = set()
    for name in scorers:
        if "/" in name:
            packages.add(name.split("/", 1)[0])
        elif not registry_has("scorer", name):
            return None
    return packages


def init_hooks_for(scorers: Iterable[str]) -> None:
    """Inspect's start-up hooks (`init_hooks`), loading only the entry points these scorers
    (registry names: `model_graded_qa`, `pkg/name`) need and those that register more than
    named things (see the module's docstring); every entry point when that is not known."""
    from inspect_ai._util import entrypoints
    from inspect_ai.hooks._startup import init_hooks

    packages = needed_packages(scorers)
    eps = list(entry_points(group="inspect_ai"))
    kinds = _known_kinds(eps) if packages is not None else None
    if entrypoints._inspect_ai_eps_loaded_all or kinds is None:  # noqa: SLF001
        if not entrypoints._inspect_ai_eps_loaded_all:  # noqa: SLF001
            _remember(eps, _load_each(eps))
        init_hooks()
        return
    assert packages is not None
    for ep in eps:
        if ep.name in packages or not set(kinds.get(ep.name, ["?"])) <= NAMED_ONLY:
            entrypoints.ensure_entry_points(ep.name)
    # Inspect would load the rest on its next unqualified look-up that finds nothing (its hooks,
    # at the first model call when no package registers any): they register only named objects
    # this process does not name
    entrypoints._inspect_ai_eps_loaded_all = True  # noqa: SLF001
    init_hooks()


def _load_each(eps: list[Any]) -> dict[str, list[str]]:
    """Load every entry point, one at a time, as `ensure_entry_points()` would: the kinds of
    registry object each one added."""
    from inspect_ai._util import entrypoints, registry

    kinds: dict[str, list[str]] = {}
    for ep in eps:
        before = set(registry._registry)  # noqa: SLF001
        entrypoints.ensure_entry_points(ep.name)
        added = set(registry._registry) - before  # noqa: SLF001
        found = kinds.setdefault(ep.name, [])
        found += [k.split(":", 1)[0] for k in added]
        kinds[ep.name] = sorted(set(found))
    entrypoints._inspect_ai_eps_loaded_all = True  # noqa: SLF001 - the state it leaves
    return kinds


def _environment_key(eps: list[Any]) -> str:
    """This environment (the interpreter, its installed distributions) and each entry point's
    module file as it is now (an editable package's registry edited in place)."""
    import sys

    from scorers.identity.cache import sys_path_stamp

    files = []
    for ep in eps:
        files.append([ep.name, ep.value, _module_stamp(ep.value.split(":")[0].strip())])
    return json.dumps([sys.version, sys_path_stamp(), sorted(files)], sort_keys=True)


def _module_stamp(module: str) -> list[int] | None:
    """(mtime_ns, size) of a module's file, found without running any of its package's code."""
    import importlib.util

    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    for location in getattr(spec, "submodule_search_locations", None) or []:
        base = Path(location, *rest.split(".")) if rest else Path(location)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            try:
                st = os.stat(path)
            except OSError:
                continue
            return [st.st_mtime_ns, st.st_size]
    return None


def _known_kinds(eps: list[Any]) -> dict[str, list[str]] | None:
    """What each entry point registered when last loaded in this environment (None: not known)."""
    from scorers.identity.cache import cache_dir

    try:
        saved = json.loads((cache_dir() / _KINDS_FILE).read_text())
        kinds = saved.get(_environment_key(eps))
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(kinds, dict) or {ep.name for ep in eps} - set(kinds):
        return None
    return kinds


def _remember(eps: list[Any], kinds: dict[str, list[str]]) -> None:
    """Save `kinds` for this environment (a few environments kept); a failed write is ignored."""
    import tempfile

    from scorers.identity.cache import cache_dir

    path = cache_dir() / _KINDS_FILE
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            saved = {}
    except (OSError, ValueError):
        saved = {}
    saved[_environment_key(eps)] = kinds
    while len(saved) > _KINDS_ENVS:
        saved.pop(next(iter(saved)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kinds-")
        with os.fdopen(fd, "w") as f:
            json.dump(saved, f)
        os.replace(tmp, path)
    except OSError:
        pass
