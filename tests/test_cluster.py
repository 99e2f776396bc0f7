"""Cluster mode for real: the Prefect server as infra/cluster/start_server.sh starts it (on its
own PostgreSQL), `gpu` and `cpu` process workers as separate process groups, a sweep with mockllm
dispatched to them, and a CPU host killed mid-chunk.

Assertions come from the Prefect API (which pool and deployment each flow run used, which
crashed), from the warehouse (every sample scored exactly once) and from the server's and the
workers' logs (no traceback).
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import cluster_kit
import pytest

from flows.sweep import EXIT_OK, sweep_flow
from sweeps.config import parse_config
from warehouse import Warehouse

TESTS = Path(__file__).resolve().parent
N_PROBLEMS, EPOCHS = 6, 2  # 12 samples per sweep


@pytest.fixture(scope="module")
def cluster_api(prefect_api, tmp_path_factory):
    """The cluster's own server (infra/cluster/start_server.sh), in place of the session's for
    this module's flows: the session's settings otherwise (Prefect home, result storage)."""
    home = tmp_path_factory.mktemp("cluster-server")
    with cluster_kit.cluster_server(home) as server:
        with cluster_kit.prefect_api_in_process(server.api_url):
            yield server


@pytest.fixture(scope="module")
def cluster(cluster_api, tmp_path_factory):
    """Pools + deployments on the cluster's server, one gpu and one cpu worker, and a verifier
    module both the test and the workers import. Workers die with the module (finalizer)."""
    from flows.cluster.setup import setup_cluster, worker_env

    api_url = cluster_api.api_url
    root = tmp_path_factory.mktemp("cluster")
    mods = root / "mods"
    mods.mkdir()
    verifier = f"slow_{uuid.uuid4().hex[:8]}"
    cluster_kit.write_slow_verifier(mods, verifier, delay_s=0.5)
    import sys

    sys.path.insert(0, str(mods))
    __import__(verifier)
    setup_cluster()
    env = {
        **os.environ,
        **worker_env(api_url),
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(mods), os.environ.get("PYTHONPATH", "")]),
        "PREFECT_HOME": str(root / "worker-home"),
    }
    workers: list[cluster_kit.Worker] = []

    def start(pool: str) -> cluster_kit.Worker:
        w = cluster_kit.Worker(
            pool, env, root / f"{pool}-{len(workers)}.log", f"{pool}-{len(workers)}"
        )
        workers.append(w)
        return w

    start("gpu")
    start("cpu")
    try:
        yield {
            "root": root,
            "verifier": verifier,
            "start": start,
            "workers": workers,
            "server_log": cluster_api.log,
        }
    finally:
        for w in workers:
            w.stop()
        sys.path.remove(str(mods))


def _config(tmp_path: Path, verifier: str, name: str, chunk_size: int):
    raw = {
        "name": name,
        "log_dir": str(tmp_path / "logs"),
        "warehouse": str(tmp_path / "gb.duckdb"),
        "verifier_modules": [verifier],
        "models": [{"name": "v1", "model": "mockllm/model", "args_from": "cluster_kit:mock_args"}],
        "tasks": [
            {
                "task": f"{TESTS / 'flows_kit.py'}@arith",
                "args": {"n": N_PROBLEMS},
                "epochs": EPOCHS,
                "verifiers": [verifier],
            }
        ],
        "gates": {"min_accuracy": 0.5, "max_regression": None},
        "cluster": {
            "staging_dir": str(tmp_path / "staging"),
            "chunk_size": chunk_size,
            "grading_workers": 1,
            "stage_timeout_s": 420,
        },
    }
    return parse_config(raw, source=tmp_path / "sweep.toml")


def _flow_runs(ids):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        names = {}
        for r in runs:
            if r.deployment_id not in names:
                dep = client.read_deployment(r.deployment_id)
                flow = client.read_flow(dep.flow_id)
                names[r.deployment_id] = f"{flow.name}/{dep.name}"
        return {r.id: (r, names[r.deployment_id]) for r in runs}


def _score_counts(cfg) -> tuple[int, int, int]:
    with Warehouse(cfg.warehouse).read() as con:
        n, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (run_id, sample_id, epoch, scorer, fingerprint)) "
            "FROM scores"
        ).fetchone()
        samples = con.execute("SELECT count(*) FROM samples").fetchone()[0]
    return n, distinct, samples


@pytest.mark.slow
def test_cluster_sweep_generates_on_gpu_scores_on_cpu_and_scores_each_sample_once(
    cluster, tmp_path
):
    cfg = _config(tmp_path, cluster["verifier"], "cluster-e2e", chunk_size=6)
    t0 = time.monotonic()
    result = sweep_flow(cfg, progress=False)
    elapsed = time.monotonic() - t0

    report = result.dispatch
    gen, score = report.stage("generate"), report.stage("score")
    assert len(gen) == 1 and len(score) == 2  # one model; 12 samples in chunks of 6
    runs = _flow_runs([i for r in report.runs for i in r.flow_run_ids])
    for r in gen:
        fr, deployment = runs[r.flow_run_ids[-1]]
        assert (fr.work_pool_name, deployment, fr.state.type.value) == (
            "gpu",
            "cluster-generate/gpu",
            "COMPLETED",
        )
    for r in score:
        fr, deployment = runs[r.flow_run_ids[-1]]
        assert (fr.work_pool_name, deployment, fr.state.type.value) == (
            "cpu",
            "cluster-score/cpu",
            "COMPLETED",
        )
        # principle 8: a worker is handed files, never the warehouse
        assert not any(".duckdb" in str(v) for v in fr.parameters.values())

    n, distinct, samples = _score_counts(cfg)
    assert (n, distinct, samples) == (12, 12, 12)
    (row,) = result.rows
    assert (row.samples, row.scored, row.unscored, row.errored) == (12, 12, 0, 0)
    # mockllm answers wrong on operands 2 and 5, in both epochs
    assert row.accuracy == pytest.approx(8 / 12)
    assert result.exit_code == EXIT_OK
    assert not list((cfg.cluster.staging_dir / "scores").glob("*.parquet"))  # all loaded
    # a small cluster run logs no traceback: on SQLite, Prefect's server logged "database is
    # locked" tracebacks even with one worker per pool
    logs = [cluster["server_log"], *(w.log for w in cluster["workers"])]
    assert cluster_kit.log_errors(*logs) == []
    print(f"cluster sweep wall time: {elapsed:.1f}s")


def _kill_cpu_host_when_scoring(cluster, staging_dir: Path, events: dict) -> None:
    """Wait for a score run of this sweep to be RUNNING, then kill its worker and its flow run
    process groups (a dead host), and start a replacement cpu worker."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )

    deadline = time.monotonic() + 300
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and "stop" not in events:
            running = [
                r
                for r in client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        tags=FlowRunFilterTags(all_=["gradebook-cluster"]),
                        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=["RUNNING"])),
                    )
                )
                if str(r.parameters.get("staging_dir", "")).startswith(str(staging_dir))
                and r.infrastructure_pid
            ]
            if running:
                time.sleep(1.0)  # mid-chunk: the verifier takes 0.5 s per sample
                cpu = [w for w in cluster["workers"] if w.pool == "cpu" and w.proc.poll() is None]
                for w in cpu:
                    w.kill()
                for r in running:
                    cluster_kit.kill_group(
                        int(str(r.infrastructure_pid).rsplit(":", 1)[-1]), signal.SIGKILL
                    )
                events["killed"] = [r.id for r in running]
                cluster["start"]("cpu")
                return
            time.sleep(0.3)


