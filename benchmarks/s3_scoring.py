"""Scoring a math log from an S3 bucket against the same log on local disk, in the same run.

    .venv/bin/python benchmarks/s3_scoring.py [--quick] [--json PATH] [--samples N]

Rows:
  - the score flow (ingest + grade, a real Prefect flow run against a local server, into a fresh
    warehouse each time) on `s3://bucket/math_N.eval` served by moto's S3 server over HTTP on
    127.0.0.1, in samples/s, against the same flow on the same log on local disk. The S3 side
    starts each round with an empty spill directory (warehouse.log_spill), so the download is
    timed. Bar: >= 0.8x the local rate (the median of 3 rounds, after one untimed warm-up flow;
    which side runs first alternates between rounds; --quick runs one round on 1,000 samples,
    mostly fixed cost: see the full run).
  - peak RSS of the S3 run's process tree (the flow's process, its grading workers and the
    background download), against the local run's (bar: <= 1.5 GB, as the scoring stage's).
  - the download alone (whole object into the spill directory), in MB/s: informational.

The log is the one benchmarks/scoring_stage.py generates and caches in .bench/.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))
sys.path.append(str(ROOT / "tests"))  # s3_kit: the moto server the tests use

from _common import emit, info, judged, stage_args, use_bench_prefect  # noqa: E402
from _tree_rss import TreeRss  # noqa: E402
from scoring_stage import CACHE, RSS_BAR_BYTES, build_log  # noqa: E402

REPEATS = 3
BAR = 0.8


def _score(location: str, tmp: Path, workers: int) -> tuple[float, int, int]:
    """One score flow over `location` into a fresh warehouse: (seconds, correct, peak bytes)."""
    from flows.score import score_flow

    db = tmp / f"bench-{time.monotonic_ns()}.duckdb"
    with TreeRss() as rss:
        t0 = time.perf_counter()
        summaries = score_flow([location], str(db), ["math"], workers, progress=False)
        seconds = time.perf_counter() - t0
    db.unlink(missing_ok=True)
    return seconds, sum(s.correct for s in summaries), rss.peak_bytes


def _fresh_spill(spill: Path) -> None:
    """An empty spill directory and no copy remembered by this process: the next S3 read
    downloads the log again."""
    import warehouse.log_spill as log_spill

    shutil.rmtree(spill, ignore_errors=True)
    spill.mkdir(parents=True)
    log_spill._COPIES.clear()
    log_spill._PENDING.clear()


def main() -> None:
    args, n = stage_args(__doc__.splitlines()[0], "1,000 samples; under a minute", quick_n=1_000)
    use_bench_prefect(CACHE)
    log = build_log(n)
    size_mb = log.stat().st_size / (1 << 20)
    from s3_kit import s3_server

    from flows.runtime.console import quiet_prefect
    from flows.runtime.session import prefect_session

    quiet_prefect(False)
    repeats = 1 if args.quick else REPEATS
    with tempfile.TemporaryDirectory() as tmp_dir, s3_server(Path(tmp_dir) / "moto") as s3:
        tmp = Path(tmp_dir)
        os.environ.update(s3.env())
        spill = tmp / "spill"
        os.environ["GRADEBOOK_SPILL_DIR"] = str(spill)
        bucket = s3.new_bucket("bench")
        s3.client().upload_file(str(log), bucket, f"sweep/{log.name}")
        url = f"s3://{bucket}/sweep/{log.name}"

        from warehouse.log_spill import local_copy

        _fresh_spill(spill)
        t0 = time.perf_counter()
        local_copy(url)
        download_s = time.perf_counter() - t0

        local_runs: list[float] = []
        s3_runs: list[float] = []
        local_peak = s3_peak = 0
        with prefect_session():
            # not timed: the process's first flow run pays its one-time costs (imports, the
            # grading pool's zygote), which would count against whichever side ran first
            _score(str(log), tmp, args.workers)
            for i in range(repeats):  # taking turns: the load of a shared machine drifts
                # and which side goes first alternates: when S3 always ran second it came out
                # faster than local disk in 8 of 9 rounds, which reading the same bytes from a
                # local copy cannot explain
                order = ("local", "s3") if i % 2 == 0 else ("s3", "local")
                for side in order:
                    if side == "local":
                        local_s, local_correct, peak = _score(str(log), tmp, args.workers)
                        local_runs.append(local_s)
                        local_peak = max(local_peak, peak)
                    else:
                        _fresh_spill(spill)
                        s3_s, s3_correct, peak = _score(url, tmp, args.workers)
                        s3_runs.append(s3_s)
                        s3_peak = max(s3_peak, peak)
                if s3_correct != local_correct:
                    print(f"WARNING: {s3_correct} correct from S3, {local_correct} from disk")
                print(f"round ({order[0]} first): local {n / local_s:,.0f}/s, "
                      f"s3 {n / s3_s:,.0f}/s ({local_s / s3_s:.2f}x)")  # fmt: skip
    local_rate = n / statistics.median(local_runs)
    s3_rate = n / statistics.median(s3_runs)
    rows = [
        judged(f"score flow from s3:// ({n:,} math samples, ingest + grade)", s3_rate,
               "samples/s", "the same flow on the same log on local disk", local_rate,
               s3_rate / local_rate, f">= {BAR}x", s3_rate / local_rate >= BAR,
               judge=not args.quick),
        judged("peak RSS, score flow from s3:// (process tree)", s3_peak / 1e6, "MB",
               "the same flow from local disk", local_peak / 1e6, s3_peak / max(local_peak, 1),
               f"<= {RSS_BAR_BYTES / 1e9:.1f} GB", s3_peak <= RSS_BAR_BYTES),
        info(f"download into the spill dir ({size_mb:,.1f} MB)", size_mb / download_s, "MB/s",
             "seconds", download_s, 1.0),
    ]  # fmt: skip
    emit(f"scoring from S3 (moto on 127.0.0.1) vs local disk, {n:,} samples", rows, args.json)


if __name__ == "__main__":
    main()
