"""Logs in S3-compatible object storage: ingest and score take s3:// URLs (a prefix is listed
like a directory), scored copies are uploaded whole, and the same log read from a local path and
from its copy in a bucket is one run. Against a real S3 server (moto's) on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warehouse_logs import make_log, variant

from warehouse import Warehouse

GRADEBOOK = [sys.executable, "-m", "flows.cli"]


def _gradebook(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GRADEBOOK, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **env},
    )


@pytest.fixture(scope="module")
def two_logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two real logs of different runs (6 samples x 2 epochs each, every 3rd one errored)."""
    base = make_log(tmp_path_factory.mktemp("made"))
    out = tmp_path_factory.mktemp("logs")
    other = variant(base, out / "second.eval", eval_id="second-run")
    first = out / "first.eval"
    first.write_bytes(Path(base.location).read_bytes())
    return [first, other]


def _upload(s3, bucket: str, files: list[Path], prefix: str) -> list[str]:
    client = s3.client()
    name = bucket.removeprefix("s3://")
    for f in files:
        client.upload_file(str(f), name, f"{prefix}/{f.name}")
    return [f"{bucket}/{prefix}/{f.name}" for f in files]


def test_ingest_lists_a_prefix_like_a_directory(s3_server, s3_bucket, two_logs, tmp_path):
    urls = _upload(s3_server, s3_bucket, two_logs, "sweep/logs")
    bucket = s3_bucket.removeprefix("s3://")
    s3_server.client().put_object(Bucket=bucket, Key="sweep/logs/notes.txt", Body=b"not a log")
    db = tmp_path / "g.duckdb"

    ran = _gradebook("ingest", "--db", str(db), f"{s3_bucket}/sweep/logs/", env=s3_server.env(),
                     cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert [ln.split(": run ")[0] for ln in ran.stdout.splitlines() if ": run " in ln] == urls
    assert f"{s3_bucket}/sweep/logs/notes.txt" in ran.stdout + ran.stderr  # said it was skipped
    with Warehouse(db).read() as con:
        runs = con.execute("SELECT log_path, n_samples FROM runs ORDER BY log_path").fetchall()
    assert runs == [(urls[0], 12), (urls[1], 12)]
    assert not (tmp_path / "s3:").exists()  # never a local folder named after the scheme

    again = _gradebook("ingest", "--db", str(db), f"{s3_bucket}/sweep/logs",
                       env=s3_server.env(), cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("+0 samples (12 stored)") == 2, again.stdout


def test_a_url_gradebook_cannot_read_is_one_line_naming_it(tmp_path):
    for cmd in (["ingest", "--db", str(tmp_path / "g.duckdb")], ["score", "--db", str(tmp_path / "g.duckdb")]):  # fmt: skip
        ran = _gradebook(*cmd, "gs://bucket/logs/", env={}, cwd=tmp_path)
        assert ran.returncode == 2, ran.stdout + ran.stderr
        assert (
            ran.stderr.strip()
            .splitlines()[-1]
            .endswith(
                "log gs://bucket/logs/: gradebook reads and writes s3://, file:// URLs and local "
                "paths, not gs://"
            )
        ), ran.stderr
        assert "Traceback" not in ran.stderr
    assert not (tmp_path / "gs:").exists()


def test_a_missing_bucket_and_a_missing_credential_are_one_line_each(s3_server, tmp_path):
    ran = _gradebook("ingest", "--db", str(tmp_path / "g.duckdb"), "s3://no-such-bucket-here/x/",
                     env=s3_server.env(), cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 2
    assert ran.stderr.strip() == (
        "error: s3://no-such-bucket-here/x/: no such bucket: create it, or check the URL"
    ), ran.stderr
    env = {k: v for k, v in s3_server.env().items() if not k.startswith("AWS_SECRET")}
    env["AWS_ACCESS_KEY_ID"] = ""
    ran = _gradebook("ingest", "--db", str(tmp_path / "g.duckdb"), "s3://some-bucket/x/",
                     env=env, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 2
    assert ran.stderr.strip().startswith(
        "error: s3://some-bucket/x/: no credentials for the object store: set AWS_ACCESS_KEY_ID"
    ), ran.stderr


@pytest.mark.slow
def test_score_a_prefix_into_a_fresh_warehouse_with_scored_copies_in_the_bucket(
    prefect_api, s3_server, s3_bucket, two_logs, tmp_path
):
    urls = _upload(s3_server, s3_bucket, two_logs, "sweep/logs")
    db = tmp_path / "fresh.duckdb"
    ran = _gradebook("score", f"{s3_bucket}/sweep/logs/", "--db", str(db), "--verifier", "math",
                     "--scored-logs", f"{s3_bucket}/sweep/scored", env=s3_server.env(),
                     cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    with Warehouse(db).read() as con:
        runs = con.execute("SELECT log_path FROM runs ORDER BY 1").fetchall()
        scored = con.execute(
            "SELECT count(*) FROM scores WHERE scorer = 'math' GROUP BY run_id"
        ).fetchall()
    assert runs == [(u,) for u in urls]
    assert scored == [(12,), (12,)]
    # the copies are whole logs in the bucket, with gradebook's scores, read by Inspect itself
    from inspect_ai.log import read_eval_log

    from flows.runtime.envvars import environ_set

    with environ_set(s3_server.env()):
        for f in two_logs:
            copy = read_eval_log(f"{s3_bucket}/sweep/scored/{f.name}")
            assert copy.results is not None and copy.results.scores[0].name == "math"
            assert all("math" in (s.scores or {}) for s in copy.samples or [])


@pytest.mark.slow
def test_a_sweep_with_its_log_dir_in_a_bucket(prefect_api, s3_server, s3_bucket, tmp_path):
    """Inspect writes the log into the bucket itself; the sweep ingests and scores it from
    there and uploads the scored copy beside it; nothing lands in a local folder named 's3:'."""
    from cli_kit import gradebook, shell_env
    from flows_kit import TASK_SPEC
    from inspect_ai.log import read_eval_log

    from flows.runtime.envvars import environ_set

    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'name = "bucketed"\nlog_dir = "{s3_bucket}/sweep/logs"\nwarehouse = "w.duckdb"\n'
        '[[models]]\nname = "m1"\nmodel = "mockllm/model"\nargs_from = "cluster_kit:mock_args"\n'
        f'[[tasks]]\ntask = "{TASK_SPEC}"\nargs = {{ n = 4 }}\nverifiers = ["math"]\n'
    )
    env = shell_env(tmp_path / "ph", api_url=prefect_api, PYTHONPATH=str(Path(__file__).parent),
                    **s3_server.env())  # fmt: skip
    ran = gradebook("sweep", str(cfg), env=env, cwd=tmp_path)
    assert ran.code == 0, ran.stdout + ran.stderr
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "logs").exists()
    bucket = s3_bucket.removeprefix("s3://")
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    [log_key] = [k for k in keys if k.startswith("sweep/logs/") and k.endswith(".eval")]
    name = log_key.rsplit("/", 1)[1]
    assert f"sweep/logs-scored/{name}" in keys
    assert f"inspect view --log-dir {s3_bucket}/sweep/logs-scored" in " ".join(ran.stdout.split())
    with Warehouse(tmp_path / "w.duckdb").read() as con:
        [(log_path, scored)] = con.execute(
            "SELECT log_path, (SELECT count(*) FROM scores s WHERE s.run_id = r.run_id "
            "AND scorer = 'math') FROM runs r"
        ).fetchall()
    assert (log_path, scored) == (f"{s3_bucket}/{log_key}", 4)
    with environ_set(s3_server.env()):
        copy = read_eval_log(f"{s3_bucket}/sweep/logs-scored/{name}")
    verdicts = {s.id: s.scores["math"].value for s in copy.samples or []}
    assert verdicts == {1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0}


def test_a_log_ingested_from_disk_then_from_its_bucket_copy_is_one_run(
    s3_server, s3_bucket, two_logs, tmp_path
):
    db = tmp_path / "g.duckdb"
    [url] = _upload(s3_server, s3_bucket, two_logs[:1], "copies")
    first = _gradebook(
        "ingest", "--db", str(db), str(two_logs[0]), env=s3_server.env(), cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    again = _gradebook("ingest", "--db", str(db), url, env=s3_server.env(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "+0 samples (12 stored)" in again.stdout, again.stdout
    with Warehouse(db).read() as con:
        assert con.execute("SELECT count(*), sum(n_samples) FROM runs").fetchone() == (1, 12)
        assert con.execute("SELECT count(*) FROM samples").fetchone() == (12,)
    # the warehouse keeps where each copy was seen, with the same bytes in both places
    seen = "SELECT location, log_sha256 FROM log_copies ORDER BY first_seen"
    sql = _gradebook("sql", "--db", str(db), "--format", "json", seen, env={}, cwd=tmp_path)
    assert sql.returncode == 0, sql.stderr
    sha = hashlib.sha256(two_logs[0].read_bytes()).hexdigest()
    assert json.loads(sql.stdout) == [
        {"location": str(two_logs[0]), "log_sha256": sha},
        {"location": url, "log_sha256": sha},
    ]
    # read again from either place: nothing new is recorded
    for where in (url, str(two_logs[0])):
        ran = _gradebook("ingest", "--db", str(db), where, env=s3_server.env(), cwd=tmp_path)
        assert ran.returncode == 0 and "+0 samples (12 stored)" in ran.stdout, ran.stderr
    assert json.loads(
        _gradebook("sql", "--db", str(db), "--format", "json", seen, env={}, cwd=tmp_path).stdout
    ) == [{"location": str(two_logs[0]), "log_sha256": sha}, {"location": url, "log_sha256": sha}]


@pytest.mark.slow
def test_ingest_score_rescore_and_gate_with_the_logs_in_a_bucket(
    prefect_api, s3_server, s3_bucket, two_logs, tmp_path
):
    """Each command from the CLI, as a user with the logs only in a bucket runs them: ingest and
    score take the prefix; rescore and gate (which read the warehouse, not logs) take a sweep
    config whose log_dir is the prefix, and what they print names the logs by their URLs."""
    from cluster_kit import SLOW_VERIFIER
    from flows_kit import TASK_SPEC

    urls = _upload(s3_server, s3_bucket, two_logs, "e2e/logs")
    prefix = f"{s3_bucket}/e2e/logs/"
    mods = tmp_path / "mods"
    mods.mkdir()
    verifier = mods / "lastword.py"
    verifier.write_text(SLOW_VERIFIER.format(name="lastword", delay=0.0))
    env = {**s3_server.env(), "PYTHONPATH": os.pathsep.join([str(mods), str(Path(__file__).parent),
                                                            os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    db = tmp_path / "g.duckdb"
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'name = "bucketed"\nlog_dir = "{prefix}"\nwarehouse = "{db}"\n'
        'verifier_modules = ["lastword"]\n'
        '[[models]]\nname = "m1"\nmodel = "mockllm/model"\n'
        f'[[tasks]]\ntask = "{TASK_SPEC}"\nverifiers = ["lastword"]\n'
        "[gates]\nmin_accuracy = 0.5\nmax_regression = 0.5\n"
    )

    def grades() -> dict[str, tuple]:
        with Warehouse(db).read() as con:
            return dict(
                con.execute(
                    "SELECT run_id, (count(*), sum(value), count(DISTINCT fingerprint)) "
                    "FROM scores WHERE scorer = 'lastword' GROUP BY run_id"
                ).fetchall()
            )

    ingested = _gradebook("ingest", "--db", str(db), prefix, env=env, cwd=tmp_path)
    assert ingested.returncode == 0, ingested.stdout + ingested.stderr
    assert ingested.stdout.count("+12 samples (12 stored)") == 2, ingested.stdout

    scored = _gradebook("score", urls[0], "--db", str(db), "--verifier", "lastword",
                        "--verifier-module", "lastword", env=env, cwd=tmp_path)  # fmt: skip
    assert scored.returncode == 0, scored.stdout + scored.stderr
    [first_run] = grades()
    # 4 of the 12 samples errored at generation; the other 8 answered right
    assert grades() == {first_run: (12, 8.0, 1)}

    # the second run has no grades yet: the gate cannot evaluate it and says to score its log,
    # named by its URL
    gate = _gradebook("gate", "--config", str(cfg), "--run", "second-run", env=env, cwd=tmp_path)
    assert gate.returncode == 2, gate.stdout + gate.stderr
    assert f"gradebook score {urls[1]} --db {db}" in " ".join(gate.stdout.split()), gate.stdout

    # the verifier is edited (now nothing is right): rescore re-grades from the warehouse alone
    verifier.write_text(verifier.read_text().replace("ok = answer ==", "ok = False and answer =="))
    rescored = _gradebook("rescore", "--config", str(cfg), env=env, cwd=tmp_path)
    assert rescored.returncode == 0, rescored.stdout + rescored.stderr
    assert grades() == {first_run: (24, 8.0, 2)}

    # the whole prefix scored by the current verifier, then gated: the first run fails its
    # accuracy floor, the second too
    scored = _gradebook("score", prefix, "--db", str(db), "--verifier", "lastword",
                        "--verifier-module", "lastword", env=env, cwd=tmp_path)  # fmt: skip
    assert scored.returncode == 0, scored.stdout + scored.stderr
    assert grades() == {first_run: (24, 8.0, 2), "second-run": (12, 0.0, 1)}
    gate = _gradebook("gate", "--config", str(cfg), "--run", first_run, "--run", "second-run",
                      "--json", env=env, cwd=tmp_path)  # fmt: skip
    assert gate.returncode == 1, gate.stdout + gate.stderr
    verdicts = {r["run_id"]: r["exit_code"] for r in json.loads(gate.stdout)["runs"]}
    assert verdicts == {first_run: 1, "second-run": 1}
    with Warehouse(db).read() as con:
        # each gate recorded its decision (the first one's too: it could not evaluate)
        assert con.execute("SELECT count(*) FROM gates").fetchone() == (3,)
        paths = con.execute("SELECT log_path FROM runs ORDER BY log_path").fetchall()
    assert paths == [(u,) for u in urls]
    assert not (tmp_path / "s3:").exists()
