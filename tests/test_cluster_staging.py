"""The cluster's hand-over through a bucket (flows.cluster.staging), against a real S3 server on
127.0.0.1: a chunk of samples goes up whole, a CPU worker's scores come back as one object, and
the dispatcher loads them once, even when it loads the same object again after a crash; a host
that cannot use a bucket is told in one line what to set, before anything is dispatched."""

from __future__ import annotations

import pytest
from gate_world import ingest, run_eval

from flows.cluster import staging
from flows.cluster.dispatch import DispatchError, check_locations
from flows.cluster.work import cluster_generate, read_manifest, score_chunk
from sweeps.config import parse_config
from warehouse import Warehouse


def _keys(s3, url: str) -> list[str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"].removeprefix(prefix).lstrip("/") for o in listed)


def _score_rows(wh: Warehouse) -> tuple[int, int]:
    with wh.read() as con:
        return con.execute(
            "SELECT count(*), count(DISTINCT (run_id, sample_id, epoch, scorer, fingerprint)) "
            "FROM scores"
        ).fetchone()


def test_a_chunk_and_its_scores_go_through_the_bucket_and_load_once(
    s3_bucket, s3_env, tmp_path
) -> None:
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier

    wh = Warehouse(tmp_path / "gb.duckdb")
    run_id = ingest(wh, run_eval(tmp_path / "logs", [f"ANSWER: {a}" for a in "0173"]))
    digest = fingerprint(get_verifier("math")).digest
    todo = wh.samples_to_score("math", digest, run_ids=[run_id])
    chunk = staging.join(s3_bucket, "st", "chunks", "math-1.parquet")
    scores = staging.join(s3_bucket, "st", staging.SCORES)
    staging.write_parquet(todo, chunk)

    done = score_chunk(chunk, "math", digest, scores, workers=1)  # what a CPU worker runs
    assert (done["rows"], done["scored"]) == (4, 4)
    assert done["staged"].startswith(f"{scores}/scores-") and done["staged"].endswith(".parquet")
    [staged] = [k for k in _keys(s3_env, scores)]
    assert staged.startswith("scores-")

    assert staging.load_staged(wh, scores) == 4
    assert _keys(s3_env, scores) == [f"loaded/{staged}"]  # loaded: moved aside
    assert staging.load_staged(wh, scores) == 0  # nothing new
    # a dispatcher that died between its load and the move finds the object again: no row twice
    client, bucket = s3_env.client(), s3_bucket.removeprefix("s3://")
    client.copy_object(
        Bucket=bucket,
        Key=f"st/scores/{staged}",
        CopySource={"Bucket": bucket, "Key": f"st/scores/loaded/{staged}"},
    )
    assert staging.load_staged(wh, scores) == 0
    assert _score_rows(wh) == (4, 4)
    with wh.read() as con:
        values = con.execute("SELECT value FROM scores ORDER BY sample_id").fetchall()
    assert [v for (v,) in values] == [1.0, 1.0, 0.0, 1.0]  # sample q002 answered 7


def _cfg(tmp_path, **cluster):
    raw = {
        "name": "s3-check",
        "log_dir": str(tmp_path / "logs"),
        "warehouse": str(tmp_path / "gb.duckdb"),
        "models": [{"name": "m", "model": "mockllm/model"}],
        "tasks": [{"task": "tests/flows_kit.py@arith"}],
        "cluster": cluster,
    }
    return parse_config(raw, source=tmp_path / "sweep.toml")


def test_a_dispatcher_without_credentials_is_told_what_to_set_before_dispatching(
    s3_bucket, s3_env, tmp_path, monkeypatch
) -> None:
    cfg = _cfg(tmp_path, staging_dir=f"{s3_bucket}/staging")
    check_locations(cfg)  # reachable: nothing said
    secret = s3_env.env()["AWS_SECRET_ACCESS_KEY"]
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    with pytest.raises(DispatchError) as err:
        check_locations(cfg)
    line = str(err.value)
    assert "\n" not in line and secret not in line
    assert line.startswith(f"[cluster] staging_dir: {s3_bucket}/staging: no credentials")
    assert "AWS_ACCESS_KEY_ID" in line and "AWS_PROFILE" in line

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    cfg = _cfg(tmp_path, staging_dir="s3://no-such-bucket-gradebook/staging")
    with pytest.raises(DispatchError, match="no-such-bucket-gradebook/staging: no such bucket"):
        check_locations(cfg)


def test_a_gpu_host_that_cannot_use_the_log_bucket_says_so_in_its_manifest(
    s3_bucket, s3_env, tmp_path
) -> None:
    """The generate flow's own function, as a GPU worker runs it: the log dir's bucket is not
    there, so no model is called, and the manifest in the staging bucket says which host lacks
    what (the dispatcher reads it from there)."""
    import socket

    manifest = staging.join(s3_bucket, "staging", "manifests", "run-0-m.json")
    state = cluster_generate.fn(
        model={"name": "m", "model": "mockllm/model"},
        tasks=[{"task": "tests/flows_kit.py@arith"}],
        log_dir="s3://no-such-bucket-gradebook/logs",
        manifest=manifest,
        sweep="s3-check",
    )
    assert state.is_failed() and state.message.startswith("work failed on host")
    [result] = read_manifest(manifest)
    assert result.log is None and result.status == "error"
    host = socket.gethostname()
    assert f"host {host}" in result.error and "log_dir: s3://no-such-bucket-gradebook/logs" in (
        result.error
    )
    assert "no such bucket" in result.error


def test_a_gpu_worker_writes_its_logs_workspaces_and_manifest_into_the_bucket(
    s3_bucket, s3_env, tmp_path, monkeypatch
) -> None:
    """The generate flow's own function, as a GPU worker runs it in a directory of its own: an
    agentic task on Inspect's `local` sandbox, its log and its workspace archives in the bucket,
    nothing written where it runs."""
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    host = tmp_path / "gpu-host"
    host.mkdir()
    monkeypatch.chdir(host)
    root = f"{s3_bucket}/sweep"
    manifest = staging.join(root, "staging", "manifests", "run-0-m.json")
    count = cluster_generate.fn(
        model={"name": "m", "model": "mockllm/model", "args_from": "workspace_kit:mock_args"},
        tasks=[{"task": f"{tests / 'workspace_kit.py'}@notes_local", "args": {"n": 2}}],
        log_dir=f"{root}/logs",
        manifest=manifest,
        sweep="s3-gen",
        workspaces={"capture": True, "store": f"{root}/workspaces", "max_mb": 64},
    )
    assert count == 1
    [result] = read_manifest(manifest)
    assert result.status == "success" and result.log.startswith(f"{root}/logs/")
    keys = _keys(s3_env, root)
    assert [k for k in keys if k.startswith("logs/") and k.endswith(".eval")] == [
        result.log.removeprefix(f"{root}/")
    ]
    archives = [k for k in keys if k.startswith("workspaces/sha256/")]
    assert archives and all(k.endswith(".tar.zst") for k in archives)
    assert not [p for p in host.rglob("*") if p.is_file()]  # nothing went through this path
    # the dispatcher ingests the log from the bucket: its records name the bucket store
    wh = Warehouse(tmp_path / "gb.duckdb")
    [ingested] = wh.ingest_logs([result.log])
    assert ingested.error is None, ingested.error
    with wh.read() as con:
        boxes = con.execute("SELECT status, store, digest FROM workspaces").fetchall()
    assert {b[:2] for b in boxes} == {("captured", f"{root}/workspaces")} and len(boxes) == 2
    assert {f"workspaces/sha256/{d[:2]}/{d}.tar.zst" for *_, d in boxes} <= set(archives)
