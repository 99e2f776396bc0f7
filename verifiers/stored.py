"""Rebuilding the verifiers a warehouse has seen from the specs it stores, with no flags.

Every command that grades records the spec of each verifier it graded with
(`wh.verifier_specs`, warehouse.stored_specs): an Inspect scorer's registry name or file
and params, its judge roles (model, base URL, config, and the *names* of the environment
variables that hold keys), a user module's file; a file's sha256 beside it; sealed as this
user's (warehouse.spec_seal). `rescore`, `gate`, `report`, `verifiers`, `score` and the `serve`
watcher rebuild every one of them here, so none of them needs the flags the first command was
given.

The trust rule (a warehouse, like a log, may come from elsewhere, and a spec names code to
import and a judge to send a key to):

- a built-in or installed-package scorer by registry name, with no judge, is rebuilt from any
  warehouse: resolving it imports only installed code (as for a log's scorers);
- a judge scorer is rebuilt only from a spec this user sealed (a command of theirs graded with
  that judge here), and only with its key variables set;
- a scorer file or a user module is imported only from a sealed spec, and only while the file
  at that path holds the very bytes that graded (its sha256): an edit since, or a file put
  there by someone else, needs the user's word again (`--verifier-module`);
- a scorer file that is installed code (gradebook's own scorers, a module of an installed
  Inspect extension: scorers.inspect_scorers.installed) is not a file to import but the
  registry scorer of its module, rebuilt as an installed-package scorer is.

Anything else is not loaded, and the command says in one line exactly what to set or pass. A
verifier the user loads with a flag is never replaced by its stored spec; where the two differ,
the command says that the flag wins.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifiers.modules import ENV, recorded_modules
from warehouse.error_text import import_error

__all__ = [
    "Rebuilt",
    "how_to_load",
    "judge_entries",
    "rebuild",
    "reload_flags",
    "stored_specs",
    "unknown_verifiers",
    "unloaded",
]

_STORAGE_KEYS = ("stored_as", "sha256")  # what the warehouse adds to a verifier's own spec
_REBUILT: dict[str, dict[str, Any]] = {}  # name -> the stored spec it was rebuilt from (process)


@dataclass
class Rebuilt:
    """What `rebuild` did.

    Attributes:
        loaded: verifiers rebuilt from their stored specs by this call.
        missing: verifier -> what to set or pass to load it (the end of a one-line message).
        overridden: verifier -> a line saying the spec given here overrides the stored one.
    """

    loaded: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    overridden: dict[str, str] = field(default_factory=dict)


def stored_specs(db: str | Path) -> dict[str, Any]:
    """name -> its latest stored spec (warehouse.stored_specs.StoredSpec); empty when there
    is no readable warehouse (the command reports that itself)."""
    import duckdb

    from warehouse import SchemaTooNew, Warehouse, WarehouseLocked
    from warehouse.stored_specs import stored_specs as read

    if not Path(db).exists():
        return {}
    try:
        with Warehouse(db).read() as con:
            return read(con)
    except (SchemaTooNew, WarehouseLocked, OSError, duckdb.Error):
        return {}


def rebuild(db: str | Path) -> Rebuilt:
    """Register every verifier the warehouse stores a spec of that is not loaded here and that
    the trust rule allows (see the module's docstring). Cheap to call again: what is loaded is
    skipped."""
    from scorers.registry import all_verifiers

    out = Rebuilt()
    for name, stored in stored_specs(db).items():
        spec = _installed(stored.spec)
        kind = spec.get("kind")
        if kind not in ("registry", "file", "module"):
            continue  # a log's recorded scores, or a kind this gradebook does not know
        known = all_verifiers().get(name)
        if known is not None:
            if name not in _REBUILT:
                note = _override(name, known, spec)
                if note:
                    out.overridden[name] = note
            continue
        problem = _why_not(spec, stored.sealed)
        if problem is None:
            problem = _load(name, spec)
        if problem is None:
            _REBUILT[name] = spec
            out.loaded.append(name)
        else:
            out.missing[name] = problem
    return out


def _installed(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A stored file spec whose file is installed code as the registry spec it resolves to
    (scorers.inspect_scorers.specs.installed_form); any other spec as it is."""
    from scorers.inspect_scorers import installed
    from scorers.inspect_scorers.specs import ScorerSpec, SpecError, installed_form

    if spec.get("kind") != "file" or installed.module_name(str(spec.get("file") or "")) is None:
        return spec
    try:
        form = installed_form(ScorerSpec.from_json(_own(spec))).to_json()
    except (SpecError, KeyError, TypeError, ValueError):
        return spec  # resolving it says what is wrong
    return {**form, **{k: spec[k] for k in ("stored_as",) if k in spec}}


def _own(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A stored spec as the verifier's own (`Verifier.spec`), without what storage adds."""
    return {k: v for k, v in spec.items() if k not in _STORAGE_KEYS}


def _judges(spec: Mapping[str, Any]) -> dict[str, Any]:
    roles = spec.get("roles")
    return dict(roles) if isinstance(roles, Mapping) else {}


def _why_not(spec: Mapping[str, Any], sealed: bool) -> str | None:
    """Why a stored spec may not be rebuilt here (what to pass or set), or None."""
    from scorers.inspect_scorers.judge_roles import missing_credentials

    kind = spec.get("kind")
    where = str(spec.get("file") or "")
    if kind in ("file", "module") and not sealed:
        return (
            f"{_flag(spec)} (gradebook imports code a warehouse names only when your own "
            "command stored it here)"
        )
    if kind in ("file", "module"):
        if not Path(where).is_file():
            return f"its file {where} is gone: {_flag(spec, where='FILE.py')} where it is now"
        if _sha256(where) != spec.get("sha256"):
            return (
                f"{where} changed since it graded here: {_flag(spec)} to grade with it as it is now"
            )
    for role, binding in _judges(spec).items():
        if not isinstance(binding, Mapping) or not isinstance(binding.get("model"), str):
            return f"its {role} role is not a model: pass --model-role {role}=MODEL"
        if not sealed:
            return (
                f"its judge {binding['model']} at {binding.get('base_url') or 'its default URL'} "
                "is named by a warehouse your commands did not write, and gradebook never calls "
                f"a judge on a warehouse's word: pass --model-role {role}=MODEL"
            )
        missing = missing_credentials(binding)
        if missing:
            return (
                f"its judge {binding['model']} reads {' and '.join(missing)} from the "
                f"environment (the warehouse keeps only the name): export "
                + " ".join(f"{var}=..." for var in missing)
            )
    return None


def _flag(spec: Mapping[str, Any], *, where: str | None = None) -> str:
    if spec.get("kind") == "module":
        return f"pass --verifier-module {spec.get('module')} (its directory on PYTHONPATH)"
    if where is not None:
        return f"pass --verifier-module {where}@{spec.get('scorer')}"
    return f"pass --verifier-module {shlex.quote(_module_flag(spec))}"


def _module_flag(spec: Mapping[str, Any]) -> str:
    """The `--verifier-module` value that loads a stored file or module spec as its file is
    now: the module's name, `FILE.py@scorer`, or for a scorer with params, a name or a judge
    the spec itself as JSON (what `serve` hands its watcher, verifiers.specs.scorer_files)."""
    if spec.get("kind") == "module":
        return str(spec.get("module"))
    own = _own(spec)
    if own.get("params") or own.get("name") or own.get("roles"):
        return json.dumps(own, sort_keys=True)
    return f"{own.get('file')}@{own.get('scorer')}"


def reload_flags(db: str | Path, names: Iterable[str]) -> dict[str, str]:
    """For verifiers not loaded here, the `--verifier-module` value that loads each as its file
    is now (`_module_flag`), where a command may offer it ready to run: the spec was stored by
    this user's own command (sealed) and its file is still there. A spec from a warehouse
    another user wrote is left out: the command names its file, and the user decides."""
    specs = stored_specs(db)
    out = {}
    for name in names:
        stored = specs.get(name)
        if stored is None or not stored.sealed or stored.spec.get("kind") not in ("file", "module"):
            continue
        if Path(str(stored.spec.get("file") or "")).is_file():
            out[name] = _module_flag(stored.spec)
    return out


def _sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _load(name: str, spec: Mapping[str, Any]) -> str | None:
    """Register the verifier a stored spec names (trusted: `_why_not` said so); None when it
    is registered under `name`, else what to do."""
    from scorers.inspect_scorers.specs import SpecError, resolve, spec_of
    from scorers.registry import all_verifiers

    if spec.get("kind") == "module":
        problem = _import_module(str(spec.get("module")), str(spec.get("file")))
        if problem:
            return problem
    else:
        trusted = spec.get("kind") == "file" or bool(_judges(spec))
        own = _own(spec)
        if not own.get("name") and _default_name(own) != name:
            own["name"] = name  # stored under another name by an older gradebook: keep it
        try:
            resolve(spec_of(own), trusted=trusted)
        except (SpecError, ValueError) as exc:
            return f"{exc}".rstrip(".")
    if name not in all_verifiers():
        return _flag(spec) if spec.get("kind") != "registry" else "pass --verifier NAME"
    return None


def _default_name(spec: Mapping[str, Any]) -> str:
    """The name an Inspect scorer spec without a `name` is stored under today."""
    from scorers.inspect_scorers.names import stored_name, variant_name

    scorer = str(spec.get("scorer") or "")
    return variant_name(stored_name(scorer.rsplit("/", 1)[-1], scorer), spec.get("params"))


def _import_module(module: str, file: str) -> str | None:
    """Import a user's verifier module from the file that graded (sealed and unchanged): by its
    name where `sys.path` finds it there, else with its root directory appended to `sys.path`
    (appended: nothing the process already imports is shadowed)."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    origin = getattr(found, "origin", None)
    if found is not None and (not origin or Path(origin).resolve() != Path(file).resolve()):
        return (
            f"pass --verifier-module {module}: another {module} ({origin}) comes first on "
            f"sys.path than the one that graded ({file})"
        )
    if found is None:
        root = Path(file).resolve().parent
        for _ in range(module.count(".") + (Path(file).name == "__init__.py")):
            root = root.parent
        if str(root) not in sys.path:
            sys.path.append(str(root))
    try:
        importlib.import_module(module)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - sys.exit() too
        return f"pass --verifier-module {module} once it imports ({import_error(exc, file)})"
    return None


def _override(name: str, known: Any, stored: Mapping[str, Any]) -> str | None:
    """A line saying the spec this command was given for `name` wins over the stored one."""
    mine = known.spec
    if mine is None or stored.get("kind") == "module" or dict(mine) == _own(stored):
        return None
    return (
        f"verifier {name!r}: using the spec given here ({_describe(mine)}), not the one the "
        f"warehouse stores ({_describe(stored)})"
    )


def _describe(spec: Mapping[str, Any]) -> str:
    from scorers.inspect_scorers.specs import spec_of

    try:
        shown = spec_of(_own(spec)).shown()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a malformed stored spec is shown as it is
        shown = str(spec.get("scorer"))
    judges = [b.get("model") for b in _judges(spec).values() if isinstance(b, Mapping)]
    return shown + (f", judged by {', '.join(map(str, judges))}" if judges else "")


def unloaded(db: str | Path) -> dict[str, str]:
    """Verifiers the warehouse has fingerprints or scores of that are not loaded here, once
    everything that may be rebuilt is -> how to load each (the end of a one-line message)."""
    from scorers.registry import all_verifiers
    from warehouse.score_values import DICT_KEY_SEP

    missing = rebuild(db).missing
    recorded = recorded_modules(db)
    specs = {n: s.spec for n, s in stored_specs(db).items()}
    known = all_verifiers()
    return {
        n: missing.get(n) or how_to_load(n, recorded, specs)
        for n in sorted(recorded)
        # a dict-valued scorer's `<scorer>:<key>` rows belong to their scorer
        if n not in known and n.split(DICT_KEY_SEP, 1)[0] not in known
    }


def how_to_load(
    name: str, recorded: Mapping[str, str | None], specs: Mapping[str, dict] | None = None
) -> str:
    """The fix for a verifier that is not loaded here, as the end of a one-line message."""
    spec = (specs or {}).get(name) or {}
    if spec.get("kind") in ("file", "module"):
        return _flag(spec)
    if spec.get("kind") == "registry" and spec.get("roles"):
        return (
            f"it is the judge-graded scorer {spec.get('scorer')!r}: pass --model-role grader=MODEL"
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


def unknown_verifiers(names: list[str] | tuple[str, ...], db: str | Path) -> str | None:
    """None when every name is a loaded verifier; else one line naming the first unknown one
    and how to load it."""
    from scorers.registry import all_verifiers

    known = all_verifiers()
    unknown = [n for n in dict.fromkeys(names) if n not in known]
    if not unknown:
        return None
    name = unknown[0]
    fix = unloaded(db).get(name) or how_to_load(name, recorded_modules(db))
    more = f" (and {', '.join(repr(n) for n in unknown[1:])})" if len(unknown) > 1 else ""
    return (
        f"unknown verifier {name!r}{more}: {fix}; "
        f"loaded verifiers: {', '.join(sorted(known)) or 'none'}"
    )


def judge_entries(db: str | Path) -> list[dict]:
    """The judge-graded Inspect scorer specs the warehouse stores (what `--model-role` rebinds
    in `rescore`), as their own specs."""
    return [
        _own(s.spec)
        for s in stored_specs(db).values()
        if s.spec.get("kind") in ("registry",) and _judges(s.spec)
    ]
