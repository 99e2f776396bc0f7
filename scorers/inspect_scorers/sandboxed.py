"""Which Inspect scorers use a sandbox, and the sandbox their fingerprint covers.

A scorer that calls Inspect's `sandbox()` grades in a container the scoring stage restores the
sample's workspace into (workspaces.restore). Its verdicts then depend on more than its code:
on the image that container runs and its limits, and on the restore code itself. So such a
scorer's verifier carries `sandbox_spec()` in its params and names the restore module among its
fingerprinted code: a rebuilt image (a new recipe tag, or GRADEBOOK_SANDBOX_IMAGE) or changed
limits re-score it, like an edit of its code does.

Which scorers: those whose module, or a module of the same package it imports, refers to
Inspect's `sandbox` (or `sandbox_with`), read from the source's syntax tree, never run.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["RESTORE_MODULE", "sandbox_spec", "uses_sandbox"]

RESTORE_MODULE = "workspaces.restore"  # fingerprinted with a sandbox scorer (named, not imported)
_NAMES = frozenset({"sandbox", "sandbox_with"})
_MAX_MODULES = 50  # of a package, read to find a sandbox call


def sandbox_spec() -> dict[str, Any]:
    """The sandbox a sandbox scorer's samples are restored into: gradebook's sandbox image and
    the sandbox pool's container limits."""
    from scorers.sandbox.image import image_tag
    from scorers.sandbox.pool import SandboxLimits

    return {"image": image_tag(), "limits": asdict(SandboxLimits())}


def _source(module: str) -> tuple[bytes, str] | None:
    """(the module's source, its file) for a module imported here or found on sys.path."""
    from scorers.identity import loaded_code

    found, _ = loaded_code.lookup(module)
    if found is not None:
        return found[2], found[0]
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None) if loaded is not None else None
    if path is None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None else None
    if not path or not str(path).endswith(".py"):
        return None
    try:
        return Path(path).read_bytes(), str(path)
    except OSError:
        return None


def _refers_to_sandbox(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inspect_ai.util"):
            if any(alias.name in _NAMES for alias in node.names):
                return True
        if isinstance(node, ast.Attribute) and node.attr in _NAMES:
            base = node.value
            if isinstance(base, ast.Name) and base.id == "util":
                return True
            if isinstance(base, ast.Attribute) and base.attr == "util":
                return True
    return False


def _package_imports(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    top = module.split(".")[0]
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == top]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name.split(".")[0] == top:
                out.append(name)
                out += [f"{name}.{a.name}" for a in node.names]
    return out


@cache
def uses_sandbox(module: str) -> bool:
    """Whether the scorer defined in `module` may call Inspect's `sandbox()`: that module, or
    a module of its own package it imports (transitively, up to 50), refers to it."""
    todo, seen = [module], set()
    while todo and len(seen) < _MAX_MODULES:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        found = _source(name)
        if found is None:
            continue
        try:
            tree = ast.parse(found[0], filename=found[1])
        except (SyntaxError, ValueError):
            continue
        if _refers_to_sandbox(tree):
            return True
        todo += _package_imports(tree, name, found[1].endswith("__init__.py"))
    return False
