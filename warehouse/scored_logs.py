"""Scored copies of logs, so `inspect view` shows gradebook's scores; the original is untouched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["check_scored_log_dir", "write_scored_logs"]


def check_scored_log_dir(logs: Sequence[str | Path], out_dir: str | Path) -> None:
    """Refuse an `out_dir` that would overwrite an original log (its copy has its name).

    Cheap, so a command checks it before scoring rather than after.

    Raises:
        ValueError: one line naming the dir and the log.
    """
    from warehouse.object_store import is_url

    remote = is_url(out_dir)
    out = str(out_dir).rstrip("/") if remote else Path(out_dir).resolve()
    for path in logs:
        text = str(path)
        parent = (
            text.rsplit("/", 1)[0]
            if is_url(text)
            else None
            if remote
            else Path(text.removeprefix("file://")).resolve().parent
        )
        if parent == out:
            raise ValueError(
                f"{out_dir}: --scored-logs would overwrite the original log {path} (a scored "
                "copy keeps the log's name); pick another dir"
            )


def write_scored_logs(
    warehouse: str | Path,
    logs: Sequence[str | Path],
    out_dir: str | Path,
    problems: list[str] | None = None,
) -> list[str]:
    """Write `out_dir/<log name>` for each log with the newest fingerprint's scores attached,
    and `results` (metrics per scorer) computed as `inspect score` computes them, so
    `inspect view` and `evals_df` show the headline metric.

    Each row becomes an Inspect `Score` (warehouse.score_values.to_inspect_score): an Inspect
    scorer's own value (C/I, a dict), Inspect's ScoreReason where one fits and gradebook's
    reason code in `metadata.gradebook_reason`. Recorded rows (the scores the log held) are
    not written back: the copy keeps the log's own scores beside gradebook's.

    A log Inspect's reader could not read within the ingest limits (warehouse.inflate: it
    inflates every member whole) gets no copy; one line in `problems` says so.

    Names are the ones Inspect users know: a variant of one of the log's own scorers, stored as
    `match[numeric=true]`, is `match` in the copy, as in the log. gradebook's scorers come first
    in `results.scores`, whose first entry is the headline `inspect view` lists; a scorer the
    log names that never ran on it (a task's own scorer under `score=False`) is left out, so
    no NaN stands in its place.

    `out_dir` may be an object-store URL (`s3://…`): each copy is written to a local temporary
    file and then uploaded whole, so the prefix never holds half a log.

    Returns:
        The paths (or URLs) written.
    """
    from inspect_ai.log import read_eval_log, write_eval_log

    from warehouse import Warehouse
    from warehouse.inflate import InflateLimits, InflateRefused
    from warehouse.logs import LogReadError, check_for_inspect, local_log
    from warehouse.object_store import is_url
    from warehouse.recorded_scores import inspect_names
    from warehouse.schema import RECORDED_PREFIX
    from warehouse.score_values import DICT_KEY_SEP, to_inspect_score

    check_scored_log_dir(logs, out_dir)
    remote = is_url(out_dir)
    if not remote:
        out_dir = Path(str(out_dir).removeprefix("file://"))
        out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    limits = InflateLimits.from_env()
    for path in logs:
        try:
            local = local_log(str(path))  # a URL's copy, fetched once per command
            check_for_inspect(local, limits, lambda name: True)
        except InflateRefused as exc:
            if problems is not None:
                problems.append(f"{path}: no scored copy written: refused ({exc})")
            continue
        except LogReadError as exc:
            if problems is not None:
                problems.append(f"{path}: no scored copy written ({exc})")
            continue
        log = read_eval_log(local)
        with Warehouse(warehouse).read() as con:
            rows = con.execute(
                "SELECT sample_id, epoch, scorer, status, value, answer, explanation, reason, "
                "metadata::VARCHAR FROM latest_scores WHERE run_id = ? "
                "AND NOT starts_with(fingerprint, ?)",
                [log.eval.eval_id, RECORDED_PREFIX],
            ).fetchall()
        parents = {r[2] for r in rows}
        shown = _shown_names(parents, inspect_names(log))
        by_sample: dict[tuple[str, int], dict[str, Any]] = {}
        for sample_id, epoch, scorer, status, value, answer, explanation, reason, meta in rows:
            if DICT_KEY_SEP in scorer and scorer.split(DICT_KEY_SEP, 1)[0] in parents:
                continue  # a dict-valued score's key: the score itself carries the dict
            score = to_inspect_score(
                status, value, answer, explanation, reason, json.loads(meta or "{}")
            )
            by_sample.setdefault((str(sample_id), int(epoch)), {})[shown[scorer]] = score
        for sample in log.samples or []:
            scores = by_sample.get((str(sample.id), int(sample.epoch)))
            if scores:
                sample.scores = {**(sample.scores or {}), **scores}
        if by_sample:
            used = {name for scores in by_sample.values() for name in scores}
            _recompute_results(log, {shown[n]: n for n in sorted(parents) if shown[n] in used})
        name = str(path).rstrip("/").rsplit("/", 1)[-1]
        if remote:
            target = _upload(log, f"{str(out_dir).rstrip('/')}/{name}", problems)
            if target is not None:
                written.append(target)
            continue
        target = Path(out_dir) / name
        write_eval_log(log, str(target))
        written.append(str(target))
    return written


def _upload(log: Any, url: str, problems: list[str] | None) -> str | None:
    """Write `log` to a local temporary file, then put it at `url` in one upload: a reader of
    the prefix sees the old object or the new one, never half of one."""
    import tempfile

    from inspect_ai.log import write_eval_log

    from warehouse.log_spill import spill_dir
    from warehouse.object_store import filesystem, one_line_error

    spill = spill_dir()
    spill.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=spill, prefix=".upload-") as tmp:
        local = Path(tmp) / url.rsplit("/", 1)[-1]
        write_eval_log(log, str(local))
        try:
            filesystem(url).put_file(str(local), url)
        except Exception as exc:  # noqa: BLE001 - the store's fault, one line
            if problems is not None:
                problems.append(f"no scored copy written: {one_line_error(url, exc)}")
            return None
    return url


def _shown_names(stored: set[str], inspect_keys: dict[str, str]) -> dict[str, str]:
    """Stored scorer name -> its name in the scored copy: the log's own key for a variant of
    one of its scorers (unless gradebook also graded the log with a scorer of that name)."""
    out = {}
    for name in sorted(stored):
        key = inspect_keys.get(name, name)
        out[name] = key if key == name or key not in stored else name
    return out


def _recompute_results(log: Any, scorers: dict[str, str]) -> None:
    """`log.eval.scorers` gains gradebook's scorers (name in the copy -> verifier name), first,
    with their metrics, then `results` is recomputed by Inspect's own `recompute_metrics`, as
    `inspect score` leaves a log. The log's other scorers stay after them if some sample holds
    a score of theirs; one that never ran would be a NaN headline."""
    from inspect_ai.log import recompute_metrics
    from inspect_ai.log._log import EvalScorer

    from scorers.registry import all_verifiers

    known = all_verifiers()
    ours = {shown: _eval_scorer(shown, known.get(name)) for shown, name in scorers.items()}
    held = {k for s in log.samples or [] for k in (s.scores or {})}
    kept = [
        s
        for s, key in zip(log.eval.scorers or [], _keys(log.eval.scorers or []), strict=True)
        if key not in ours and key in held
    ]
    log.eval.scorers = [*ours.values(), *kept]
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


def _keys(scorers: list[Any]) -> list[str]:
    """The keys Inspect gives the scores of a task's scorers, in order: the unqualified name,
    `name1` for a second one of the same name (`unique_scorer_name`)."""
    keys: list[str] = []
    for scorer in scorers:
        base = scorer.name.rsplit("/", 1)[-1]
        key, n = base, 1
        while key in keys:
            key, n = f"{base}{n}", n + 1
        keys.append(key)
    return keys


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
