"""A verifier's identity: what must change for its verdicts to be allowed to change.

The digest covers, for the verifier's module and every project module it imports (transitively):
the code as an AST with docstrings removed, so comments, formatting and documentation do not
count but any change to behaviour does; plus the verifier's parameters (JSON, sorted keys), the
name of its grade function, and the installed versions of the third-party distributions those
modules import. Standard-library modules count as part of the interpreter and are not hashed.

The closure starts at the verifier's module and at the modules its helper processes preload
(`Verifier.helpers`: the math verifier's sympy comparisons run in `scorers.math._symbolic`, which it
names but does not import). "Project" modules are those whose file lies under the repository root
(the directory holding the `scorers` package) or under the directory of a root's top-level
package, and not inside an installed environment (site-packages). Per-module work is cached on the
module's name and the sha256 of its bytes, in the process and on disk (scorers.identity.cache),
so a repeat call, even from a new process, costs a read and a hash per module.

Two sources for a module's bytes: `fingerprint` reads the files as they are now (the code a fresh
import would run); `fingerprint_as_loaded` uses the bytes this process (and the helper processes
it used) actually compiled, as `scorers.identity.loaded_code` recorded them, so a grading process can say
which code produced its verdicts.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scorers.identity import loaded_code
from scorers.identity.cache import ENV_DIRS, FingerprintCache, file_key, sys_path_stamp
from scorers.registry import Verifier

_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class VerifierFingerprint:
    """Attributes:
    name: the verifier's registered name.
    digest: hex sha256 identifying this exact behaviour.
    label: the verifier's human label.
    source: the normalised source of every hashed module plus params and versions (what the
        digest was computed from), kept in the warehouse so a digest can be explained later.
    params: the verifier's parameters.
    module: the verifier's module (`Verifier.module`): what `--verifier-module` imports to
        register it again.
    spec: how to rebuild it in another command (what the warehouse stores, `stored_spec`):
        `Verifier.spec` for an Inspect scorer, `{"kind": "module", ...}` for a verifier a
        user's module registers, None for gradebook's bundled ones; with `stored_as` (its
        name) and, for a file or module, the `sha256` of the file's bytes.
    """

    name: str
    digest: str
    label: str
    source: str
    params: dict[str, Any] = field(default_factory=dict)
    module: str = ""
    spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class _ModuleFacts:
    normalised: str  # ast.unparse of the docstring-free tree, for the snapshot
    digest: str
    imports: tuple[str, ...]  # absolute module names this module imports


_FILE_CACHE: dict[tuple[str, str], _ModuleFacts] = {}  # (module name, sha256 of its bytes)
_DISK: FingerprintCache | None = None


def _disk() -> FingerprintCache:
    global _DISK
    if _DISK is None:
        _DISK = FingerprintCache.load()
    return _DISK


class _Unvouched(Exception):
    """A module of the closure ran here, but not from bytes that were recorded."""


@dataclass
class _Source:
    """Where a module's code is: its file, and its bytes (read on demand from the file)."""

    path: Path
    data: bytes | None = None

    def read(self) -> bytes:
        if self.data is None:
            self.data = self.path.read_bytes()
        return self.data


_Locator = Callable[[str], "_Source | None"]


def fingerprint(verifier: Verifier) -> VerifierFingerprint:
    """Compute a verifier's fingerprint from its files as they are now (deterministic; cheap
    after the first call).

    Raises:
        ValueError: the verifier's module cannot be found or its parameters are not JSON.
    """
    return _fingerprint(verifier, _on_disk)[0]


_AS_LOADED: dict[tuple[Any, ...], tuple[int, tuple[tuple[str, int, int], ...], Any]] = {}
_AS_LOADED_LOCK = threading.Lock()


