"""What a scoring stage can start before it knows its plan: the warm process its Inspect-scorer
grading workers fork from (scorers.workers.pool `fork_from`), booted as soon as the verifiers are
known, so that it imports Inspect while the command imports Prefect, starts its flow run and
ingests. Light on purpose: nothing here imports Prefect or Inspect.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from scorers.registry import Verifier, get_verifier
from scorers.workers.pool import DEFAULT_CHUNK, PreloadEntry, prewarm

__all__ = [
    "EARLY_START_CHUNKS",
    "early_preload",
    "expected_samples",
    "prewarm_for",
    "starts_early",
    "verifiers_for",
    "warm_judges",
    "warm_preload",
    "worker_modules",
]

# logs of more samples than this many chunks: start the workers before the ingest
EARLY_START_CHUNKS = 2


def starts_early(logs: Sequence[str], preload: Sequence[PreloadEntry], chunk_size: int) -> bool:
    """Whether the stage starts its workers before the ingest, forked from a warm process
    booted at once (`prewarm_for`) when `preload` is not empty: for logs of more than
    EARLY_START_CHUNKS chunks, and for a judge at any size. A judge's start-up (Inspect's
    hooks, its provider's SDK: seconds of CPU) then runs beside the command's own (Prefect,
    the flow run, the ingest), and a small log's one chunk is graded by a worker forked from
    it (flows.score `stream_grades`), not after it in the command's process."""
    judged = any(isinstance(e, tuple) and e[1] == "warm_judges" for e in preload)
    return judged or expected_samples(logs) > EARLY_START_CHUNKS * chunk_size


def expected_samples(logs: Sequence[str]) -> int:
    """Samples the logs' headers announce (unreadable logs count 0: ingest reports them). A
    local `.eval` header is read without Inspect (warehouse.zip_members): this decides whether
    to boot a warm process, and waiting for Inspect's import first would delay that boot."""
    from warehouse.zip_members import header_json

    total = 0
    for path in logs:
        raw = header_json(str(path)) if str(path).endswith(".eval") else None
        try:
            if raw is not None:
                spec = raw.get("eval") or {}
                samples = (spec.get("dataset") or {}).get("samples") or 0
                epochs = (spec.get("config") or {}).get("epochs") or 1
            else:
                from warehouse.logs import read_header

                header = read_header(str(path)).eval
                samples, epochs = header.dataset.samples or 0, header.config.epochs or 1
            total += int(samples) * int(epochs)
        except Exception:  # noqa: S112 - an unreadable log is reported by ingest, with its name
            continue
    return total


def verifiers_for(logs: Sequence[str], verifiers: Iterable[str] | None) -> list[Verifier]:
    """The verifiers that will score `logs` (a warm-up hint: unknown names are skipped)."""
    from verifiers.specs import log_verifier_names, names_for_entries

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
    preload += [("scorers.workers.prewarm", "warm_judges", (r,)) for r in sorted(roles)]
    return preload


def early_preload(entries: Iterable[str] | None) -> list[PreloadEntry]:
    """A warm process's preload from the command line alone, before any verifier is resolved
    (resolving one imports Inspect, seconds the warm process could spend booting): the judges
    of the Inspect scorer specs given as JSON, and Inspect itself for those and for scorer
    files. Empty when no entry is an Inspect scorer. The stage's pool adopts the process when
    its own preload (`warm_preload`) asks for the same judges (scorers.workers.pool `covers`)."""
    from scorers.inspect_scorers.specs import is_file_spec

    inspect_scorer = False
    roles: set[str] = set()
    for entry in entries or ():
        if is_file_spec(entry):
            inspect_scorer = True
            continue
        if not entry.startswith("{"):
            continue
        try:
            spec = json.loads(entry)
        except ValueError:
            continue  # loading it says why
        if isinstance(spec, dict):
            inspect_scorer = True
            if spec.get("roles"):
                roles.add(json.dumps(spec["roles"], sort_keys=True))
    if not inspect_scorer:
        return []
    preload: list[PreloadEntry] = ["inspect_ai.scorer"]
    preload += ["scorers.inspect_scorers.judges"] if roles else []
    preload += [("scorers.workers.prewarm", "warm_judges", (r,)) for r in sorted(roles)]
    return preload


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


def prewarm_for(
    logs: Sequence[str],
    verifiers: Iterable[str] | None,
    chunk_size: int = DEFAULT_CHUNK,
    *,
    early: Iterable[str] | None = None,
) -> None:
    """Boot the warm process for the stage that will score `logs` now, in the background, when
    that stage will start its workers early (`starts_early`) and they fork.

    `early`: the command's `--verifier-module` entries, before any is loaded: boot from what
    they say alone (`early_preload`), or not at all when none is an Inspect scorer (called
    again once the verifiers are resolved, a boot already under way that serves them stands).
    """
    # decided without I/O first: a command with no Inspect scorer reads no header here
    preload = (
        early_preload(early) if early is not None else warm_preload(verifiers_for(logs, verifiers))
    )
    if preload and starts_early(logs, preload, chunk_size):
        prewarm(preload)
