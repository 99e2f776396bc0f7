"""What cluster mode costs: the same mockllm sweep embedded vs dispatched to gpu/cpu work pools.

Starts a real `prefect server`, the cluster deployments and one process worker per pool (poll
interval 2 s), then runs one sweep in this process (the anchor) and the same sweep with
`[cluster]`. Reported: the cluster sweep's wall time as a ratio to the embedded one, and the
per-run dispatch overhead (a flow run's wall time from `run_deployment` to its final state as
seen by the dispatcher, minus the time the run itself spent running), as a ratio to the run time.

    .venv/bin/python benchmarks/cluster_overhead.py --quick --json bench/cluster_overhead.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS), str(Path(__file__).resolve().parent)]

from _common import Row, emit  # noqa: E402


def _config(tmp: Path, name: str, verifier: str, n: int, cluster: dict | None):
    from sweeps.config import parse_config

    raw = {
        "name": name,
        "log_dir": str(tmp / name / "logs"),
        "warehouse": str(tmp / name / "gb.duckdb"),
        "verifier_modules": [verifier],
        "models": [{"name": "v1", "model": "mockllm/model", "args_from": "cluster_kit:mock_args"}],
        "tasks": [
            {"task": f"{TESTS / 'flows_kit.py'}@arith", "args": {"n": n}, "verifiers": [verifier]}
        ],
        "gates": {"min_accuracy": 0.0, "max_regression": None},
    }
    if cluster:
        raw["cluster"] = cluster
    return parse_config(raw, source=tmp / f"{name}.toml")


def _run_times(ids: list) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    return {r.id: r.total_run_time.total_seconds() for r in runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (one score chunk)")
    ap.add_argument("--json", type=Path, help="write the result rows here")
    args = ap.parse_args()
    n, chunk = (6, 6) if args.quick else (40, 20)

    import flows_kit

    from flows.cluster.setup import setup_cluster, worker_command, worker_env
    from flows.runtime.server import local_server, quiet_env

    os.environ.update({**quiet_env(), "PREFECT_LOGGING_LEVEL": "WARNING"})
    os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"
    with tempfile.TemporaryDirectory(prefix="gb-cluster-bench-") as tmp_s:
        tmp = Path(tmp_s)
        verifier = f"exact_{uuid.uuid4().hex[:8]}"
        flows_kit.write_verifier(tmp, verifier, verifier)
        sys.path.insert(0, str(tmp))
        __import__(verifier)
        os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(tmp / "results")
        with local_server(home=tmp / "server", ui=False) as api:
            os.environ["PREFECT_API_URL"] = api
            from prefect.settings import temporary_settings

            from flows.runtime.session import in_process_settings

            # the embedded anchor runs as the CLI does (flows.runtime.session.prefect_session)
            with temporary_settings(updates={"api.url": api, **in_process_settings()}):
                rows = _measure(
                    api, tmp, verifier, n, chunk, setup_cluster, worker_command, worker_env
                )
    emit("cluster mode overhead (mockllm sweep)", rows, args.json)


def _measure(api, tmp, verifier, n, chunk, setup_cluster, worker_command, worker_env):
    import subprocess

    from flows.runtime.server import stop_process_group
    from flows.sweep import sweep_flow

    setup_cluster()
    env = {
        **os.environ,
        **worker_env(api),
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(tmp)]),
        "PREFECT_HOME": str(tmp / "worker-home"),
    }
    workers = [
        subprocess.Popen(
            worker_command(pool, name=f"bench-{pool}"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for pool in ("gpu", "cpu")
    ]
    try:
        embedded_cfg = _config(tmp, "embedded", verifier, n, None)
        t0 = time.perf_counter()
        embedded = sweep_flow(embedded_cfg, workers=1, progress=False)
        t_embedded = time.perf_counter() - t0
        cluster_cfg = _config(
            tmp,
            "cluster",
            verifier,
            n,
            {"staging_dir": str(tmp / "staging"), "chunk_size": chunk, "grading_workers": 1},
        )
        t0 = time.perf_counter()
        clustered = sweep_flow(cluster_cfg, progress=False)
        t_cluster = time.perf_counter() - t0
    finally:
        for w in workers:
            stop_process_group(w)
    assert embedded.rows[0].scored == clustered.rows[0].scored == n, "sweeps did not score all"
    report = clustered.dispatch
    ran = _run_times([r.flow_run_ids[-1] for r in report.runs])
    overheads, run_times = [], []
    for r in report.runs:
        wall = r.finished - r.started
        run_times.append(ran[r.flow_run_ids[-1]])
        overheads.append(wall - ran[r.flow_run_ids[-1]])
    per_run = statistics.median(overheads)
    run_time = statistics.median(run_times)
    return [
        Row(
            f"cluster sweep wall time ({n} samples, {len(report.runs)} flow runs)",
            t_cluster,
            "s",
            "same sweep embedded",
            t_embedded,
            t_cluster / t_embedded,
            "fixed cost only: < embedded + 2 hops x 15 s",
            t_cluster < t_embedded + 2 * 15.0,
        ),
        Row(
            "dispatch overhead per flow run (median)",
            per_run,
            "s",
            "that run's own run time",
            run_time,
            per_run / run_time if run_time else float("inf"),
            "<= 15 s per hop with 2 s polling (issue: 5-12 s)",
            per_run <= 15.0,
        ),
    ]


if __name__ == "__main__":
    main()