@pytest.mark.slow
def test_a_cpu_host_dying_mid_chunk_is_retried_without_lost_or_doubled_scores(cluster, tmp_path):
    """Over 60 s: the killed run is declared Crashed only after CRASH_AFTER_S (75 s) without
    a heartbeat (Prefect's floor is one per 30 s), and only then retried."""
    cfg = _config(tmp_path, cluster["verifier"], "cluster-kill", chunk_size=12)
    events: dict = {}
    # the thread runs in a copy of this context: Prefect's settings (the API URL) live there
    ctx = contextvars.copy_context()
    killer = threading.Thread(
        target=ctx.run,
        args=(_kill_cpu_host_when_scoring, cluster, cfg.cluster.staging_dir, events),
        daemon=True,
    )
    killer.start()
    try:
        result = sweep_flow(cfg, progress=False)
    finally:
        events["stop"] = True
        killer.join(timeout=30)

    assert events.get("killed"), "the score chunk was never seen RUNNING"
    (chunk,) = result.dispatch.stage("score")
    runs = _flow_runs(chunk.flow_run_ids)
    states = [runs[i][0].state.type.value for i in chunk.flow_run_ids]
    # Prefect's heartbeat automation declared the killed run Crashed; the retry completed
    assert states[0] == "CRASHED" and states[-1] == "COMPLETED", states
    assert chunk.flow_run_ids[0] in events["killed"]
    assert {runs[i][0].work_pool_name for i in chunk.flow_run_ids} == {"cpu"}

    n, distinct, samples = _score_counts(cfg)
    assert (n, distinct, samples) == (12, 12, 12)
    assert result.rows[0].scored == 12
    assert result.dispatch.missing_scores == 0
    assert result.exit_code == EXIT_OK


