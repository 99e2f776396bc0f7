"""What the score command starts before its flow: the warm process its Inspect-scorer grading
workers fork from (scorers.workers.prewarm), booted as soon as the verifiers are known, so that
it imports Inspect while the command imports Prefect, starts its flow run and ingests. Light on
purpose: nothing here imports Prefect or Inspect, and a log's header is read without Inspect
(warehouse.zip_members, once per process).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scorers.workers.pool import DEFAULT_CHUNK, PreloadEntry, prewarm
from scorers.workers.prewarm import early_preload, warm_preload
from verifiers.specs import verifiers_for

__all__ = ["EARLY_START_CHUNKS", "expected_samples", "prewarm_for", "starts_early"]

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
