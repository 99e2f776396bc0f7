"""Which verifiers score a task or a log, when they may be Inspect scorers.

A sweep task's `verifiers` are resolved by the config (sweeps.config); a task without them is
scored by its own scorers, read from the Task itself (the user's config names it, so a scorer
its file defines may be imported). A log scored later (`gradebook score LOG`) is scored by what
gradebook's generate stage recorded in its metadata, else by the scorers the log says its task
had (`eval.scorers`, else `results.scores`, as `inspect score` resolves them): built-in and
installed scorers by registry name only, never a file a log names. A log whose scorers cannot
be resolved is one line naming the log and what to pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.config import ConfigError, RoleModel, SweepConfig, TaskConfig, role_bindings

if TYPE_CHECKING:
    from scorers.registry import Verifier

__all__ = [
    "check_verifiers",
    "config_modules",
    "entries_for_log",
    "log_verifier_names",
    "names_for_entries",
    "scorer_files",
    "task_verifier_entries",
    "task_verifier_names",
    "verifiers_for",
]

_TASK_SCORERS: dict[str, list[Any]] = {}  # (task spec, args) -> the ScorerSpecs of its scorers


def names_for_entries(entries: Iterable[Any], *, trusted: bool) -> list[str]:
    """The registered verifier names of `verifiers` entries (resolving Inspect scorers).

    Raises:
        SpecError: an entry that cannot be resolved (one line).
    """
    from scorers.inspect_scorers.specs import resolve, spec_of

    return [resolve(spec_of(e), trusted=trusted).name for e in entries]


def _task_specs(task_cfg: TaskConfig) -> list[Any]:
    from scorers.inspect_scorers.specs import task_scorer_specs
    from sweeps.tasks import load_task

    key = json.dumps([task_cfg.task, task_cfg.args], sort_keys=True, default=str)
    if key not in _TASK_SCORERS:
        _TASK_SCORERS[key] = task_scorer_specs(load_task(task_cfg.task, task_cfg.args))
    return _TASK_SCORERS[key]


def task_verifier_entries(
    task_cfg: TaskConfig, roles: Mapping[str, RoleModel] | None = None
) -> list[Any]:
    """What scores a sweep task, as JSON entries (a gradebook name, or an Inspect scorer
    spec): what generate records in the log's metadata (`verifiers`). `roles`: the config's
    `model_roles`, bound to the task's own judge scorers (config `verifiers` have them bound
    when the config is loaded)."""
    if task_cfg.verifiers:
        return list(task_cfg.verifiers)
    from scorers.inspect_scorers.specs import resolve, with_roles

    bindings = role_bindings(roles)
    return [
        dict(resolve(with_roles(s, bindings), trusted=True).spec or {})
        for s in _task_specs(task_cfg)
    ]


def task_verifier_names(
    task_cfg: TaskConfig, roles: Mapping[str, RoleModel] | None = None
) -> list[str]:
    """The verifier names that score a sweep task (its own scorers when `verifiers` is empty)."""
    return names_for_entries(task_verifier_entries(task_cfg, roles), trusted=True)


def check_verifiers(cfg: SweepConfig) -> None:
    """Resolve every task's verifiers now (a task without `verifiers` is loaded to read its own
    scorers), so a scorer that cannot be used stops the sweep before any model call.

    Raises:
        ConfigError: one line naming the config, tasks[i] and the scorer.
    """
    from scorers.inspect_scorers.specs import SpecError

    for i, task_cfg in enumerate(cfg.tasks):
        try:
            names = task_verifier_names(task_cfg, cfg.model_roles)
        except SpecError as exc:
            raise ConfigError(
                f"{cfg.source or '<config>'}: tasks[{i}] ({task_cfg.task}): its own scorers: {exc}"
            ) from None
        if not names:
            raise ConfigError(
                f"{cfg.source or '<config>'}: tasks[{i}] ({task_cfg.task}): the task has no "
                "scorer and no verifiers are given; set verifiers = [...]"
            )


def entries_for_log(header: Any) -> list[Any]:
    """The verifiers a log asks for: gradebook's generate metadata, else the log's own
    scorers (`log_scorer_specs`, as JSON)."""
    from scorers.inspect_scorers.specs import log_scorer_specs

    recorded = (header.eval.metadata or {}).get("verifiers")
    if recorded:
        return list(recorded)
    return [s.to_json() for s in log_scorer_specs(header)]


def log_verifier_names(
    path: str | Path, modules: Mapping[str, str | None] | None = None
) -> list[str]:
    """The registered verifier names that score a log when none are given (untrusted: a file
    spec resolves only if this process already loaded it for the user).

    Args:
        path: the log.
        modules: verifier name -> the module a warehouse records for it
            (verifiers.modules.recorded_modules): a gradebook verifier the log names that
            is not loaded here is then reported with the flag that loads it.

    Raises:
        SpecError: "LOG: why", one line.
        warehouse.LogReadError: not a readable log.
    """
    from scorers.inspect_scorers.specs import SpecError
    from warehouse.logs import read_header

    header = read_header(str(path))
    entries = entries_for_log(header)
    if not entries:
        raise SpecError(
            f"{path}: the log names no scorer (no eval.scorers or results); pass --verifier NAME"
        )
    from scorers.registry import all_verifiers
    from verifiers.stored import how_to_load

    for entry in entries:
        if isinstance(entry, str) and entry in (modules or {}) and entry not in all_verifiers():
            raise SpecError(f"{path}: unknown verifier {entry!r}: {how_to_load(entry, modules)}")
    try:
        return names_for_entries(entries, trusted=False)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def log_problems(
    paths: Sequence[str | Path], modules: Mapping[str, str | None] | None = None
) -> tuple[list[str], list[str]]:
    """(verifier names, one line per log whose scorers cannot be resolved), for logs scored
    with no --verifier (`modules`: as `log_verifier_names`); unreadable logs are left for
    ingest to report."""
    from scorers.inspect_scorers.specs import SpecError

    names: list[str] = []
    problems: list[str] = []
    for path in paths:
        try:
            names += log_verifier_names(path, modules)
        except SpecError as exc:
            problems.append(str(exc))
        except Exception:  # noqa: BLE001, S112 - unreadable: ingest names it
            continue
    return list(dict.fromkeys(names)), problems


def scorer_files(cfg: SweepConfig) -> list[str]:
    """The Inspect scorer files a sweep's tasks are scored with, as `FILE.py@scorer` (what
    `--verifier-module` loads): a watcher process is given these, as it is given the config's
    `verifier_modules`, since it never imports a file the warehouse names."""
    out: list[str] = []
    for task_cfg in cfg.tasks:
        for entry in task_verifier_entries(task_cfg, cfg.model_roles):
            if isinstance(entry, dict) and entry.get("roles"):
                # a judge: the watcher calls it only on the user's word (its spec, here)
                out.append(json.dumps(entry, sort_keys=True))
            elif isinstance(entry, dict) and entry.get("kind") == "file":
                plain = not entry.get("params") and not entry.get("name")
                # with params or a name: the spec itself (JSON), which load_modules takes too
                out.append(
                    f"{entry['file']}@{entry['scorer']}"
                    if plain
                    else json.dumps(entry, sort_keys=True)
                )
    return list(dict.fromkeys(out))


def verifiers_for(logs: Sequence[str], verifiers: Iterable[str] | None) -> list[Verifier]:
    """The verifiers that will score `logs` (a warm-up hint: unknown names are skipped)."""
    from scorers.registry import get_verifier

    names: set[str] = set()
    if verifiers:
        try:
            names = set(names_for_entries(list(verifiers), trusted=True))
        except ValueError:
            return []  # the plan says why, with its own message
    else:
        for path in logs:
            try:
                names.update(log_verifier_names(path))
            except Exception:  # noqa: S112 - only a warm-up hint; ingest reports bad logs
                continue
    found = []
    for name in sorted(names):
        try:
            found.append(get_verifier(name))
        except KeyError:
            continue
    return found


def config_modules(cfg: SweepConfig) -> list[str]:
    """What loads every verifier a sweep config names, as `--verifier-module` values: its
    `verifier_modules`, then the scorer files (and judge specs) its tasks are scored with,
    their own scorers among them (`scorer_files`). What `serve` hands its watcher, and what
    `rescore --config` loads: the config is the user's own file, as trusted as a flag."""
    return list(dict.fromkeys([*cfg.verifier_modules, *scorer_files(cfg)]))
