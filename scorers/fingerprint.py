"""A verifier's identity: what must change for its verdicts to be allowed to change.

The digest covers, for the verifier's module and every project module it imports (transitively):
the code as an AST with docstrings removed, so comments, formatting and documentation do not
count but any change to behaviour does; plus the verifier's parameters (JSON, sorted keys), the
name of its grade function, and the installed versions of the third-party distributions those
modules import. Standard-library modules count as part of the interpreter and are not hashed.

"Project" modules are those whose file lies under the repository root (the directory holding the
`scorers` package) or under the directory of the verifier's own top-level package, and not inside
an installed environment (site-packages). Per-file work is cached on (path, mtime, size), in the
process and on disk (scorers.fingerprint_cache), so a repeat call, even from a new process, costs
one `stat` per module, and an edited file is re-read.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scorers.fingerprint_cache import ENV_DIRS, FingerprintCache, file_key, sys_path_stamp
from scorers.registry import Verifier

_REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class VerifierFingerprint:
    """Attributes:
    name: the verifier's registered name.
    digest: hex sha256 identifying this exact behaviour.
    label: the verifier's human label.
    source: the normalised source of every hashed module plus params and versions (what the
        digest was computed from), kept in the warehouse so a digest can be explained later.
    params: the verifier's parameters.
    """

    name: str
    digest: str
    label: str
    source: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _ModuleFacts:
    normalised: str  # ast.unparse of the docstring-free tree, for the snapshot
    digest: str
    imports: tuple[str, ...]  # absolute module names this module imports


_FILE_CACHE: dict[tuple[str, int, int], _ModuleFacts] = {}
_DISK: FingerprintCache | None = None


def _disk() -> FingerprintCache:
    global _DISK
    if _DISK is None:
        _DISK = FingerprintCache.load()
    return _DISK


def fingerprint(verifier: Verifier) -> VerifierFingerprint:
    """Compute a verifier's fingerprint (deterministic; cheap after the first call).

    Raises:
        ValueError: the verifier's module cannot be found or its parameters are not JSON.
    """
    module_files = _module_closure(verifier.module)
    modules = {name: _facts(name, path) for name, path in module_files.items()}
    project_tops = {name.split(".")[0] for name in module_files}
    third_party = _third_party_versions(
        imp
        for facts in modules.values()
        for imp in facts.imports
        if imp.split(".")[0] not in project_tops
    )
    try:
        params_json = json.dumps(dict(verifier.params), sort_keys=True, default=_reject)
    except TypeError as exc:
        raise ValueError(f"verifier {verifier.name!r}: parameters must be JSON ({exc})") from None
    grade_name = f"{getattr(verifier.grade, '__module__', '')}:{verifier.grade.__qualname__}"
    payload = {
        "grade": grade_name,
        "modules": {name: modules[name].digest for name in sorted(modules)},
        "params": params_json,
        "versions": third_party,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    source = "\n".join(
        [
            f"# verifier {verifier.name} -> {grade_name}",
            f"# params {params_json}",
            f"# versions {json.dumps(third_party, sort_keys=True)}",
            *(f"# ---- module {name}\n{modules[name].normalised}" for name in sorted(modules)),
        ]
    )
    _disk().save()
    return VerifierFingerprint(
        name=verifier.name,
        digest=digest,
        label=verifier.label,
        source=source,
        params=json.loads(params_json),
    )


def _reject(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _module_closure(root: str) -> dict[str, Path]:
    """The root module and the project modules it imports, transitively: name -> file."""
    root_path = _module_file(root)
    if root_path is None:
        raise ValueError(f"verifier module {root!r} not found: is it importable from sys.path?")
    top = sys.modules.get(root.split(".")[0])
    roots = {_REPO_ROOT}
    top_file = _module_file(root.split(".")[0]) if top is None else getattr(top, "__file__", None)
    if top_file:
        top_path = Path(top_file).resolve()
        roots.add(top_path.parent.parent if top_path.name == "__init__.py" else top_path.parent)
    found: dict[str, Path] = {}
    tops: dict[str, bool] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        top = name.split(".")[0]
        if top not in tops:
            tops[top] = _top_is_project(top, roots)
        if not tops[top] or _attribute_of_module(name):
            # not a project module; and finding its spec would import its parent (inspect_ai,
            # or a module that imports it: 3 s)
            continue
        path = _module_file(name)
        if path is None or not _is_project(path, roots):
            continue
        found[name] = path
        todo.extend(_facts(name, path).imports)
    return found


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).resolve()


def _attribute_of_module(name: str) -> bool:
    """`pkg.mod.attr` from `from pkg.mod import attr`: a module (not a package) has no
    submodules, so `attr` is no module of its own."""
    parent = name.rpartition(".")[0]
    if not parent:
        return False
    path = _module_file(parent)
    return path is not None and path.name != "__init__.py"


def _top_is_project(top: str, roots: set[Path]) -> bool:
    """Whether a top-level module or package (namespace packages too) lives in the project."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.origin and spec.origin.endswith(".py"):
        return _is_project(Path(spec.origin).resolve(), roots)
    return any(
        _is_project(Path(loc).resolve(), roots) for loc in spec.submodule_search_locations or []
    )


