"""The exact source every project module was compiled from in this process, and in its helpers.

A verifier's fingerprint must be that of the code that produced a verdict, not of the file as it
is now: a module imported before an edit keeps running the old code while its file already holds
the new one. So, once `install()` has run, every module loaded from a source file outside the
Python installation and its environments (the project, a user's verifier directory) is loaded by
`_RecordingLoader`, which reads the file's bytes once, records them, and runs exactly those bytes
(from a `.pyc` only when it is a hash-checked one of those very bytes, never from a
timestamp-checked one, which may belong to other bytes of the same size and second).
`scorers.identity.fingerprint.fingerprint_as_loaded` then hashes the recorded bytes.

Helper processes (the zygotes of `scorers.workers.zygote`, which run part of a verifier's code, e.g. the
math verifier's sympy comparisons) record their own imports and report them to the process that
uses them (`note_helper_sources`), so what they ran counts too. The same module loaded with
different bytes by this process and a helper, or by two helpers, is a conflict: nothing can
vouch for which code decided a verdict.

A fresh interpreter records from its first import when it starts with `boot_code()`: it loads
this very file by path, before the `scorers` package exists, so the package and this module are
recorded as well. `flows/__init__.py` does the same in every process that imports the flows.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import sysconfig
import threading
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "LoadedSource",
    "boot_code",
    "conflicts",
    "helper_sources",
    "install",
    "installed",
    "is_recorded_path",
    "load_file",
    "local_sources",
    "lookup",
    "note_helper_sources",
    "own_sources",
    "recorded_source",
    "version",
]

NAME = "scorers.identity.loaded_code"
_ENV_MARKERS = ("site-packages", "dist-packages")

# name -> (path, sha256 hex, bytes)
LoadedSource = tuple[str, str, bytes]

_LOCK = threading.Lock()
_LOCAL: dict[str, LoadedSource] = {}
_HELPERS: dict[str, LoadedSource] = {}
_CONFLICTS: set[str] = set()
_VERSION = [0]
_INSTALLED = [False]


def _system_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.realpath(d) + os.sep for d in dirs if d))


_SYSTEM = _system_dirs()


def is_recorded_path(path: str) -> bool:
    """Whether a module file is one whose code is recorded (not the interpreter's or an
    installed distribution's: those are covered by the fingerprint's version numbers)."""
    if not path.endswith(".py"):
        return False
    if any(f"{os.sep}{m}{os.sep}" in path for m in _ENV_MARKERS):
        return False
    real = os.path.realpath(path)
    return not any(real.startswith(d) for d in _SYSTEM)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record(name: str, path: str, data: bytes) -> None:
    with _LOCK:
        _LOCAL[name] = (path, _sha(data), data)
        _VERSION[0] += 1


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    """A source loader that runs exactly the bytes it records."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        data = self.get_data(path)
        _record(fullname, path, data)
        self.recorded_source = data  # read by scorers.sandbox.pool for the harness it ships
        return _code_of(self, data, path)

    def exec_module(self, module: Any) -> None:
        super().exec_module(module)
        # a submodule loaded by path before its package (this module, at boot) is not an
        # attribute of the package yet
        if getattr(module, "__path__", None) is not None:
            prefix = f"{module.__name__}."
            for key, sub in list(sys.modules.items()):
                child = key[len(prefix) :]
                # not hasattr: a package's module __getattr__ may import things
                if key.startswith(prefix) and "." not in child and child not in vars(module):
                    setattr(module, child, sub)


