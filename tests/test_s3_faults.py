"""Faults between gradebook and an S3-compatible store, injected on the wire by a proxy in front
of a real S3 server (tests/s3_fault_proxy.py): each ends in one line naming the log and exit 2,
or in a retry that succeeds; never a half-ingested run, never a sample written twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from s3_fault_proxy import FaultProxy
from warehouse_logs import make_log, variant

from warehouse import Warehouse
from warehouse.object_store import ATTEMPTS, READ_RETRIES

GRADEBOOK = [sys.executable, "-m", "flows.cli"]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = make_log(tmp_path_factory.mktemp("made"))
    out = tmp_path_factory.mktemp("logs")
    first = out / "first.eval"
    first.write_bytes(Path(base.location).read_bytes())
    return [first, variant(base, out / "second.eval", eval_id="second-run")]


@pytest.fixture
def proxy(s3_server):
    p = FaultProxy(s3_server.endpoint)
    yield p
    try:
        p.stop()
    except OSError:
        pass


@pytest.fixture
def bucket(s3_server, logs) -> str:
    name = s3_server.new_bucket()
    for f in logs:
        s3_server.client().upload_file(str(f), name, f"logs/{f.name}")
    return name


def _ingest(proxy: FaultProxy, s3_server, db: Path, *urls: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint, "COLUMNS": "200"}
    return subprocess.run([*GRADEBOOK, "ingest", "--db", str(db), *urls], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip


def _runs(db: Path) -> list[tuple]:
    if not db.exists():
        return []
    with Warehouse(db).read() as con:
        return con.execute(
            "SELECT run_id, ingest_state, n_samples, (SELECT count(*) FROM samples s "
            "WHERE s.run_id = r.run_id) FROM runs r ORDER BY 1"
        ).fetchall()


def _object(key: str):
    return lambda method, path: key in path.split("?")[0]


def test_throttling_and_500s_are_retried_then_succeed(proxy, s3_server, bucket, tmp_path):
    db = tmp_path / "g.duckdb"
    proxy.set(error_status=503, errors_left=2, match=_object("logs/first.eval"))
    ran = _ingest(proxy, s3_server, db, f"s3://{bucket}/logs/")
    assert ran.returncode == 0, ran.stderr
    assert [s for _, p, s in proxy.seen() if "first.eval" in p].count(503) == 2
    assert {r[1:] for r in _runs(db)} == {("complete", 12, 12)}
    other = tmp_path / "other.duckdb"
    proxy.set(error_status=500, errors_left=1, match=_object("logs/second.eval"))
    ran = _ingest(proxy, s3_server, other, f"s3://{bucket}/logs/second.eval")
    assert ran.returncode == 0, ran.stderr
    assert [s for _, p, s in proxy.seen() if "second.eval" in p].count(500) == 1
    assert [r[1:] for r in _runs(other)] == [("complete", 12, 12)]


def test_a_store_that_keeps_failing_is_one_line_after_bounded_attempts(
    proxy, s3_server, bucket, tmp_path
):
    db = tmp_path / "g.duckdb"
    proxy.set(error_status=500, errors_left=-1, match=_object("logs/first.eval"))
    url = f"s3://{bucket}/logs/first.eval"
    ran = _ingest(proxy, s3_server, db, url)
    assert ran.returncode == 2
    [line] = ran.stderr.strip().splitlines()
    assert line == (
        f"error: {url}: the object store kept failing (Internal Server Error) after {ATTEMPTS} "
        "attempts with backoff: try again later"
    ), line
    tries = [s for _, p, s in proxy.seen() if "first.eval" in p]
    assert 1 < len(tries) <= ATTEMPTS * READ_RETRIES
    assert _runs(db) == []  # nothing half-ingested


def test_a_body_cut_short_is_read_again_and_always_cut_is_one_line(
    proxy, s3_server, bucket, tmp_path
):
    db = tmp_path / "g.duckdb"
    url = f"s3://{bucket}/logs/first.eval"
    proxy.set(cut_left=1, match=_object("logs/first.eval"))
    ran = _ingest(proxy, s3_server, db, url)
    assert ran.returncode == 0, ran.stderr
    assert _runs(db) == [(_runs(db)[0][0], "complete", 12, 12)]

    other = tmp_path / "other.duckdb"
    proxy.set(cut_left=-1, match=_object("logs/second.eval"))
    url2 = f"s3://{bucket}/logs/second.eval"
    ran = _ingest(proxy, s3_server, other, url2)
    assert ran.returncode == 2
    [line] = ran.stderr.strip().splitlines()
    assert line.startswith(f"error: {url2}: "), line
    assert _runs(other) == []


def test_an_object_replaced_while_read_is_named_and_nothing_is_mixed(
    proxy, s3_server, bucket, logs, tmp_path
):
    db = tmp_path / "g.duckdb"
    url = f"s3://{bucket}/logs/first.eval"
    replaced = []

    def replace(method: str, path: str) -> None:
        if method == "GET" and not replaced:  # after its ETag was read, before its bytes are
            replaced.append(path)
            s3_server.client().upload_file(str(logs[1]), bucket, "logs/first.eval")

    proxy.set(hook=replace, match=_object("logs/first.eval"))
    ran = _ingest(proxy, s3_server, db, url)
    assert replaced, proxy.seen()
    assert ran.returncode == 2, (ran.stdout + ran.stderr, proxy.seen())
    assert ran.stderr.strip() == (
        f"error: {url}: replaced while it was read (its ETag changed): run the command again "
        "to read the new version"
    )
    assert _runs(db) == []
    proxy.set(hook=None)
    ran = _ingest(proxy, s3_server, db, url)  # the new version, whole
    assert ran.returncode == 0, ran.stderr
    assert _runs(db) == [("second-run", "complete", 12, 12)]


def test_a_bucket_that_disappears_mid_run_ends_with_whole_runs_only(
    proxy, s3_server, bucket, logs, tmp_path
):
    db = tmp_path / "g.duckdb"
    client = s3_server.client()

    def delete_bucket(method: str, path: str) -> None:
        for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
        client.delete_bucket(Bucket=bucket)
        proxy.set(hook=None)

    proxy.set(hook=delete_bucket, match=_object("logs/second.eval"))
    ran = _ingest(proxy, s3_server, db, f"s3://{bucket}/logs/")
    assert ran.returncode == 2
    [line] = ran.stderr.strip().splitlines()
    assert (
        line
        == f"error: s3://{bucket}/logs/second.eval: no such bucket: create it, or check the URL"
    )
    [(run_id, state, n, stored)] = _runs(db)
    assert (state, n, stored) == ("complete", 12, 12)

    client.create_bucket(Bucket=bucket)  # back: the run again adds the missing log only
    for f in logs:
        client.upload_file(str(f), bucket, f"logs/{f.name}")
    ran = _ingest(proxy, s3_server, db, f"s3://{bucket}/logs/")
    assert ran.returncode == 0, ran.stderr
    assert "+0 samples (12 stored)" in ran.stdout and "+12 samples (12 stored)" in ran.stdout
    assert [r[1:] for r in _runs(db)] == [("complete", 12, 12)] * 2


def test_an_endpoint_that_refuses_is_one_line(proxy, s3_server, bucket, tmp_path):
    proxy.stop()
    ran = _ingest(proxy, s3_server, tmp_path / "g.duckdb", f"s3://{bucket}/logs/")
    assert ran.returncode == 2
    assert ran.stderr.strip() == (
        f"error: s3://{bucket}/logs/: the object store does not answer (endpoint "
        f"{proxy.endpoint}): check that it is up and that AWS_ENDPOINT_URL points at it"
    )


_FAIL_EARLY = """
import sys
from warehouse import log_spill
log_spill.expect([sys.argv[1]])  # the download starts in the background
sys.stdin.readline()
raise SystemExit("the command failed before reading the log")
"""


def test_a_command_failing_early_does_not_wait_for_a_download_in_flight(
    proxy, s3_server, bucket, tmp_path
):
    """The download stalls (the proxy holds its GET); the command fails meanwhile: it exits
    without waiting for the bytes, and the spill keeps no half file."""
    import threading

    in_flight, release = threading.Event(), threading.Event()
    gets: list[str] = []

    def stall(method: str, path: str) -> None:
        if method == "GET":
            gets.append(path)
            in_flight.set()
            release.wait(600)

    proxy.set(hook=stall, match=_object("logs/first.eval"))
    spill = tmp_path / "spill"
    env = {**os.environ, **s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
           "GRADEBOOK_SPILL_DIR": str(spill)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAIL_EARLY, f"s3://{bucket}/logs/first.eval"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert in_flight.wait(300), proxy.seen()
        assert [p.name for p in spill.iterdir() if p.name.endswith(".part")]  # being written
        # the stalled GET is not answered until the process is gone: had it waited for the
        # download, it would have sat through the read timeout (60 s) and sent the GET again
        _, err = proc.communicate("go\n", timeout=300)
        assert len(gets) == 1, gets
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and "the command failed before reading the log" in err, err
    assert "Traceback" not in err, err
    assert list(spill.iterdir()) == []
