"""Which stored verifier specs this user's own commands wrote: a seal (HMAC) per spec.

Why: every command rebuilds the verifiers a warehouse has seen from the specs it stores
(verifiers.stored), but a warehouse (or a log) may come from elsewhere, and a spec names
code to import (`file.py@scorer`, a module) and a judge to send an API key to. A spec is
rebuilt without a flag only when its seal checks out: an HMAC-SHA256 of (verifier name, spec)
under a key that only this user can read, written with the spec by the command that graded
with it on the user's word (a config, a flag). Nobody without the key can forge one, so a
warehouse from elsewhere, or one whose rows someone edited, names its specs in vain: its file
and judge specs are only shown, with the flag that would load them.

The key is 32 random bytes in `$GRADEBOOK_STATE_DIR/spec-seal.key` (default
`$XDG_STATE_HOME/gradebook`, else `~/.local/state/gradebook`), mode 0600, created by the first
command that stores a spec. Without it (an unwritable home) specs are stored unsealed and every
command asks for the flags, as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENV", "KEY_FILE", "is_sealed", "key_path", "seal", "state_dir"]

ENV = "GRADEBOOK_STATE_DIR"
KEY_FILE = "spec-seal.key"
_KEY_BYTES = 32
_KEYS: dict[str, bytes] = {}  # key path -> key, once read in this process


def state_dir() -> Path:
    """The user's gradebook state directory (not the warehouse's: it must not travel with it)."""
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "gradebook"


def key_path() -> Path:
    return state_dir() / KEY_FILE


def _key(*, create: bool) -> bytes | None:
    path = key_path()
    cached = _KEYS.get(str(path))
    if cached is not None:
        return cached
    key = _read(path)
    if key is None and create:
        key = _create(path)
    if key is not None:
        _KEYS[str(path)] = key
    return key


def _read(path: Path) -> bytes | None:
    try:
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None  # another user's, or readable by others: vouches for nothing
        data = path.read_bytes()
    except OSError:
        return None
    return data if len(data) == _KEY_BYTES else None


def _create(path: Path) -> bytes | None:
    """Write a new key, atomically: two commands starting at once end up with the same one
    (the second finds the first's through the failed link)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(_KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another command made one first: use that
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    except OSError:
        return None
    return _read(path)


def _message(name: str, spec: Mapping[str, Any]) -> bytes:
    return json.dumps({"name": name, "spec": spec}, sort_keys=True, default=str).encode()


def seal(name: str, spec: Mapping[str, Any]) -> str | None:
    """The seal of a spec this user's command is storing (creating the key if need be); None
    when no key can be kept here."""
    key = _key(create=True)
    if key is None:
        return None
    return hmac.new(key, _message(name, spec), hashlib.sha256).hexdigest()


def is_sealed(name: str, spec: Mapping[str, Any], stored_seal: str | None) -> bool:
    """Whether `stored_seal` is this user's seal of (name, spec)."""
    if not stored_seal:
        return False
    key = _key(create=False)
    if key is None:
        return False
    expected = hmac.new(key, _message(name, spec), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, str(stored_seal))