def fingerprint_as_loaded(verifier: Verifier) -> VerifierFingerprint | None:
    """The fingerprint of the verifier's code as this process and its helper processes compiled
    it (`scorers.identity.loaded_code`); modules of the closure that nothing here has imported count as
    their files are now, since no code of theirs ran.

    Equal to `fingerprint(verifier)` exactly when what ran here is what the files hold now.
    Repeated calls cost a `stat` per module not imported here, until something new is imported.

    Returns:
        None when nothing can vouch for the code that ran: a module of the closure was imported
        before recording began, or was loaded with different bytes here and in a helper.
    """
    key = (
        verifier.name,
        verifier.module,
        _grade_name(verifier),
        repr(sorted(dict(verifier.params).items())),
        verifier.helpers,
        verifier.code,
    )
    with _AS_LOADED_LOCK:
        memo = _AS_LOADED.get(key)
        if memo is not None and memo[0] == loaded_code.version() and _unchanged(memo[1]):
            return memo[2]
        version = loaded_code.version()
        from_disk: set[str] = set()

        def locate(name: str) -> _Source | None:
            found = _as_loaded(name)
            if found is None:
                found = _on_disk(name)
                if found is not None:
                    from_disk.add(name)
            return found

        # what decides whether the memo still holds: the files of the closure's modules that
        # nothing here has imported (an imported module's bytes are fixed)
        watched: list[str] = []
        try:
            result, sources = _fingerprint(verifier, locate)
            watched = sorted(str(src.path) for n, src in sources.items() if n in from_disk)
        except _Unvouched:
            result = None
        _AS_LOADED[key] = (version, _stats(watched), result)
        return result


def _as_loaded(name: str) -> _Source | None:
    entry, conflict = loaded_code.lookup(name)
    if conflict:
        raise _Unvouched(name)
    if entry is not None:
        return _Source(Path(entry[0]).resolve(), entry[2])
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else None
    if path and loaded_code.is_recorded_path(str(path)):
        raise _Unvouched(name)  # it ran here, from bytes nobody recorded
    return None


