"""What the warm process an Inspect-scorer stage's grading workers fork from
(scorers.workers.pool `fork_from`) preloads: the workers' modules, the verifiers' code, and per
judge, Inspect's start-up hooks and the judge built once. When a command boots it is the
score flow's decision (flows.score_start). Light on purpose: nothing here imports Prefect or
Inspect.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from scorers.registry import Verifier
from scorers.workers.pool import PreloadEntry

__all__ = [
    "early_preload",
    "start_inspect",
    "warm_judges",
    "warm_preload",
    "worker_modules",
]


def warm_preload(verifiers: Sequence[Verifier]) -> list[PreloadEntry]:
    """The warm process's preload for these verifiers (empty: none is an Inspect scorer, the
    workers are started as interpreters): the modules the workers import, the code the
    verifiers grade with, and per judge, Inspect's start-up hooks and the judge built once
    (its provider's SDK imported)."""
    if not any(v.spec is not None for v in verifiers):
        return []
    preload: list[PreloadEntry] = [*worker_modules(verifiers)]
    preload += [m for v in verifiers for m in v.code]
    roles = {json.dumps(v.spec.get("roles"), sort_keys=True) for v in verifiers
             if v.spec and v.spec.get("roles")}  # fmt: skip
    if roles:
        preload += _start_inspect([v.spec for v in verifiers if v.spec is not None])
    preload += [("scorers.workers.prewarm", "warm_judges", (r,)) for r in sorted(roles)]
    return preload


def _start_inspect(specs: Sequence[dict]) -> list[PreloadEntry]:
    """The warm-up that runs Inspect's start-up hooks with only the entry points these Inspect
    scorer specs need (`start_inspect`), before the judges are built; none (the judges' own
    warm-up loads them all, as Inspect does) when a spec is a file's scorer, whose imports
    nobody knows before it runs."""
    names = []
    for spec in specs:
        scorer = spec.get("scorer")
        if (
            not isinstance(scorer, str)
            or spec.get("file")
            or "@" in scorer
            or scorer.endswith(".py")
        ):
            return []
        names.append(scorer)
    return [("scorers.workers.prewarm", "start_inspect", (json.dumps(sorted(set(names))),))]


def early_preload(entries: Iterable[str] | None) -> list[PreloadEntry]:
    """A warm process's preload from the command line alone, before any verifier is resolved
    (resolving one imports Inspect, seconds the warm process could spend booting): the judges
    of the Inspect scorer specs given as JSON, and Inspect itself for those and for scorer
    files. Empty when no entry is an Inspect scorer. The stage's pool adopts the process when
    its own preload (`warm_preload`) asks for the same judges (scorers.workers.pool `covers`)."""
    from scorers.inspect_scorers.specs import is_file_spec

    inspect_scorer = False
    roles: set[str] = set()
    specs: list[dict] = []
    for entry in entries or ():
        if is_file_spec(entry):
            inspect_scorer = True
            specs.append({"file": entry})
            continue
        if not entry.startswith("{"):
            continue
        try:
            spec = json.loads(entry)
        except ValueError:
            continue  # loading it says why
        if isinstance(spec, dict):
            inspect_scorer = True
            specs.append(spec)
            if spec.get("roles"):
                roles.add(json.dumps(spec["roles"], sort_keys=True))
    if not inspect_scorer:
        return []
    preload: list[PreloadEntry] = ["inspect_ai.scorer"]
    preload += ["scorers.inspect_scorers.judges"] if roles else []
    preload += _start_inspect(specs) if roles else []
    preload += [("scorers.workers.prewarm", "warm_judges", (r,)) for r in sorted(roles)]
    return preload


def start_inspect(scorers: str) -> None:
    """Inspect's start-up hooks with only the installed entry points the stage's scorers (JSON
    list of registry names) need (scorers.inspect_scorers.startup): the judges' warm-up then
    finds them run."""
    from scorers.inspect_scorers.startup import init_hooks_for

    init_hooks_for(json.loads(scorers))


def warm_judges(roles: str) -> None:
    """What a process's first judge call costs before it is made: Inspect's start-up hooks
    (scorers.inspect_scorers.judges.warm_up), and each judge of `roles` (JSON of a spec's
    roles) built once, so its provider's SDK is imported and the model database its first
    call reads is loaded (the model is dropped unused). Here, not in the judges module: that
    one is graded code, in every Inspect scorer's fingerprint."""
    from scorers.inspect_scorers.judges import build_judges, warm_up

    warm_up()
    try:
        for model in build_judges(json.loads(roles)).values():
            model.api.model_family()
    except Exception:  # noqa: BLE001, S110 - a judge that cannot be built says so per sample
        pass


def worker_modules(verifiers: Sequence[Verifier]) -> list[str]:
    """What each grading worker imports up front (a judge scorer's: the judges module too,
    whose `warm_up` the worker runs)."""
    judged = any((v.spec or {}).get("roles") for v in verifiers)
    return [v.module for v in verifiers] + (["scorers.inspect_scorers.judges"] if judged else [])