def _code_of(loader: _RecordingLoader, data: bytes, path: str) -> Any:
    """The code object of exactly `data`: a hash-checked `.pyc` of those bytes, else compiled."""
    try:
        cached = importlib.util.cache_from_source(path)
        with open(cached, "rb") as f:
            pyc = f.read()
    except (OSError, NotImplementedError, ValueError):
        cached, pyc = None, b""
    if (
        len(pyc) > 16
        and pyc[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(pyc[4:8], "little") & 0b1
        and pyc[8:16] == importlib.util.source_hash(data)
    ):
        try:
            return marshal.loads(memoryview(pyc)[16:])
        except (EOFError, ValueError, TypeError):
            pass
    code = loader.source_to_code(data, path)
    if cached is not None and not sys.dont_write_bytecode:
        # a checked-hash pyc (what `make install` writes), so the next process skips compiling
        header = importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little")
        try:
            loader.set_data(cached, header + importlib.util.source_hash(data) + marshal.dumps(code))
        except (OSError, NotImplementedError):
            pass
    return code


class _RecordingFinder:
    """Finds modules as the path finder does; source files outside the installation get the
    recording loader. Sits just before the path finder, so earlier finders (pytest's assertion
    rewriting, editable-install hooks) keep their modules."""

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if (
            spec is not None
            and type(spec.loader) is importlib.machinery.SourceFileLoader
            and spec.origin
            and is_recorded_path(spec.origin)
        ):
            spec.loader = _RecordingLoader(spec.loader.name, spec.loader.path)
        return spec

    @classmethod
    def invalidate_caches(cls) -> None:
        return None


def install(own_source: bytes | None = None) -> None:
    """Record every module loaded from now on (idempotent).

    Args:
        own_source: the bytes this module was compiled from, when it was loaded by path at boot
            (`boot_code()`); it is then recorded like any other module.
    """
    with _LOCK:
        if _INSTALLED[0]:
            return
        _INSTALLED[0] = True
    if own_source is not None:
        mod = sys.modules.get(NAME)
        _record(NAME, getattr(mod, "__file__", None) or __file__, own_source)
    position = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
        len(sys.meta_path),
    )
    sys.meta_path.insert(position, _RecordingFinder)


def installed() -> bool:
    return _INSTALLED[0]


def load_file(name: str, path: str) -> Any:
    """Import the source file `path` as module `name` through the recording loader (a user's
    file that is not on `sys.path` under that name: an Inspect scorer's `file.py@name`), so
    the bytes it runs are recorded like any project module's. Registered in `sys.modules`
    before it runs (dataclasses and pickling look modules up there); removed if it raises.
    """
    loader = _RecordingLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"{path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def boot_code() -> str:
    """Python source for the start of a fresh interpreter (`python -c`): load this file by path
    and install the recording, before anything imports `scorers`."""
    path = os.path.abspath(__file__)
    return (
        "import sys, importlib.util as _u\n"
        f"_p = {path!r}\n"
        "with open(_p, 'rb') as _f:\n"
        "    _d = _f.read()\n"
        f"_s = _u.spec_from_file_location({NAME!r}, _p)\n"
        "_m = _u.module_from_spec(_s)\n"
        "sys.modules[_s.name] = _m\n"
        "exec(compile(_d, _p, 'exec'), _m.__dict__)\n"
        "_m.install(_d)\n"
    )


def recorded_source(module: Any) -> bytes | None:
    """The bytes a module was compiled from, if it was loaded while recording."""
    return getattr(
        getattr(getattr(module, "__spec__", None), "loader", None), "recorded_source", None
    )


def local_sources() -> dict[str, LoadedSource]:
    """What this process compiled: name -> (path, sha256, bytes)."""
    with _LOCK:
        return dict(_LOCAL)


def own_sources() -> dict[str, tuple[str, bytes]]:
    """What this process compiled, as a helper reports it to its user: name -> (path, bytes)."""
    with _LOCK:
        return {name: (path, data) for name, (path, _, data) in _LOCAL.items()}


def note_helper_sources(sources: Mapping[str, tuple[str, bytes]] | None) -> None:
    """Record what a helper process this one uses compiled (its `own_sources()`)."""
    if not sources:
        return
    with _LOCK:
        for name, (path, data) in sources.items():
            entry = (path, _sha(data), data)
            known = _HELPERS.get(name)
            if known is not None and known[1] != entry[1]:
                _CONFLICTS.add(name)
            _HELPERS[name] = entry
        _VERSION[0] += 1


def helper_sources() -> dict[str, LoadedSource]:
    with _LOCK:
        return dict(_HELPERS)


def lookup(name: str) -> tuple[LoadedSource | None, bool]:
    """What this process or its helpers compiled for module `name` (None: neither did), and
    whether that is a conflict (different bytes here and in a helper, or in two helpers)."""
    with _LOCK:
        local, helper = _LOCAL.get(name), _HELPERS.get(name)
        conflict = name in _CONFLICTS or bool(local and helper and local[1] != helper[1])
        return local or helper, conflict


def conflicts(names: Iterable[str]) -> list[str]:
    """Of `names`, those loaded with different bytes by this process and its helpers (or by
    two helpers): the code that ran is not one version of them."""
    with _LOCK:
        out = []
        for name in names:
            local, helper = _LOCAL.get(name), _HELPERS.get(name)
            if name in _CONFLICTS or (local and helper and local[1] != helper[1]):
                out.append(name)
        return out


def version() -> int:
    """Changes whenever something new is recorded (a cheap "anything new?" check)."""
    return _VERSION[0]