@pytest.mark.slow
def test_a_gpu_host_without_the_models_key_fails_its_stage_and_says_which_host_lacks_what(
    cluster, tmp_path, monkeypatch
):
    import socket

    from flows.cluster.dispatch import print_report
    from flows.runtime.console import console

    # the dispatcher has the key; the GPU worker (started before it was set) does not
    monkeypatch.setenv("CKPT_API_KEY", "only-on-the-dispatcher")
    monkeypatch.setenv("CKPT_BASE_URL", "http://127.0.0.1:9/v1")
    cfg = _config(tmp_path, cluster["verifier"], "cluster-nokey", chunk_size=6)
    raw = cfg.model_dump(mode="json")
    raw["models"] = [{"name": "ckpt", "model": "openai-api/ckpt/m"}]
    cfg = parse_config(raw, source=tmp_path / "sweep.toml")
    result = sweep_flow(cfg, progress=False)

    [gen] = result.dispatch.stage("generate")
    assert gen.attempts == 1  # the same host would lack it again: not dispatched twice
    runs = _flow_runs(gen.flow_run_ids)
    run = runs[gen.flow_run_ids[0]][0]
    assert run.state.type.value == "FAILED"
    # named and tagged in the UI for what it ran
    assert run.name == "generate ckpt · 1 task (sweep cluster-nokey)"
    assert {"model:ckpt", "task:arith", "sweep:cluster-nokey", "gradebook-cluster"} <= set(run.tags)
    assert result.dispatch.summary()["generate"]["failed"] == 1
    host = socket.gethostname()
    [row] = result.rows
    assert row.state == "failed" and f"host {host}" in row.note and "CKPT_API_KEY" in row.note
    assert "gradebook cluster worker gpu" in row.note
    with console.capture() as out:
        print_report(result.dispatch)
    text = out.get()
    assert "generate on gpu: 0/1 done" in text and "FAILED" in text
    assert "CKPT_API_KEY" in text and host in text
    assert result.exit_code != EXIT_OK


