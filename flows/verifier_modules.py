"""Loading the verifiers a user names, and saying how to load the ones a warehouse names.

A verifier exists in a process once the module that registers it is imported. The built-in
ones (`math`, `unit_tests`) always are; any other comes from a module the user names: a sweep
config's `verifier_modules`, or `--verifier-module` (repeatable; default from
`GRADEBOOK_VERIFIER_MODULES`, space-separated) on `score`, `rescore`, `verifiers`, `gate` and
`report`. Only those are imported: a module name found in a log or a warehouse is never
imported (both may come from elsewhere, and an import runs code). The warehouse records each
verifier's module (`verifiers.module`), and a command that meets a verifier it cannot load
names the exact flag instead.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "ENV",
    "ModulesOption",
    "VerifierLoadError",
    "how_to_load",
    "load_modules",
    "recorded_modules",
    "unknown_verifiers",
    "unloaded_verifiers",
]

ENV = "GRADEBOOK_VERIFIER_MODULES"

ModulesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--verifier-module",
        envvar=ENV,
        help="Import this module so the verifiers it registers exist (repeatable; env "
        f"{ENV}, space-separated). Only modules named here or in a config are imported.",
    ),
]


class VerifierLoadError(ValueError):
    """A verifier module could not be imported, or a verifier name is not loaded (one line)."""


def load_modules(modules: Iterable[str] | None, *, option: str = "--verifier-module") -> None:
    """Import the modules the user named; an entry `path/file.py@scorer` (or `file.py`) loads
    the Inspect scorer that file defines as a verifier (scorers.inspect_scorers.specs).

    Raises:
        VerifierLoadError: one of them cannot be imported (not found, or it raised).
    """
    for module in modules or []:
        from scorers.inspect_scorers.specs import SpecError, is_file_spec, resolve, spec_of

        if is_file_spec(module) or module.startswith("{"):
            # a scorer file, or a scorer spec as JSON (what `serve` hands its watcher for a
            # config's scorer with params)
            try:
                entry = json.loads(module) if module.startswith("{") else module
                resolve(spec_of(entry), trusted=True)
            except (SpecError, ValueError) as exc:
                raise VerifierLoadError(f"{option} {module}: {exc}") from None
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure of a user's module is reported
            why = str(exc).splitlines()[0] if str(exc) else ""
            raise VerifierLoadError(
                f"{option} {module}: cannot import it ({type(exc).__name__}: {why}); "
                "install it or put its directory on PYTHONPATH"
            ) from None


def recorded_modules(db: str | Path) -> dict[str, str | None]:
    """Every verifier the warehouse knows -> the module it records for it (None: none).

    Read only to be shown; empty when there is no readable warehouse.
    """
    import duckdb

    from warehouse import SchemaTooNew, Warehouse, WarehouseLocked
    from warehouse.verifier_modules import recorded_verifiers

    if not Path(db).exists():
        return {}
    try:
        with Warehouse(db).read() as con:
            return recorded_verifiers(con)
    except (SchemaTooNew, WarehouseLocked, OSError, duckdb.Error):
        return {}  # the command reports an unusable warehouse itself


def load_warehouse_scorers(db: str | Path) -> list[str]:
    """Register the Inspect scorers the warehouse records by registry name (built-in or from
    an installed package: resolving one imports no file a warehouse names), so `rescore`, the
    watcher, `gate` and `verifiers` check them as they check gradebook's own verifiers; a file
    scorer is only named (`how_to_load`). One that no longer resolves here (its package was
    uninstalled) stays unloaded and is reported as such.

    Returns:
        The names registered.
    """
    from scorers.inspect_scorers.specs import SpecError, resolve, spec_of
    from scorers.registry import all_verifiers

    loaded = []
    for name, spec in _recorded_specs(db).items():
        if spec.get("kind") != "registry" or name in all_verifiers():
            continue
        try:
            loaded.append(resolve(spec_of(spec), trusted=False).name)
        except (SpecError, ValueError):
            continue
    return loaded


def recorded_spec_entries(db: str | Path) -> list[dict]:
    """The Inspect scorer specs (registry kind) the warehouse records, as JSON entries."""
    return [s for s in _recorded_specs(db).values() if s.get("kind") == "registry"]


def _recorded_specs(db: str | Path) -> dict[str, dict]:
    import duckdb

    from warehouse import SchemaTooNew, Warehouse, WarehouseLocked
    from warehouse.verifier_modules import recorded_specs

    if not Path(db).exists():
        return {}
    try:
        with Warehouse(db).read() as con:
            return recorded_specs(con)
    except (SchemaTooNew, WarehouseLocked, OSError, duckdb.Error):
        return {}


def how_to_load(
    name: str, recorded: dict[str, str | None], specs: dict[str, dict] | None = None
) -> str:
    """The fix for a verifier that is not loaded here, as the end of a one-line message."""
    spec = (specs or {}).get(name) or {}
    if spec.get("kind") == "file":
        return f"pass --verifier-module {spec.get('file')}@{spec.get('scorer')} (the scorer file)"
    if spec.get("kind") == "registry" and spec.get("roles"):
        return (
            f"it is the judge-graded scorer {spec.get('scorer')!r}, whose judge gradebook calls "
            "only on your word: pass --verifier-module with its spec (JSON, from "
            f"`gradebook sql \"SELECT spec FROM verifiers WHERE name = '{name}'\"`)"
        )
    if spec.get("kind") == "registry":
        return (
            f"it is the Inspect scorer {spec.get('scorer')!r}, which does not resolve here: "
            "install the package that defines it"
        )
    if spec.get("kind") == "recorded":
        return (
            "its scores were recorded in logs by Inspect: grade them here with "
            "`gradebook score LOG` (the task's own scorers) or --verifier NAME"
        )
    module = recorded.get(name)
    if module:
        return (
            f"pass --verifier-module {module} (the module the warehouse records for it) "
            f"or set {ENV}"
        )
    return f"pass --verifier-module MODULE, the module that registers {name!r}"


def unknown_verifiers(names: Sequence[str], db: str | Path) -> str | None:
    """None when every name is a loaded verifier; else one line naming the first unknown one
    and how to load it."""
    from scorers.registry import all_verifiers

    known = all_verifiers()
    unknown = [n for n in dict.fromkeys(names) if n not in known]
    if not unknown:
        return None
    recorded = recorded_modules(db)
    name = unknown[0]
    more = f" (and {', '.join(repr(n) for n in unknown[1:])})" if len(unknown) > 1 else ""
    return (
        f"unknown verifier {name!r}{more}: {how_to_load(name, recorded, _recorded_specs(db))}; "
        f"loaded verifiers: {', '.join(sorted(known)) or 'none'}"
    )


def unloaded_verifiers(db: str | Path) -> dict[str, str]:
    """Verifiers the warehouse has fingerprints or scores of that are not loaded here ->
    how to load each (the end of a one-line message)."""
    from scorers.registry import all_verifiers
    from warehouse.score_values import DICT_KEY_SEP

    recorded = recorded_modules(db)
    specs = _recorded_specs(db)
    known = all_verifiers()
    return {
        n: how_to_load(n, recorded, specs)
        for n in sorted(recorded)
        # a dict-valued scorer's `<scorer>:<key>` rows belong to their scorer
        if n not in known and n.split(DICT_KEY_SEP, 1)[0] not in known
    }
