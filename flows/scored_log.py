"""Scored copies of logs, so `inspect view` shows gradebook's scores; the original is untouched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["check_scored_log_dir", "write_scored_logs"]


def check_scored_log_dir(logs: Sequence[str | Path], out_dir: Path) -> None:
    """Refuse an `out_dir` that would overwrite an original log (its copy has its name).

    Cheap, so a command checks it before scoring rather than after.

    Raises:
        ValueError: one line naming the dir and the log.
    """
    out = Path(out_dir).resolve()
    for path in logs:
        if Path(str(path)).resolve().parent == out:
            raise ValueError(
                f"{out_dir}: --scored-logs would overwrite the original log {path} (a scored "
                "copy keeps the log's name); pick another dir"
            )


def write_scored_logs(
    warehouse: str | Path,
    logs: Sequence[str | Path],
    out_dir: Path,
    problems: list[str] | None = None,
) -> list[Path]:
    """Write `out_dir/<log name>` for each log with the newest fingerprint's scores attached,
    and `results` (metrics per scorer) computed as `inspect score` computes them, so
    `inspect view` and `evals_df` show the headline metric.

    Each row becomes an Inspect `Score` (warehouse.score_values.to_inspect_score): an Inspect
    scorer's own value (C/I, a dict), Inspect's ScoreReason where one fits and gradebook's
    reason code in `metadata.gradebook_reason`. Recorded rows (the scores the log held) are
    not written back: the copy keeps the log's own scores beside gradebook's.

    A log Inspect's reader could not read within the ingest limits (warehouse.inflate: it
    inflates every member whole) gets no copy; one line in `problems` says so.

    Returns:
        The paths written.
    """
    from inspect_ai.log import read_eval_log, write_eval_log

    from warehouse import Warehouse
    from warehouse.inflate import InflateLimits, InflateRefused
    from warehouse.logs import check_for_inspect
    from warehouse.schema import RECORDED_PREFIX
    from warehouse.score_values import DICT_KEY_SEP, to_inspect_score

    check_scored_log_dir(logs, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    limits = InflateLimits.from_env()
    for path in logs:
        try:
            check_for_inspect(str(path), limits, lambda name: True)
        except InflateRefused as exc:
            if problems is not None:
                problems.append(f"{path}: no scored copy written: refused ({exc})")
            continue
        log = read_eval_log(str(path))
        with Warehouse(warehouse).read() as con:
            rows = con.execute(
                "SELECT sample_id, epoch, scorer, status, value, answer, explanation, reason, "
                "metadata::VARCHAR FROM latest_scores WHERE run_id = ? "
                "AND NOT starts_with(fingerprint, ?)",
                [log.eval.eval_id, RECORDED_PREFIX],
            ).fetchall()
        parents = {r[2] for r in rows}
        by_sample: dict[tuple[str, int], dict[str, Any]] = {}
        for sample_id, epoch, scorer, status, value, answer, explanation, reason, meta in rows:
            if DICT_KEY_SEP in scorer and scorer.split(DICT_KEY_SEP, 1)[0] in parents:
                continue  # a dict-valued score's key: the score itself carries the dict
            by_sample.setdefault((str(sample_id), int(epoch)), {})[scorer] = to_inspect_score(
                status, value, answer, explanation, reason, json.loads(meta or "{}")
            )
        for sample in log.samples or []:
            scores = by_sample.get((str(sample.id), int(sample.epoch)))
            if scores:
                sample.scores = {**(sample.scores or {}), **scores}
        if by_sample:
            _recompute_results(log, sorted({n for s in by_sample.values() for n in s}))
        target = out_dir / Path(str(path)).name
        write_eval_log(log, str(target))
        written.append(target)
    return written


def _recompute_results(log: Any, scorers: list[str]) -> None:
    """`log.eval.scorers` gains gradebook's scorers (with their metrics), then `results` is
    recomputed by Inspect's own `recompute_metrics`, as `inspect score` leaves a log."""
    from inspect_ai.log import recompute_metrics
    from inspect_ai.log._log import EvalScorer

    from scorers.registry import all_verifiers

    known = all_verifiers()
    ours = {name: _eval_scorer(name, known.get(name)) for name in scorers}
    kept = [s for s in (log.eval.scorers or []) if s.name not in ours]
    log.eval.scorers = [*kept, *ours.values()]
    # Inspect looks a metric it does not know up in the log's task file, importing it: a log
    # from elsewhere never makes gradebook import code, so such metrics are left out
    for scorer in log.eval.scorers:
        scorer.metrics = _known_metrics(scorer.metrics)
    if log.eval.metrics is not None:
        log.eval.metrics = _known_metrics(log.eval.metrics) or None
    try:
        recompute_metrics(log)
    except Exception:  # noqa: BLE001 - a log whose own metrics cannot be computed here
        log.eval.scorers = [EvalScorer(**s.model_dump()) for s in ours.values()]
        recompute_metrics(log)


_DEFAULT_METRICS = [{"name": "accuracy"}, {"name": "stderr"}]


def _eval_scorer(name: str, verifier: Any) -> Any:
    """The `eval.scorers` entry of one of gradebook's scorers: an Inspect scorer's own
    metrics and options; accuracy and stderr for gradebook's verifiers."""
    from inspect_ai.log._log import EvalScorer

    spec = getattr(verifier, "spec", None)
    if spec is not None:
        try:
            from inspect_ai._eval.task.log import resolve_eval_scorers
            from inspect_ai.scorer._scorer import as_scorer_spec

            scorer = verifier.grade.scorer()
            (entry,) = resolve_eval_scorers([as_scorer_spec(scorer)]) or []
            return EvalScorer(name=name, options=entry.options, metrics=entry.metrics,
                              metadata=entry.metadata)  # fmt: skip
        except Exception:  # noqa: BLE001, S110 - fall back to the default metrics
            pass
    params = dict(getattr(verifier, "params", {}) or {})
    return EvalScorer(name=name, options=params, metrics=_DEFAULT_METRICS)


def _known_metrics(metrics: Any) -> Any:
    from inspect_ai._util.registry import registry_lookup

    def ok(m: Any) -> bool:
        name = m.get("name") if isinstance(m, dict) else getattr(m, "name", None)
        return bool(name) and registry_lookup("metric", name) is not None

    if metrics is None:
        return None
    if isinstance(metrics, dict):
        return {k: [m for m in v if ok(m)] for k, v in metrics.items()}
    out = []
    for m in metrics:
        if isinstance(m, dict) and "name" not in m:
            out.append({k: [x for x in v if ok(x)] for k, v in m.items()})
        elif ok(m):
            out.append(m)
    return out
