"""Which scorer files are installed code: imported by module name, never by the path a log names.

A log or a warehouse may name a scorer file (`FILE.py@scorer`); gradebook imports a file by
path only on the user's word (scorers.inspect_scorers.specs). A file that is a module of
installed code is another matter: its package imports it whenever it is used, and its package's
Inspect entry point makes its scorers known by registry name. Two kinds count:

- gradebook's own Inspect scorers, `OWN_SCORER_MODULES`, which gradebook's entry point
  (`scorers._registry`, `[project.entry-points.inspect_ai]`) imports, wherever this gradebook
  runs from (a wheel, an editable install, a checkout): the bundled tasks' own scorers;
- a module of the package of an installed Inspect entry point (inspect_evals, another Inspect
  extension), found where Python imports that package from.

Such a file resolves as the registry scorer of its module, imported by the module's name as its
package imports it: one verifier (name, spec, fingerprint) whoever named it and wherever the log
was made. Any other file (a user's own, one of another checkout of gradebook, one a log points
at) is not installed code here and still needs the user's word (`--verifier-module`).

Not imported by the grading code (scorers.inspect_scorers.factories, grading): that code is
part of every Inspect scorer's fingerprint.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path
from typing import Any

__all__ = [
    "OWN_SCORER_MODULES",
    "import_installed",
    "import_own",
    "is_installed",
    "known_scorer_names",
    "module_name",
    "remember_scorer_names",
    "scorer_in",
]

# the modules defining gradebook's Inspect scorers (the bundled tasks' own), imported by
# gradebook's entry point so that each resolves by its registry name in any process
OWN_SCORER_MODULES = ("scorers.math.scorer", "scorers.code.scorer", "tasks.agentic_scorer")


def module_name(file: str) -> str | None:
    """The name `file` is imported under when it is installed code (see the module's
    docstring), else None. Looking imports the parent packages of an installed module (its
    package's own code), never the file."""
    try:
        real = Path(file).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if real.suffix != ".py":
        return None
    own = [m for m in OWN_SCORER_MODULES if m.rsplit(".", 1)[-1] == real.stem]
    for name in (*own, *_entry_point_modules(real)):
        if _origin(name) == real:
            return name
    return None


def is_installed(module: str) -> bool:
    """Whether a module name is installed code: one of gradebook's own scorer modules, or a
    module of an installed Inspect entry point's package (as found here, never a file a log
    names)."""
    return module in OWN_SCORER_MODULES or module.split(".")[0] in _entry_point_packages()


def import_installed(module: str | None) -> None:
    """Import `module` by name when it is installed code (so the scorers it defines are in
    Inspect's registry); anything else is left alone. A failure is left for the registry lookup
    that follows to word."""
    if module and is_installed(module):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001, S110 - the lookup says the scorer is unknown
            pass


def scorer_in(module: str, scorer: str) -> tuple[Any, str] | None:
    """(factory, registry name) of the @scorer named `scorer` (unqualified; "" for a module
    with exactly one) that the installed module `module` defines; None when it defines none of
    that name. Imports the module by name.

    Raises:
        Exception: importing the module raised (installed code: the caller words it).
    """
    from inspect_ai._util.registry import is_registry_object, registry_info

    found: dict[str, tuple[Any, str]] = {}
    for value in vars(importlib.import_module(module)).values():
        if callable(value) and is_registry_object(value):
            info = registry_info(value)
            if info.type == "scorer" and getattr(value, "__module__", None) == module:
                found[info.name.rsplit("/", 1)[-1]] = (value, info.name)
    if not scorer:
        return next(iter(found.values())) if len(found) == 1 else None
    return found.get(scorer)


def _origin(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin).resolve() if origin else None


def _entry_point_modules(real: Path) -> list[str]:
    """The module names `real` would have inside the package of an installed Inspect entry
    point, where it lies in that package's directory."""
    names = []
    for top, directories in _entry_point_packages().items():
        for directory in directories:
            if not real.is_relative_to(directory):
                continue
            parts = [top, *real.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            if all(p.isidentifier() for p in parts):
                names.append(".".join(parts))
    return names


@functools.cache
def _entry_point_packages() -> dict[str, tuple[Path, ...]]:
    """The top-level package of each installed Inspect entry point -> its directories, as this
    Python finds them (a top-level package is located without running its code)."""
    from importlib.metadata import entry_points

    found: dict[str, tuple[Path, ...]] = {}
    for ep in entry_points(group="inspect_ai"):
        top = ep.value.split(":")[0].split(".")[0].strip()
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        locations = getattr(spec, "submodule_search_locations", None) or []
        found[top] = tuple(Path(d).resolve() for d in locations)
    return found


def import_own() -> None:
    """Import gradebook's own scorer modules (what its entry point registers), by name."""
    for module in OWN_SCORER_MODULES:
        import_installed(module)


# The scorer names every installed Inspect entry point registers, per environment: loading
# them all imports each package's whole registry (seconds: inspect_evals' alone takes 2-5 s),
# which a command naming a scorer no package provides would pay only to say so.
_NAMES_FILE = "installed-scorers-1.json"
_NAMES_ENVS = 16


def _environment_key() -> str:
    import json
    import sys

    from scorers.identity.cache import sys_path_stamp

    return json.dumps([sys.version, sys_path_stamp()], sort_keys=True)


def known_scorer_names() -> frozenset[str] | None:
    """The qualified registry names of the scorers the installed Inspect entry points register
    in this environment, as seen when they were last loaded here (None: not known for this
    environment; then they must be loaded). A cache: unreadable or foreign means None."""
    import json

    from scorers.identity.cache import cache_dir

    try:
        saved = json.loads((cache_dir() / _NAMES_FILE).read_text())
        names = saved.get(_environment_key())
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return frozenset(names)


def remember_scorer_names() -> None:
    """Save the scorer names in Inspect's registry now (after every entry point was loaded)
    for this environment; a failed write is ignored (a cache)."""
    import json
    import os
    import tempfile

    from inspect_ai._util.registry import registry_find, registry_info

    from scorers.identity.cache import cache_dir

    names = sorted({registry_info(o).name for o in registry_find(lambda i: i.type == "scorer")})
    path = cache_dir() / _NAMES_FILE
    try:
        saved = json.loads(path.read_text())
        saved = saved if isinstance(saved, dict) else {}
    except (OSError, ValueError):
        saved = {}
    key = _environment_key()
    saved.pop(key, None)
    saved[key] = names
    while len(saved) > _NAMES_ENVS:  # the oldest environments go first
        saved.pop(next(iter(saved)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".installed-scorers-")
        with os.fdopen(fd, "w") as f:
            json.dump(saved, f)
        os.replace(tmp, path)  # whole or not at all: another command may read it meanwhile
    except OSError:
        pass