def _bucket_keys(s3, bucket: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.mark.slow
def test_a_sweep_whose_hosts_share_only_the_prefect_server_and_a_bucket(cluster, s3_env, tmp_path):
    """log_dir, workspace store and staging all in one bucket; the GPU and the CPU worker each
    in a working directory of its own (their own Prefect homes too), with the installed
    gradebook and the bucket's endpoint and keys in their environment, nothing else shared."""
    import json

    from flows.cluster.setup import setup_cluster, worker_env

    bucket = s3_env.new_bucket()
    root = f"s3://{bucket}/sweep"
    gpu_pool, cpu_pool = f"gpu-s3-{uuid.uuid4().hex[:6]}", f"cpu-s3-{uuid.uuid4().hex[:6]}"
    setup_cluster(generate_pools=[gpu_pool], score_pools=[cpu_pool])
    hosts = {pool: tmp_path / f"{pool}-host" for pool in (gpu_pool, cpu_pool)}
    workers = []
    try:
        for pool, home in hosts.items():
            home.mkdir()
            env = {
                **os.environ,  # the session's AWS_* (s3_env): the bucket's endpoint and keys
                **worker_env(os.environ["PREFECT_API_URL"]),
                "PYTHONPATH": os.pathsep.join(
                    [str(TESTS), str(cluster["root"] / "mods"), os.environ.get("PYTHONPATH", "")]
                ),
                "PREFECT_HOME": str(home / "prefect"),
                "TMPDIR": str(home),
            }
            workers.append(
                cluster_kit.Worker(pool, env, home / "worker.log", f"{pool}-w", cwd=home)
            )
        dispatcher = tmp_path / "dispatcher"
        dispatcher.mkdir()
        cfg = _config(dispatcher, cluster["verifier"], "cluster-s3", chunk_size=6)
        raw = cfg.model_dump(mode="json")
        raw["log_dir"] = f"{root}/logs"
        raw["workspaces"] = {"store": f"{root}/workspaces"}
        raw["cluster"] |= {"staging_dir": f"{root}/staging", "score_pool": cpu_pool}
        raw["models"][0]["work_pool"] = gpu_pool
        raw["tasks"].append(
            {
                "task": f"{TESTS / 'workspace_kit.py'}@notes_local",
                "args": {"n": 2},
                "verifiers": [cluster["verifier"]],
            }
        )
        raw["gates"] = {"min_accuracy": None, "max_regression": None}
        cfg = parse_config(raw, source=dispatcher / "sweep.toml")
        result = sweep_flow(cfg, progress=False)
    finally:
        for w in workers:
            w.stop()

    report = result.dispatch
    assert [r.state for r in report.runs] == ["COMPLETED"] * 4, [
        (r.label, r.state, r.message) for r in report.runs
    ]  # one generate run; arith's 12 samples in 2 chunks, notes' 2 in 1
    runs = _flow_runs([i for r in report.runs for i in r.flow_run_ids])
    assert {fr.work_pool_name for fr, _ in runs.values()} == {gpu_pool, cpu_pool}
    # principle 8 and the AWS chain: a worker is handed URLs, never the warehouse, a key or
    # the endpoint
    sent = json.dumps([fr.parameters for fr, _ in runs.values()])
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        assert s3_env.env()[var] not in sent, var
    assert ".duckdb" not in sent and f"{root}/staging/chunks/" in sent

    n, distinct, samples = _score_counts(cfg)
    assert (n, distinct, samples) == (14, 14, 14)
    assert report.missing_scores == 0
    by_task = {r.task: r for r in result.rows}
    assert (by_task["arith"].scored, by_task["arith"].accuracy) == (12, pytest.approx(8 / 12))
    assert by_task["notes_local"].scored == 2

    keys = _bucket_keys(s3_env, bucket)
    assert len([k for k in keys if k.startswith("sweep/logs/") and k.endswith(".eval")]) == 2
    objects = [k for k in keys if k.startswith("sweep/workspaces/sha256/")]
    assert objects and all(k.endswith(".tar.zst") for k in objects)
    assert not [k for k in keys if k.startswith("sweep/staging/chunks/")]  # done: removed
    staged = [k for k in keys if k.startswith("sweep/staging/scores/")]
    assert len(staged) == 3 and all(k.startswith("sweep/staging/scores/loaded/") for k in staged)
    with Warehouse(cfg.warehouse).read() as con:
        boxes = con.execute("SELECT status, store, digest FROM workspaces").fetchall()
    assert len(boxes) == 2 and {b[:2] for b in boxes} == {("captured", f"{root}/workspaces")}
    assert {f"sweep/workspaces/sha256/{d[:2]}/{d}.tar.zst" for *_, d in boxes} <= set(objects)

    # nothing went through a path: no log, chunk, score file or manifest in any host's directory
    handed = {".eval", ".parquet", ".zst"}
    for home in [*hosts.values(), dispatcher]:
        assert not [p for p in home.rglob("*") if p.suffix in handed], home
    assert not (dispatcher / "staging").exists() and not (dispatcher / "logs").exists()
    for w in workers:
        text = w.log.read_text(errors="replace")
        assert s3_env.env()["AWS_SECRET_ACCESS_KEY"] not in text
    assert cluster_kit.log_errors(*(w.log for w in workers)) == []
