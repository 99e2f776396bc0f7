"""The verifiers gradebook knows, by name.

The scoring stage, the re-scoring watcher and the fingerprinting all start here: a verifier is
a module-level (so picklable) function `SampleView -> Grade`, the module whose source defines
it (what the fingerprint hashes), its parameters and a human label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scorers.grade import Grade, SampleView


@dataclass(frozen=True)
class Verifier:
    """A registered verifier.

    Attributes:
        helpers: preload-module sets of the zygotes its grade function forks helper processes
            from (scorers.workers.bounded; math: `("scorers.math._symbolic",)`, which imports sympy). The
            scoring stage boots each once, as soon as it starts, and shares it with its workers.
        code: more modules whose code decides its verdicts, fingerprinted like `module` (an
            Inspect scorer: gradebook's TaskState rebuild and value conversion).
        reads_state: its grade function reads `SampleView.state` (the stored sample as Inspect's
            TaskState needs it), so the stage reads that from the warehouse too.
        spec: how to resolve it again in another process (JSON; an Inspect scorer's registry
            name and params, or its file), recorded with its fingerprint (`verifiers.spec`).
    """

    name: str
    grade: Callable[[SampleView], Grade]
    module: str
    params: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    helpers: tuple[tuple[str, ...], ...] = ()
    code: tuple[str, ...] = ()
    reads_state: bool = False
    spec: Mapping[str, Any] | None = None


_VERIFIERS: dict[str, Verifier] = {}


def register(verifier: Verifier) -> Verifier:
    _VERIFIERS[verifier.name] = verifier
    return verifier


def get_verifier(name: str) -> Verifier:
    _load_builtin()
    try:
        return _VERIFIERS[name]
    except KeyError:
        known = ", ".join(sorted(_VERIFIERS)) or "none"
        raise KeyError(f"unknown verifier {name!r}: known verifiers are {known}") from None


def all_verifiers() -> dict[str, Verifier]:
    _load_builtin()
    return dict(_VERIFIERS)


def _load_builtin() -> None:
    # Importing the verifier modules registers them; done lazily so importing the registry is
    # cheap and never pulls in Docker or sympy for a caller that needs neither.
    import importlib

    for module in ("scorers.math", "scorers.code"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