def _stats(paths: Iterable[str]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((path, -1, -1))
        else:
            out.append((path, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _unchanged(stats: tuple[tuple[str, int, int], ...]) -> bool:
    return _stats(p for p, _, _ in stats) == stats


def _grade_name(verifier: Verifier) -> str:
    grade = verifier.grade
    # a function, or a callable object (an Inspect scorer's grader): named by its class
    qualname = getattr(grade, "__qualname__", None) or type(grade).__qualname__
    return f"{getattr(grade, '__module__', '')}:{qualname}"


def _fingerprint(
    verifier: Verifier, locate: _Locator
) -> tuple[VerifierFingerprint, dict[str, _Source]]:
    roots = [
        verifier.module,
        *verifier.code,
        *(m for preload in verifier.helpers for m in preload),
    ]
    sources, installed_roots = _module_closure(roots, locate)
    modules = {name: _facts(name, src) for name, src in sources.items()}
    project_tops = {name.split(".")[0] for name in sources} - {
        name.split(".")[0] for name in installed_roots
    }
    # a root module from an installed distribution (an Inspect built-in scorer, one of an
    # installed package) is its own code, hashed, plus that distribution's version
    third_party = _third_party_versions(
        [
            *installed_roots,
            *(
                imp
                for facts in modules.values()
                for imp in facts.imports
                if imp.split(".")[0] not in project_tops
            ),
        ]
    )
    try:
        params_json = json.dumps(dict(verifier.params), sort_keys=True, default=_reject)
    except TypeError as exc:
        raise ValueError(f"verifier {verifier.name!r}: parameters must be JSON ({exc})") from None
    grade_name = _grade_name(verifier)
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
    fp = VerifierFingerprint(
        name=verifier.name,
        digest=digest,
        label=verifier.label,
        source=source,
        params=json.loads(params_json),
        module=verifier.module,
        spec=_stored_spec(verifier, sources),
    )
    return fp, sources


def _stored_spec(verifier: Verifier, sources: dict[str, _Source]) -> dict[str, Any] | None:
    """What rebuilds the verifier in another command (verifiers.stored): its spec, the
    name it is stored under, and the sha256 of the file that defines it, so a file is only
    imported again while it holds the bytes that graded (a later edit needs the user's word)."""
    src = sources.get(verifier.module)
    if verifier.spec is not None:
        spec = dict(verifier.spec)
    elif verifier.module.split(".")[0] in _BUNDLED or src is None:
        return None  # gradebook's own verifiers are always loaded
    else:
        spec = {"kind": "module", "module": verifier.module, "file": str(src.path)}
    spec["stored_as"] = verifier.name
    if spec.get("kind") in ("file", "module") and src is not None:
        spec["sha256"] = hashlib.sha256(src.read()).hexdigest()
    return spec


_BUNDLED = ("scorers",)  # the package of gradebook's own verifiers


def _reject(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _module_closure(roots: list[str], locate: _Locator) -> tuple[dict[str, _Source], list[str]]:
    """The root modules and the project modules they import, transitively: name -> source;
    and the roots that live in an installed distribution (included, their imports not)."""
    found_roots = {name: locate(name) for name in dict.fromkeys(roots)}
    missing = [name for name, src in found_roots.items() if src is None]
    if missing:
        raise ValueError(
            f"verifier module {missing[0]!r} not found: is it importable from sys.path?"
        )
    installed = [
        name
        for name, src in found_roots.items()
        if src is not None and any(m in src.path.parts for m in ENV_DIRS)
    ]
    dirs = {_REPO_ROOT}
    for name in found_roots:
        if name in installed:
            continue
        top = locate(name.split(".")[0])
        if top is not None:
            path = top.path
            dirs.add(path.parent.parent if path.name == "__init__.py" else path.parent)
    found: dict[str, _Source] = {name: found_roots[name] for name in installed}  # type: ignore[misc]
    tops: dict[str, bool] = {}
    todo = list(reversed(found_roots))
    while todo:
        name = todo.pop()
        if name in found:
            continue
        top = name.split(".")[0]
        if top not in tops:
            tops[top] = _top_is_project(top, dirs)
        if not tops[top]:
            continue  # not project code: no need to look further (Inspect has hundreds)
        src = locate(name)
        if src is None or not _is_project(src.path, dirs):
            continue
        found[name] = src
        todo.extend(_facts(name, src).imports)
    return found, installed


def _on_disk(name: str) -> _Source | None:
    """The module's source file as a fresh import would find it (None: not a source module)."""
    spec = _find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return _Source(Path(spec.origin).resolve())


def _find_spec(name: str) -> Any:
    """`importlib.util.find_spec` without its side effect: that imports the parent package of
    a dotted name, and a grading worker must not load Inspect (or run any module) just to learn
    that `inspect_ai.scorer` is not project code."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    parent = name.rpartition(".")[0]
    path = None
    if parent:
        parent_spec = _find_spec(parent)
        if parent_spec is None or not parent_spec.submodule_search_locations:
            return None
        path = list(parent_spec.submodule_search_locations)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path, None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


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


def _facts(name: str, src: _Source) -> _ModuleFacts:
    data, path = src.read(), src.path
    key = (name, hashlib.sha256(data).hexdigest())
    cached = _FILE_CACHE.get(key) or _from_disk(key)
    if cached is not None:
        _FILE_CACHE[key] = cached
        return cached
    tree = ast.parse(data, filename=str(path))
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


def _from_disk(key: tuple[str, str]) -> _ModuleFacts | None:
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
                _disk().put_dists(installed)
            if known[dist] is not None:
                versions[dist] = known[dist]
    return versions


_INSTALLED: dict[str, Any] | None = None


def _installed() -> dict[str, Any]:
    """{"map": import name -> distributions, "versions": distribution -> version or None}.

    Scanning every installed distribution's metadata is slow. It is redone only when a
    sys.path directory says a distribution was installed or removed (checked on every call, so
    a long-running watcher sees an upgrade), and its result is shared through the disk cache.
    """
    global _INSTALLED
    stamp = sys_path_stamp()
    for known in (_INSTALLED, _disk().dists_for(stamp)):
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
    _disk().put_dists(_INSTALLED)
    return _INSTALLED
