"""The @scorer factory an Inspect scorer spec names, found without trusting a log.

What a grading worker needs to create the scorer a `Verifier` names (scorers.inspect_scorers
.grading), apart from registering and naming verifiers (scorers.inspect_scorers.specs): an
installed scorer by registry name (importing only its installed module, or the package's
Inspect entry point), a file through the recording loader (scorers.loaded_code). Deciding
whether a file may be imported is the caller's (`specs.resolve`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scorers.identity import loaded_code

__all__ = ["ScorerSpec", "SpecError", "file_module_name", "load_scorer_file", "resolve_factory"]

_FILE_MODULE_PREFIX = "gradebook_scorer_file_"
TRUSTED_FILES: set[str] = set()  # file paths this process loaded because the user named them


class SpecError(ValueError):
    """A verifier spec that cannot be resolved; the message is one line saying what to do."""


@dataclass(frozen=True)
class ScorerSpec:
    """An Inspect scorer to grade with.

    Attributes:
        scorer: its registry name ("match", "inspect_evals/x"), or for a file spec the name
            after "@".
        params: keyword arguments of the @scorer factory (JSON).
        file: for a file spec, the file's absolute path.
        name: the name its scores are stored under (default: as Inspect names them).
        module: for a registry spec, the installed module that defines the factory (imported
            first by a grading process, so it need not load every entry point of a package).
        roles: model roles the scorer grades with, by role name: {"grader": {"model", "base_url",
            "args", "config"}} for a judge (scorers.inspect_scorers.judges).
    """

    scorer: str
    params: Mapping[str, Any] = field(default_factory=dict)
    file: str | None = None
    name: str | None = None
    module: str | None = None
    roles: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "file" if self.file else "registry",
            "scorer": self.scorer,
            "params": dict(self.params),
        }
        for key in ("file", "name", "module"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.roles:
            out["roles"] = {k: dict(v) for k, v in self.roles.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScorerSpec:
        return cls(
            scorer=str(data["scorer"]),
            params=dict(data.get("params") or {}),
            file=data.get("file"),
            name=data.get("name"),
            module=data.get("module"),
            roles=dict(data.get("roles") or {}),
        )

    def key(self, *, roles: bool = True) -> str:
        """Identity of the spec (what was asked for; `module` is derived); `roles=False`:
        the scorer whatever model its roles are bound to."""
        out = self.to_json()
        out.pop("module", None)
        if not roles:
            out.pop("roles", None)
        return json.dumps(out, sort_keys=True, default=str)

    def shown(self) -> str:
        """The spec as a user writes it."""
        base = f"{self.file}@{self.scorer}" if self.file else self.scorer
        if self.params:
            base += " " + json.dumps(dict(self.params), sort_keys=True, default=str)
        return base


def resolve_factory(spec: ScorerSpec) -> tuple[Any, str, str]:
    """(the @scorer factory, its registry name, its module) for a spec, importing only what
    the spec allows (see `resolve`; a file spec is imported here, so check trust first).

    Raises:
        SpecError: as `resolve`.
    """
    if spec.file:
        module = load_scorer_file(spec.file)
        factories = _scorers_in(module)
        if not spec.scorer:
            if len(factories) != 1:
                names = ", ".join(sorted(factories)) or "none"
                raise SpecError(f"{spec.file} defines scorers {names}; name one as FILE@scorer")
            scorer = next(iter(factories))
        else:
            scorer = spec.scorer
        if scorer not in factories:
            names = ", ".join(sorted(factories)) or "none"
            raise SpecError(
                f"{spec.file} has no @scorer named {scorer!r}; name one of its scorers "
                f"({names}) after '@'"
            )
        factory, registry_name = factories[scorer]
        return factory, registry_name, module.__name__
    from inspect_ai._util.registry import registry_info, registry_lookup

    if spec.module and _installed_module(spec.module):
        try:
            importlib.import_module(spec.module)  # installed code: registers the factory
        except Exception:  # noqa: BLE001, S110 - the lookup below words the failure
            pass
    factory = registry_lookup("scorer", spec.scorer)
    if factory is None:
        package = spec.scorer.split("/")[0] if "/" in spec.scorer else None
        if package and importlib.util.find_spec(package) is None:
            raise SpecError(
                f"unknown verifier {spec.scorer!r}: the package {package!r} that defines it is "
                "not installed; install it, or pass --verifier NAME"
            )
        raise SpecError(
            f"unknown verifier {spec.scorer!r}: not a gradebook verifier, an Inspect built-in "
            "scorer or a scorer of an installed package; if a task file defines it, pass "
            f"--verifier-module FILE.py@{spec.scorer.rsplit('/', 1)[-1]}"
        )
    module = getattr(factory, "__module__", "") or ""
    return factory, registry_info(factory).name, module


def _installed_module(module: str) -> bool:
    """Whether a module lives in the Python installation or an installed distribution (never
    a file a log could point at)."""
    top = module.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = getattr(found, "origin", None) or ""
    return bool(origin) and not loaded_code.is_recorded_path(origin)


def _scorers_in(module: Any) -> dict[str, tuple[Any, str]]:
    """The @scorer factories in a module's namespace: unqualified name -> (factory, name)."""
    from inspect_ai._util.registry import is_registry_object, registry_info

    found: dict[str, tuple[Any, str]] = {}
    for value in vars(module).values():
        if callable(value) and is_registry_object(value):
            info = registry_info(value)
            if info.type == "scorer":
                found[info.name.rsplit("/", 1)[-1]] = (value, info.name)
    return found


def load_scorer_file(path: str) -> Any:
    """Import a scorer file the user named (once per process) through the recording loader
    (scorers.loaded_code), so its rows carry the fingerprint of the code that graded them.

    The file's directory goes on `sys.path` (and stays: the scorer may import its siblings
    while it grades), as under Inspect; the module name is unique per path.
    """
    path = str(Path(path).resolve())
    name = file_module_name(path)
    module = sys.modules.get(name)
    if module is not None:
        return module
    directory = str(Path(path).parent)
    if directory not in sys.path:
        sys.path.append(directory)
    try:
        module = loaded_code.load_file(name, path)
    except Exception as exc:  # noqa: BLE001 - a user's file that fails to import
        raise SpecError(
            f"importing {path} raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}; fix the file"
        ) from None
    TRUSTED_FILES.add(path)
    return module


def file_module_name(path: str) -> str:
    """The module name a scorer file is imported under (the same in every process)."""
    digest = hashlib.sha256(path.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in Path(path).stem)
    return f"{_FILE_MODULE_PREFIX}{stem}_{digest}"