def _is_project(path: Path, roots: set[Path]) -> bool:
    if any(marker in path.parts for marker in ENV_DIRS):
        return False
    return any(path.is_relative_to(r) for r in roots)


def _facts(name: str, path: Path) -> _ModuleFacts:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    cached = _FILE_CACHE.get(key) or _from_disk(key)
    if cached is not None:
        _FILE_CACHE[key] = cached
        return cached
    tree = ast.parse(path.read_bytes(), filename=str(path))
    _strip_docstrings(tree)
    dump = ast.dump(tree, annotate_fields=True, include_attributes=False)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    facts = _ModuleFacts(
        normalised=ast.unparse(tree),
        digest=hashlib.sha256(dump.encode()).hexdigest(),
        imports=tuple(sorted(_imports(tree, package))),
    )
    _FILE_CACHE[key] = facts
    disk = _disk()
    disk.files[file_key(*key)] = {
        "normalised": facts.normalised,
        "digest": facts.digest,
        "imports": list(facts.imports),
    }
    disk.dirty = True
    return facts


def _from_disk(key: tuple[str, int, int]) -> _ModuleFacts | None:
    entry = _disk().files.get(file_key(*key))
    if not isinstance(entry, dict):
        return None
    try:
        facts = _ModuleFacts(entry["normalised"], entry["digest"], tuple(entry["imports"]))
    except (TypeError, KeyError):
        return None
    ok = isinstance(facts.normalised, str) and isinstance(facts.digest, str)
    return facts if ok and all(isinstance(i, str) for i in facts.imports) else None


def _strip_docstrings(tree: ast.AST) -> None:
    # Docstrings document; they do not decide a verdict, so editing one keeps the identity.
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]


def _imports(tree: ast.AST, package: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.update(_with_parents(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(node.module, node.level, package)
            if base is None:
                continue
            names.update(_with_parents(base))
            # `from pkg import mod` imports a submodule when `mod` is one
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _resolve_relative(module: str | None, level: int, package: str) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None


def _third_party_versions(imports: Iterable[str]) -> dict[str, str]:
    tops = {name.split(".")[0] for name in imports}
    tops -= set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    installed = _installed()
    dists, known = installed["map"], installed["versions"]
    versions: dict[str, str] = {}
    for top in sorted(tops):
        for dist in dists.get(top, []):
            if dist not in known:
                try:
                    known[dist] = importlib.metadata.version(dist)
                except importlib.metadata.PackageNotFoundError:
                    known[dist] = None
                _disk().dirty = True
            if known[dist] is not None:
                versions[dist] = known[dist]
    return versions


_INSTALLED: dict[str, Any] | None = None


def _installed() -> dict[str, Any]:
    """{"map": import name -> distributions, "versions": distribution -> version or None}.

    Scanning every installed distribution's metadata takes ~0.3 s. It is redone only when a
    sys.path directory says a distribution was installed or removed (checked on every call, so
    a long-running watcher sees an upgrade), and its result is shared through the disk cache.
    """
    global _INSTALLED
    stamp = sys_path_stamp()
    for known in (_INSTALLED, _disk().dists):
        if (
            isinstance(known, dict)
            and known.get("stamp") == stamp
            and isinstance(known.get("map"), dict)
            and isinstance(known.get("versions"), dict)
            and all(isinstance(v, list) for v in known["map"].values())
        ):
            _INSTALLED = known
            return known
    mapping = importlib.metadata.packages_distributions()
    _INSTALLED = {
        "stamp": stamp,
        "map": {k: sorted(set(v)) for k, v in mapping.items()},
        "versions": {},
    }
    _disk().dists = _INSTALLED
    _disk().dirty = True
    return _INSTALLED
