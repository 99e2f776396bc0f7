"""The fingerprint's work saved on disk, so a new process does not parse every module again.

A fresh process (a `gradebook score` run, a Prefect worker's flow run) would otherwise spend most
of its first fingerprint parsing the verifier's modules and scanning every installed distribution for
the import-name -> distribution map. Both are saved here and reused while their inputs are
unchanged:

- per-module facts, keyed on (module name, sha256 of the module's bytes): an edited file gets a
  new key, and bytes seen before (an edit reverted) find theirs again;
- the distribution map and the versions looked up, keyed on the mtimes of the `sys.path`
  directories: installing or removing a distribution adds or removes an entry in one of them.
  One map is kept per environment (the newest few): every checkout of one user has its own
  virtualenv and shares this file, and a single map would be replaced by each checkout's
  commands in turn, so that each command of the other rescanned (seconds on a busy machine).

The file lives in `$GRADEBOOK_CACHE_DIR`, else `$XDG_CACHE_HOME/gradebook`, else
`~/.cache/gradebook`. It is a cache only: an unreadable, corrupt or foreign file is ignored and
rewritten, and a failed write is ignored; neither ever changes a digest or raises.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

_FORMAT = 3
_MAX_FILES = 2000  # the newest entries kept: every edit of a module adds one
_MAX_ENVS = 16  # the distribution maps kept: one per environment (virtualenv, sys.path)
# one file per format: a gradebook of another format sharing the directory (another checkout)
# would otherwise replace the file on every call, and each process would start cold
_FILE_NAME = f"fingerprint-{_FORMAT}.json"
ENV_DIRS = ("site-packages", "dist-packages")
_DIST_SUFFIXES = (".dist-info", ".egg-info")


def cache_dir() -> Path:
    """Where gradebook keeps caches (`GRADEBOOK_CACHE_DIR` > `XDG_CACHE_HOME` > ~/.cache)."""
    explicit = os.environ.get("GRADEBOOK_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "gradebook"


def _interpreter() -> str:
    # ast.dump's text differs between Python versions: a cache from another one is not reused
    return f"{sys.implementation.cache_tag} {sys.version}"


def sys_path_stamp() -> list[list[Any]]:
    """What changes when a distribution is installed or removed, per sys.path entry.

    An environment directory (site-packages) gets a new mtime when a distribution's metadata
    directory is added or removed. Any other directory (the working directory, a checkout on
    PYTHONPATH) changes mtime whenever a file is written in it, so for those the names of the
    distribution metadata directories they hold are compared instead; one that holds none adds
    nothing to the distribution map and is left out (a command run from a fresh working
    directory, which lands on sys.path, must not make every command rescan the environment).
    """
    stamp: list[list[Any]] = []
    for entry in sys.path:
        path = entry or "."
        try:
            if any(marker in Path(path).parts for marker in ENV_DIRS):
                stamp.append([entry, os.stat(path).st_mtime_ns])
            else:
                with os.scandir(path) as it:
                    names = sorted(e.name for e in it if e.name.endswith(_DIST_SUFFIXES))
                if names:
                    stamp.append([entry, names])
        except OSError:  # missing, a file (zip), unreadable: nothing that can change quietly
            stamp.append([entry, None])
    return stamp


class FingerprintCache:
    """The on-disk store: `files` (key -> facts dict) and `dists` (the distribution map)."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, Any]] = {}
        self.dists: list[dict[str, Any]] = []  # one per environment, newest last
        self._put: set[str] = set()  # the environments whose map this process saved
        self.dirty = False

    @classmethod
    def load(cls) -> FingerprintCache:
        cache = cls()
        try:
            data = json.loads((cache_dir() / _FILE_NAME).read_text(encoding="utf-8"))
            if data.get("format") != _FORMAT or data.get("interpreter") != _interpreter():
                return cache
            files, dists = data["files"], data.get("dists")
            if isinstance(files, dict):
                cache.files = files
            if isinstance(dists, list):
                cache.dists = [d for d in dists if isinstance(d, dict)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # missing or corrupt: start empty, the next save replaces it
        return cache

    def dists_for(self, stamp: list[list[Any]]) -> dict[str, Any] | None:
        """The distribution map saved for the environment whose `sys_path_stamp` is `stamp`."""
        return next((d for d in reversed(self.dists) if d.get("stamp") == stamp), None)

    def put_dists(self, entry: dict[str, Any]) -> None:
        """Keep `entry` (a map with its "stamp") as its environment's, the newest."""
        others = [d for d in self.dists if d.get("stamp") != entry.get("stamp")]
        self.dists = [*others, entry][-_MAX_ENVS:]
        self._put.add(_stamp_key(entry))
        self.dirty = True

    def save(self) -> None:
        """Write atomically (a reader sees the old file or the new one, never half of one),
        merged into what is on disk now: another environment's process may have saved its
        map since this one loaded, and must not lose it to this write."""
        if not self.dirty:
            return
        now = FingerprintCache.load()
        # the other environments' maps as they are on disk now, then the ones put here
        dists = [d for d in now.dists if _stamp_key(d) not in self._put]
        dists += [d for d in self.dists if _stamp_key(d) in self._put]
        data = {
            "format": _FORMAT,
            "interpreter": _interpreter(),
            "files": dict(list({**now.files, **self.files}.items())[-_MAX_FILES:]),
            "dists": dists[-_MAX_ENVS:],
        }
        directory = cache_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{_FILE_NAME}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f)
                os.replace(tmp, directory / _FILE_NAME)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            return  # a read-only home or a full disk only costs the next process the work
        self.dirty = False


def _stamp_key(entry: dict[str, Any]) -> str:
    return json.dumps(entry.get("stamp"))


def file_key(name: str, sha256: str) -> str:
    return f"{name}\0{sha256}"
