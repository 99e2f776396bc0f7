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
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from warehouse.error_text import import_error, one_line, where_raised

__all__ = [
    "ENV",
    "ModulesOption",
    "VerifierLoadError",
    "load_modules",
    "recorded_modules",
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
                raise VerifierLoadError(f"{option} {module}: {_located(exc)}") from None
            continue
        try:
            importlib.import_module(module)
        # SystemExit and KeyboardInterrupt too: a module that calls sys.exit() at import must
        # not end the command silently with its code
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001
            if _not_found(exc, module):
                raise VerifierLoadError(
                    f"{option} {module}: cannot import it ({one_line(exc, 200)}); "
                    "install it or put its directory on PYTHONPATH"
                ) from None
            raise VerifierLoadError(
                f"{option} {module}: importing it raised {import_error(exc)}; fix the module"
            ) from None


def _not_found(exc: BaseException, module: str) -> bool:
    """The module itself (or a package above it) is not there, as opposed to its own code
    failing, an import inside it included."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return False
    parts = module.split(".")
    return exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}


def _located(exc: BaseException) -> str:
    """A scorer file's import failure (scorers.inspect_scorers.factories words it "importing
    FILE raised ...; fix the file") with the file:line that raised, read from the failure."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    where = where_raised(cause) if cause is not None and text.startswith("importing ") else None
    if where is None:
        return text
    head, sep, tail = text.rpartition("; fix the file")
    return f"{head} at {where}{sep}{tail}" if sep else f"{text} (at {where})"


def recorded_modules(db: str | Path) -> dict[str, str | None]:
    """Every verifier the warehouse knows -> the module it records for it (None: none).

    Read only to be shown; empty when there is no readable warehouse.
    """
    import duckdb

    from warehouse import SchemaTooNew, Warehouse, WarehouseLocked
    from warehouse.stored_specs import recorded_verifiers

    if not Path(db).exists():
        return {}
    try:
        with Warehouse(db).read() as con:
            return recorded_verifiers(con)
    except (SchemaTooNew, WarehouseLocked, OSError, duckdb.Error):
        return {}  # the command reports an unusable warehouse itself
