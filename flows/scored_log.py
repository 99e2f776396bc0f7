"""Scored copies of logs, so `inspect view` shows gradebook's scores; the original is untouched."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

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
    warehouse: str | Path, logs: Sequence[str | Path], out_dir: Path
) -> list[Path]:
    """Write `out_dir/<log name>` for each log with the newest fingerprint's scores attached.

    Returns:
        The paths written.
    """
    from inspect_ai.log import read_eval_log, write_eval_log
    from inspect_ai.scorer import Score

    from warehouse import Warehouse

    check_scored_log_dir(logs, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in logs:
        log = read_eval_log(str(path))
        with Warehouse(warehouse).read() as con:
            rows = con.execute(
                "SELECT sample_id, epoch, scorer, status, value, answer, explanation, reason, "
                "metadata::VARCHAR FROM latest_scores WHERE run_id = ?",
                [log.eval.eval_id],
            ).fetchall()
        by_sample: dict[tuple[str, int], dict[str, Score]] = {}
        for sample_id, epoch, scorer, status, value, answer, explanation, reason, meta in rows:
            metadata = {"status": status, "reason": reason, **json.loads(meta or "{}")}
            by_sample.setdefault((str(sample_id), int(epoch)), {})[scorer] = Score(
                value=value if status == "scored" and value is not None else math.nan,
                answer=answer,
                explanation=explanation,
                metadata=metadata,
            )
        for sample in log.samples or []:
            scores = by_sample.get((str(sample.id), int(sample.epoch)))
            if scores:
                sample.scores = {**(sample.scores or {}), **scores}
        target = out_dir / Path(str(path)).name
        write_eval_log(log, str(target))
        written.append(target)
    return written
