"""Inspect scorers as gradebook verifiers: what a spec names, and resolving it safely.

A `verifiers` entry (or `--verifier`) that is not a gradebook verifier name is an Inspect
scorer spec:

- a registry name, with params: `match`, `choice`, `includes`, `exact`, `f1`,
  `model_graded_qa`, `inspect_ai/math`, or a scorer of an installed package
  (`inspect_evals/<scorer>`, found through the package's Inspect entry point);
- `path/file.py@scorer_name`: the @scorer of that name defined in a file.

In a config an entry may also be a table `{scorer = "...", params = {...}, name = "..."}`.

Trust: a log or a warehouse may come from elsewhere, and Inspect's own re-scoring imports the
task file a log names. Here built-in and installed-package scorers are resolved by registry name
only (gradebook's own among them: the bundled tasks' scorers, which its Inspect entry point
registers), and a file is imported only when the user gave its path (a config, `--verifier`,
`--verifier-module`, a task file the user's config names, or a spec the user's own command
stored and sealed, which verifiers.stored resolves as trusted): `resolve(...,
trusted=False)` refuses a file spec that this process has not already loaded for the user. A
file spec naming a module of installed code (scorers.inspect_scorers.installed: gradebook's own
scorers, an installed Inspect extension's) is not a file to import: it resolves as that
module's registry scorer, imported by module name, whoever named it.

A spec becomes a registered `Verifier` (scorers.registry) named like Inspect names the scorer's
scores in a log (its unqualified registry name: `match`, `aime_scorer`; `inspect_ai/math` for a
scorer named like one of gradebook's own verifiers), followed by its params when it has any
(`match[numeric=true]`: scorers.inspect_scorers.names.variant_name), or the spec's `name`: one name
per variant, the same in every command. The verifier's
fingerprint covers the scorer's code (a file's AST and the project modules it imports, or an
installed module's AST and its distribution's version), gradebook's TaskState rebuild and
value conversion (and so the inspect_ai version), and the params.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scorers.inspect_scorers import installed, judges, sandboxed
from scorers.inspect_scorers.factories import (
    TRUSTED_FILES,
    ScorerSpec,
    SpecError,
    resolve_factory,
)
from scorers.inspect_scorers.names import stored_name, variant_name
from scorers.registry import Verifier, all_verifiers, register

__all__ = [
    "GRADER_MODULE",
    "did_you_mean",
    "ScorerSpec",
    "SpecError",
    "inspect_verifier_specs",
    "installed_form",
    "is_file_spec",
    "parse_entry",
    "resolve",
    "spec_of",
    "task_scorer_specs",
    "with_roles",
    "log_scorer_specs",
]

# what rebuilds the TaskState, runs the scorer and converts its Score (fingerprinted with it;
# the grader loads the conversion by name, see scorers.inspect_scorers.grading)
GRADER_MODULE = "scorers.inspect_scorers.grading"
CONVERSION_MODULE = "warehouse.score_values"


def is_file_spec(text: str) -> bool:
    """Whether a string names a file (`path.py` or `path.py@name`)."""
    file, sep, _ = text.rpartition("@")
    return text.endswith(".py") or bool(sep and file.endswith(".py"))


def _split_file(text: str) -> tuple[str, str | None]:
    if text.endswith(".py"):
        return text, None
    file, _, name = text.rpartition("@")
    return file, name or None


def parse_entry(entry: str | Mapping[str, Any], *, base: Path | None = None) -> str | ScorerSpec:
    """A `verifiers` entry: a gradebook verifier's name (returned as it is) or a ScorerSpec.

    Args:
        entry: "math", "match", "path/file.py@name", or {scorer, params, name}.
        base: where a relative file is looked for first (a config's directory); then the
            current directory.

    Raises:
        SpecError: a malformed entry, or a file that does not exist.
    """
    if isinstance(entry, Mapping):
        unknown = sorted(set(entry) - {"scorer", "params", "name"})
        if unknown or not isinstance(entry.get("scorer"), str):
            raise SpecError(
                f'verifier {dict(entry)!r}: a table takes scorer = "NAME" (required), '
                f'params = {{...}} and name = "..."'
                + (f"; unknown key(s) {unknown}" if unknown else "")
            )
        params = entry.get("params") or {}
        if not isinstance(params, Mapping):
            raise SpecError(f"verifier {entry['scorer']!r}: params must be a table")
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise SpecError(f"verifier {entry['scorer']!r}: name must be a non-empty string")
        text, params, name = entry["scorer"].strip(), dict(params), name
    else:
        text, params, name = str(entry).strip(), {}, None
        if not text:
            raise SpecError("empty verifier name: give a verifier or an Inspect scorer")
        if text in _gradebook_names():
            return text
    if is_file_spec(text):
        file, scorer = _split_file(text)
        path = _find_file(file, base)
        return ScorerSpec(scorer=scorer or "", params=params, file=str(path), name=name)
    return ScorerSpec(scorer=text, params=params, name=name)


def spec_of(entry: str | Mapping[str, Any], *, base: Path | None = None) -> str | ScorerSpec:
    """`parse_entry`, also for a resolved spec's JSON (`ScorerSpec.to_json()`, with "kind"):
    what a resolved config and a log's gradebook metadata hold."""
    if isinstance(entry, Mapping) and "kind" in entry:
        if entry.get("kind") not in ("registry", "file") or not isinstance(
            entry.get("scorer"), str
        ):
            raise SpecError(f"verifier {dict(entry)!r}: not an Inspect scorer spec")
        return ScorerSpec.from_json(entry)
    return parse_entry(entry, base=base)


def _find_file(file: str, base: Path | None) -> Path:
    candidates = [Path(file)] if Path(file).is_absolute() else []
    if not candidates:
        if base is not None:
            candidates.append(base / file)
        candidates.append(Path.cwd() / file)
    for path in candidates:
        if path.is_file():
            return path.resolve()
    raise SpecError(f"scorer file {file!r} not found; give the path of a .py file (FILE@scorer)")


def _gradebook_names() -> set[str]:
    """Verifier names registered by gradebook itself or a --verifier-module (not Inspect
    scorers registered from a spec)."""
    return {n for n, v in all_verifiers().items() if v.spec is None}


# -- resolution -------------------------------------------------------------------------------

_BY_KEY: dict[str, Verifier] = {}  # spec key -> the verifier it registered (this process)


def resolve(spec: str | ScorerSpec, *, trusted: bool) -> Verifier:
    """The registered Verifier a spec stands for (registering it on first use).

    Args:
        spec: a gradebook verifier name or a ScorerSpec.
        trusted: the user gave this spec (a config, a flag): a file spec may be imported.
            False for a spec read from a log or a warehouse: only built-in and installed
            scorers by registry name, and files this process already loaded for the user.

    Raises:
        SpecError: one line: unknown scorer, package not installed, file not given by the
            user, no such @scorer in the file, bad params, or a name clash.
    """
    if isinstance(spec, str):
        found = all_verifiers().get(spec)
        if found is not None:
            return found
        spec = ScorerSpec(scorer=spec)
    spec = installed_form(spec)
    key = spec.key()
    known = _BY_KEY.get(key)
    if known is not None:
        return known
    if not spec.roles or not trusted:
        # a judge scorer named bare (`--verifier model_graded_qa`), or by a log or warehouse,
        # is the one the user bound a judge to here (a config's, or --model-role's)
        bare = spec.key(roles=False)
        for found in all_verifiers().values():
            if found.spec and found.spec.get("roles"):
                if ScorerSpec.from_json(found.spec).key(roles=False) == bare:
                    return found
    if spec.file and not trusted and spec.file not in TRUSTED_FILES:
        raise SpecError(
            f"scorer {spec.scorer!r} is defined in {spec.file}, which gradebook never imports "
            f"because a log or warehouse names it: pass --verifier-module {spec.file}@{spec.scorer}"
        )
    spec = _qualified(spec)
    try:
        factory, registry_name, module = resolve_factory(spec)
    except SpecError as exc:
        # the close names, added here: the factories module is in every Inspect scorer's
        # fingerprint, and a better error line must not re-grade (or re-judge) anything
        unknown = f"unknown verifier {spec.scorer!r}"
        text = str(exc)
        if not spec.file and text.startswith(unknown + ":"):
            raise SpecError(unknown + did_you_mean(spec.scorer) + text[len(unknown) :]) from None
        raise
    except (SystemExit, KeyboardInterrupt) as exc:  # a scorer file that exits at import
        raised = " ".join(f"{type(exc).__name__}: {exc}".split()).removesuffix(":")
        raise SpecError(f"importing {spec.file} raised {raised}; fix the file") from None
    _check_roles(spec, factory, registry_name, trusted=trusted)
    try:
        factory(**dict(spec.params))
    except TypeError as exc:
        raise SpecError(f"scorer {spec.shown()}: bad params ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - a factory that fails on its params is bad input
        raise SpecError(
            f"scorer {spec.shown()}: creating it raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
        ) from None
    try:
        json.dumps(dict(spec.params))
    except TypeError:
        raise SpecError(f"scorer {spec.shown()}: params must be JSON values") from None
    if spec.file is None:
        spec = ScorerSpec(spec.scorer, spec.params, None, spec.name, module, spec.roles)
    name = spec.name or _stored_name(registry_name, spec.params)
    clash = all_verifiers().get(name)
    if clash is not None and (clash.spec is None or clash.spec != spec.to_json()):
        what = "a gradebook verifier" if clash.spec is None else "another scorer spec"
        raise SpecError(
            f"scorer {spec.shown()}: its scores would be stored as {name!r}, the name of "
            f"{what} here; give it another name (a table: {{scorer = {spec.scorer!r}, "
            f'name = "..."}})'
        )
    from scorers.inspect_scorers.grading import InspectGrade

    # a scorer calling sandbox() is graded in a restored container: its image and limits, and
    # the restore code, are part of what it is (scorers.inspect_scorers.sandboxed)
    box = sandboxed.sandbox_spec() if sandboxed.uses_sandbox(module) else None
    verifier = Verifier(
        name=name,
        grade=InspectGrade(json.dumps(spec.to_json(), sort_keys=True)),
        module=module,
        params={
            "scorer": registry_name,
            "params": dict(spec.params),
            **({"judge": judges.identity(spec.roles)} if spec.roles else {}),
            **({"sandbox": box} if box else {}),
        },
        label=f"Inspect scorer {registry_name}",
        code=(GRADER_MODULE, CONVERSION_MODULE, *((sandboxed.RESTORE_MODULE,) if box else ())),
        reads_state=True,
        spec=spec.to_json(),
    )
    register(verifier)
    _BY_KEY[key] = verifier
    return verifier


def with_roles(
    spec: str | ScorerSpec, roles: Mapping[str, Any], *, rebind: bool = False
) -> str | ScorerSpec:
    """The spec with the config's grader bound, when it is a judge scorer that has none, or
    with `rebind` in place of the one it has (`roles`: role name -> binding JSON, as
    `RoleModel.to_json()`); else the spec itself. A user's spec only: a file spec is imported
    to find out.

    Raises:
        SpecError: as `resolve`.
    """
    if isinstance(spec, str) or judges.GRADER not in roles or (spec.roles and not rebind):
        return spec
    if not spec.roles:
        spec = installed_form(spec)
        factory, registry_name, _ = resolve_factory(_qualified(spec))
        if not judges.needs_grader(factory, registry_name, spec.params):
            return spec
    return ScorerSpec(spec.scorer, spec.params, spec.file, spec.name, spec.module,
                      {judges.GRADER: dict(roles[judges.GRADER])})  # fmt: skip


_TRUSTED_ROLES: set[str] = set()  # role bindings the user gave this process (JSON)


def _check_roles(spec: ScorerSpec, factory: Any, registry_name: str, *, trusted: bool) -> None:
    """A judge scorer has its grader bound; a binding a log or warehouse names (a URL the
    judge's API key would be sent to) is used only when the user gave the same one here."""
    if judges.needs_grader(factory, registry_name, spec.params) and judges.GRADER not in (
        spec.roles or {}
    ):
        raise SpecError(
            f"scorer {spec.shown()} grades with a judge and no grader model is given: add "
            '[model_roles.grader] model = "..." to the config, or pass --model-role '
            "grader=MODEL; gradebook never grades with the model under test"
        )
    for name, role in (spec.roles or {}).items():
        if not isinstance(role, Mapping) or not isinstance(role.get("model"), str):
            raise SpecError(f"scorer {spec.shown()}: role {name!r} needs a model string")
        key = json.dumps({name: dict(role)}, sort_keys=True, default=str)
        if trusted:
            _TRUSTED_ROLES.add(key)
        elif key not in _TRUSTED_ROLES:
            raise SpecError(
                f"scorer {spec.shown()} grades with the judge {role['model']} at "
                f"{role.get('base_url') or 'its default URL'}, named by a log or warehouse, "
                "which gradebook never calls on their word: pass the spec with its judge as "
                "--verifier-module (`gradebook serve` passes its config's)"
            )


def _stored_name(registry_name: str, params: Mapping[str, Any]) -> str:
    """Its unqualified registry name, with its params when it has any (`match[numeric=true]`):
    the same name in every command for the same spec, and never one name for two variants."""
    return variant_name(stored_name(registry_name.rsplit("/", 1)[-1], registry_name), params)


def _qualified(spec: ScorerSpec) -> ScorerSpec:
    """A registry spec as Inspect's registry knows it, its scorer registered: the module it
    names imported when that is installed code (gradebook's own scorers, an installed
    package's); else every installed package's Inspect entry point loaded (gradebook's own
    registers the bundled tasks' scorers). A spec named without its package
    (`class_eval_scorer`) and not an Inspect built-in is the scorer of that name of the one
    installed package that provides it (as Inspect finds `inspect_evals/NAME`).

    Raises:
        SpecError: several installed packages provide a scorer of that name.
    """
    if spec.file or not spec.scorer:
        return spec
    import inspect_ai.scorer  # noqa: F401 - registers the built-ins: found without entry points
    from inspect_ai._util.entrypoints import ensure_entry_points
    from inspect_ai._util.registry import registry_find, registry_info, registry_lookup

    installed.import_installed(spec.module)
    if registry_lookup("scorer", spec.scorer) is not None:
        return spec
    if "/" not in spec.scorer:
        installed.import_own()
        if registry_lookup("scorer", spec.scorer) is not None:
            return spec
        known = installed.known_scorer_names()
        if known is not None and spec.scorer not in {n.rsplit("/", 1)[-1] for n in known}:
            # no installed package provides it (as their entry points said in this
            # environment): the lookup that follows says so now, without loading them all
            return spec
    ensure_entry_points()  # every installed package's Inspect entry point
    installed.remember_scorer_names()
    if "/" in spec.scorer or registry_lookup("scorer", spec.scorer) is not None:
        return spec
    found = sorted(
        {
            registry_info(o).name
            for o in registry_find(
                lambda info: (
                    info.type == "scorer"
                    and info.name.rsplit("/", 1)[-1] == spec.scorer
                    and "/" in info.name
                )
            )
        }
    )
    if len(found) > 1:
        raise SpecError(
            f"scorer {spec.scorer!r} is defined by several installed packages "
            f"({', '.join(found)}): name one of them"
        )
    if not found:
        return spec
    return ScorerSpec(found[0], spec.params, None, spec.name, None, spec.roles)


def installed_form(spec: ScorerSpec) -> ScorerSpec:
    """A file spec whose file is a module of installed code (scorers.inspect_scorers.installed)
    as the registry spec of the scorer that module defines: imported by module name, never by
    the path; the same verifier whoever named it (a config, a log, a warehouse) and wherever
    the log was made. Any other spec as it is.

    Raises:
        SpecError: the module defines no @scorer of that name, or importing it raised.
    """
    if not spec.file:
        return spec
    module = installed.module_name(spec.file)
    if module is None:
        return spec
    try:
        found = installed.scorer_in(module, spec.scorer)
    except Exception as exc:  # noqa: BLE001 - installed code that fails to import
        raise SpecError(
            f"scorer {spec.shown()}: importing {module} raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}; reinstall it"
        ) from None
    if found is None:
        raise SpecError(
            f"{spec.file} (module {module}) has no @scorer named {spec.scorer or '(one)'!r}; "
            "name one of its scorers after '@'"
        )
    return ScorerSpec(found[1], spec.params, None, spec.name, module, spec.roles)


def inspect_verifier_specs() -> dict[str, dict[str, Any]]:
    """The Inspect scorer verifiers registered here: name -> spec JSON."""
    return {n: dict(v.spec) for n, v in all_verifiers().items() if v.spec is not None}


def task_scorer_specs(task: Any) -> list[ScorerSpec]:
    """The specs of a Task's own scorers (a task the user's config names: a scorer defined in a
    file that is not installed code becomes a file spec of that file; one of gradebook's own,
    or of an installed package, a registry spec).

    Raises:
        SpecError: a scorer that is not a registered @scorer, or whose params are not JSON.
    """
    import sys as _sys

    from inspect_ai._util.registry import is_registry_object, registry_info, registry_params

    from scorers.identity import loaded_code

    specs: list[ScorerSpec] = []
    used: list[str] = []
    for scorer in task.scorer or []:
        if not is_registry_object(scorer):
            raise SpecError(
                f"task {task.name}: a scorer is not a registered @scorer; list the task's "
                "scorers under verifiers"
            )
        info = registry_info(scorer)
        params = dict(registry_params(scorer))
        try:
            json.dumps(params)
        except TypeError:
            raise SpecError(
                f"task {task.name}: scorer {info.name} has params that are not JSON values; "
                "list it under verifiers with JSON params"
            ) from None
        module = _sys.modules.get(getattr(scorer, "__module__", "") or "")
        path = getattr(module, "__file__", None) if module is not None else None
        short = info.name.rsplit("/", 1)[-1]
        plain = _stored_name(info.name, params)
        name = _unique(plain, used)
        own = installed.module_name(str(path)) if path else None
        if path and own is None and loaded_code.is_recorded_path(str(path)):
            specs.append(ScorerSpec(short, params, file=str(Path(path).resolve()),
                                    name=name if name != plain else None))  # fmt: skip
        else:  # installed code, gradebook's own scorers among it: by registry name
            specs.append(ScorerSpec(info.name, params, name=name if name != plain else None,
                                    module=own))  # fmt: skip
    return specs


def log_scorer_specs(header: Any) -> list[ScorerSpec]:
    """The scorers a log says its task had, as `inspect score` resolves them
    (`inspect_ai._eval.score.resolve_scorers`): `eval.scorers` (name + options), else
    `results.scores` (name + params). Registry names only: a log never names a file to load."""
    found: list[tuple[str, dict[str, Any]]] = []
    if header.eval.scorers is not None:
        found = [(s.name, dict(s.options or {})) for s in header.eval.scorers]
    elif header.results is not None:
        seen = set()
        for score in header.results.scores:
            key = (score.scorer, json.dumps(score.params or {}, sort_keys=True, default=str))
            if key not in seen:  # a dict-valued scorer has one EvalScore per key
                seen.add(key)
                found.append((score.scorer, dict(score.params or {})))
    specs, used = [], []
    for scorer, options in found:
        plain = _stored_name(scorer, options)
        name = _unique(plain, used)  # the same scorer twice with the same params: `match1`
        specs.append(ScorerSpec(scorer, options, name=name if name != plain else None))
    return specs


def _unique(name: str, used: list[str]) -> str:
    """Inspect's name for the n-th scorer of one name in a task (`unique_scorer_name`)."""
    out, n = name, 1
    while out in used:
        out, n = f"{name}{n}", n + 1
    used.append(out)
    return out


def did_you_mean(name: str) -> str:
    """ " (did you mean 'math'?)": the known verifier and scorer names closest to `name` (the
    registry's, Inspect's scorers registered so far, and those the installed packages register
    here); empty when none is close."""
    import difflib

    from inspect_ai._util.registry import registry_find, registry_info

    known = set(all_verifiers())
    registered = [registry_info(o).name for o in registry_find(lambda i: i.type == "scorer")]
    for qualified in {*registered, *(installed.known_scorer_names() or ())}:
        if not qualified.rsplit("/", 1)[-1].startswith("_"):
            known.add(qualified.removeprefix("inspect_ai/"))
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
    # warehouse.error_text.did_you_mean words it the same; that floor is above this one
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
