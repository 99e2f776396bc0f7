"""Re-ingest of an unchanged local log answers from the file's stat, without hashing it.

Real Inspect logs (mockllm eval()), real DuckDB files. Whether the log was hashed is observed by
counting calls of `warehouse.logs.file_digest`, the only place ingest reads a whole log.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import duckdb
import fsspec
import pytest
from warehouse_logs import make_log, reader_holding, variant

from warehouse import SCHEMA_VERSION, Warehouse, logs
from warehouse.log_stamps import RACY_WINDOW_NS
from warehouse.migrations import migrate

HOUR_NS = 3600 * 10**9
STAMP_COLUMNS = ("log_mtime_ns", "log_inode", "log_seen_at")


@pytest.fixture(scope="module")
def base_log(tmp_path_factory):
    """6 samples x 2 epochs; samples q0 and q3 error at generation time."""
    return make_log(tmp_path_factory.mktemp("logs"))


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The paths ingest hashes from now on, in order."""
    calls: list[str] = []
    real = logs.file_digest
    monkeypatch.setattr(logs, "file_digest", lambda path: calls.append(path) or real(path))
    return calls


def rows(wh: Warehouse, sql: str, params=None) -> list[tuple]:
    with wh.read() as con:
        return con.execute(sql, params or []).fetchall()


def settled(path: Path, ago_ns: int = HOUR_NS) -> Path:
    """Give the file the mtime of a log finished `ago_ns` ago (its content is untouched)."""
    t = time.time_ns() - ago_ns
    os.utime(path, ns=(t, t))
    return path


def settled_copy(base_log, path: Path) -> Path:
    shutil.copy(base_log.location, path)
    return settled(path)


def test_reingest_of_an_unchanged_log_does_not_hash_it(base_log, tmp_path, hashed):
    path = settled_copy(base_log, tmp_path / "a.eval")
    wh = Warehouse(tmp_path / "g.duckdb")
    [first] = wh.ingest_logs([path])
    assert (first.samples_added, hashed) == (12, [str(path)])
    run_before = rows(wh, "SELECT * FROM runs")

    for _ in range(2):  # a new Warehouse, as a new `gradebook score` process opens it
        [again] = Warehouse(wh.path).ingest_logs([path])
        assert (again.samples_added, again.samples_total, again.error) == (0, 12, None)
        assert (again.run_id, again.status) == (base_log.eval.eval_id, "success")
    assert hashed == [str(path)]
    assert rows(wh, "SELECT * FROM runs") == run_before  # not even ingested_at moved
    assert rows(wh, "SELECT count(*) FROM samples") == [(12,)]


def test_reingest_of_an_unchanged_log_imports_no_inspect(base_log, tmp_path):
    """A re-run over logs already in (`gradebook score` after a sweep) decides from the
    archive's header member and a stat: Inspect, seconds of import, is not loaded for it."""
    import subprocess
    import sys

    path = settled_copy(base_log, tmp_path / "a.eval")
    db = tmp_path / "g.duckdb"
    Warehouse(db).ingest_logs([path])
    code = (
        "import sys\n"
        "from warehouse import Warehouse\n"
        f"[r] = Warehouse({str(db)!r}).ingest_logs([{str(path)!r}])\n"
        "print(r.samples_added, r.samples_total, r.run_id, r.task, r.status, r.error)\n"
        "print('inspect_ai' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True).stdout.split("\n")  # fmt: skip
    task = base_log.eval.task
    assert out[:2] == [f"0 12 {base_log.eval.eval_id} {task} success None", "False"], out


def _same_size_rewrite(base_log, path: Path, status: str) -> bytes:
    """The bytes of `path` (a .json log) with another status: same size, different content."""
    other = variant(base_log, path.with_suffix(".other.json"), eval_id="rw1", status=status)
    data = other.read_bytes()
    other.unlink()
    assert len(data) == path.stat().st_size and data != path.read_bytes()
    return data


@pytest.mark.parametrize("how", ["rewritten in place", "replaced, mtime kept", "grown, mtime kept"])
def test_a_changed_log_is_hashed_and_ingested_again(base_log, tmp_path, hashed, how):
    path = tmp_path / "rw.json"
    variant(base_log, path, eval_id="rw1", keep=5 if how == "grown, mtime kept" else None)
    wh = Warehouse(tmp_path / "g.duckdb")
    settled(path)
    wh.ingest_logs([path])
    recorded = path.stat()

    if how == "rewritten in place":  # same inode and size, the mtime moves to now
        path.write_bytes(_same_size_rewrite(base_log, path, "started"))
    elif how == "replaced, mtime kept":  # a copy renamed over the log (cp -p, rsync -t)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(_same_size_rewrite(base_log, path, "started"))
        os.utime(tmp, ns=(recorded.st_atime_ns, recorded.st_mtime_ns))
        os.replace(tmp, path)
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (
            recorded.st_size,
            recorded.st_mtime_ns,
        )
    else:  # a resumed run wrote more samples; even with the old mtime the size tells
        variant(base_log, path, eval_id="rw1")
        os.utime(path, ns=(recorded.st_atime_ns, recorded.st_mtime_ns))

    [again] = wh.ingest_logs([path])
    assert hashed == [str(path), str(path)]
    sha256, size = logs.file_digest(str(path))
    assert rows(wh, "SELECT log_sha256, log_size FROM runs") == [(sha256, size)]
    if how == "grown, mtime kept":
        assert (again.samples_added, again.samples_total) == (7, 12)
    else:
        assert (again.status, again.samples_added, again.samples_total) == ("started", 0, 12)
        assert rows(wh, "SELECT status, ingest_state FROM runs") == [("started", "complete")]


def test_a_log_recorded_while_racy_is_hashed_until_seen_settled(base_log, tmp_path, hashed):
    path = tmp_path / "fresh.eval"
    shutil.copy(base_log.location, path)
    settled(path, ago_ns=0)  # just written, as when a sweep ingests the log generate wrote
    wh = Warehouse(tmp_path / "g.duckdb")
    wh.ingest_logs([path])
    [(mtime_ns, seen_us)] = rows(wh, "SELECT log_mtime_ns, epoch_us(log_seen_at) FROM runs")
    assert mtime_ns > seen_us * 1000 - RACY_WINDOW_NS  # recorded within the racy window

    # the same stat, but recorded too soon after the last write to vouch for the content
    [again] = wh.ingest_logs([path])
    assert (again.samples_added, again.samples_total, hashed) == (0, 12, [str(path)] * 2)

    time.sleep(RACY_WINDOW_NS / 1e9 + 0.1)
    wh.ingest_logs([path])  # hashed once more, now settled: that stat is recorded
    assert len(hashed) == 3
    [again] = wh.ingest_logs([path])
    assert (again.samples_added, again.samples_total, len(hashed)) == (0, 12, 3)


# holds a read-only connection (which bars writers) until told to go, or for at most 20 s
def test_recording_a_new_stat_never_waits_for_the_lock(base_log, tmp_path, hashed):
    # touched (same bytes, new mtime): hashed, and the new stat is recorded only when the file
    # is free; with a reader holding it, the no-op answers without waiting for the reader
    path = settled_copy(base_log, tmp_path / "t.eval")
    wh = Warehouse(tmp_path / "g.duckdb", lock_timeout_s=60)
    wh.ingest_logs([path])
    settled(path, ago_ns=HOUR_NS // 2)
    with reader_holding(wh.path) as reader:
        [again] = wh.ingest_logs([path])
        assert (again.samples_added, again.samples_total, again.error) == (0, 12, None)
        # had it waited for the lock, the reader would have gone and the stat been recorded
        assert reader.poll() is None
    assert len(hashed) == 2
    wh.ingest_logs([path])  # the lock is free: hashed, and the stat recorded this time
    assert len(hashed) == 3
    wh.ingest_logs([path])
    assert len(hashed) == 3
    assert rows(wh, "SELECT log_mtime_ns FROM runs") == [(path.stat().st_mtime_ns,)]


def test_every_location_a_log_is_seen_at_is_recorded_once(base_log, tmp_path, hashed, monkeypatch):
    """One run however many copies of its log are ingested; `log_copies` names each place it
    was read from with the bytes it held there, and a re-run over known copies writes nothing
    (a reader holding the file does not stop it)."""
    a = settled_copy(base_log, tmp_path / "a.eval")
    b = settled_copy(base_log, tmp_path / "b.eval")
    wh = Warehouse(tmp_path / "g.duckdb", lock_timeout_s=60)
    wh.ingest_logs([a])
    [copy] = wh.ingest_logs([b])  # hashed: the same bytes, so no new sample, a new location
    assert (copy.samples_added, copy.samples_total) == (0, 12)
    # renamed: its stat proves it is the file last hashed, so it is not read again, but the
    # new name is where it is now
    moved = b.rename(tmp_path / "moved.eval")
    assert wh.ingest_logs([moved])[0].samples_total == 12
    assert hashed == [str(a), str(b)]

    (sha,) = {r[0] for r in rows(wh, "SELECT log_sha256 FROM runs")}
    seen = "SELECT run_id, location, log_sha256, log_size FROM log_copies ORDER BY first_seen, location"
    expect = [(base_log.eval.eval_id, str(p), sha, a.stat().st_size) for p in (a, b, moved)]
    assert rows(wh, seen) == expect
    assert rows(wh, "SELECT count(*) FROM runs") == [(1,)]

    with reader_holding(wh.path) as reader:  # a write would wait for the reader to go
        for p in (a, moved):
            assert wh.ingest_logs([p])[0].samples_total == 12
        assert reader.poll() is None
    assert rows(wh, seen) == expect

    # a relative name is recorded absolute: the same file from another directory is one place
    monkeypatch.chdir(tmp_path)
    wh.ingest_logs(["a.eval"])
    assert rows(wh, seen) == expect


def test_a_remote_log_is_hashed_every_time(base_log, s3_bucket, tmp_path, hashed):
    url = f"{s3_bucket}/{tmp_path.name}/r.eval"
    with fsspec.open(url, "wb") as f:
        f.write(Path(base_log.location).read_bytes())
    wh = Warehouse(tmp_path / "g.duckdb")
    wh.ingest_logs([url])
    [again] = wh.ingest_logs([url])
    assert (again.samples_added, again.samples_total, hashed) == (0, 12, [url, url])
    assert rows(wh, f"SELECT {', '.join(STAMP_COLUMNS)} FROM runs") == [(None, None, None)]


def test_migration_from_v6_keeps_runs_and_then_skips_the_hash(base_log, tmp_path, hashed):
    path = settled_copy(base_log, tmp_path / "m.eval")
    # what a v6 gradebook stored for this log: the same rows, without the stamp columns
    current = Warehouse(tmp_path / "current.duckdb")
    current.ingest_logs([path])
    old = tmp_path / "v6.duckdb"
    con = duckdb.connect(str(old))
    migrate(con, str(old), target=6)
    con.execute(f"ATTACH '{current.path}' AS cur (READ_ONLY)")
    # the columns a v6 table had; later migrations (the stamps, and others) add more
    v6_columns = {
        table: ", ".join(
            name
            for (name,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_catalog = 'v6' "
                "AND table_schema = 'wh' AND table_name = ? ORDER BY ordinal_position",
                [table],
            ).fetchall()
        )
        for table in ("runs", "samples", "messages")
    }
    for table, columns in v6_columns.items():
        con.execute(f"INSERT INTO wh.{table} SELECT {columns} FROM cur.wh.{table}")
    runs_before = con.execute("SELECT * FROM wh.runs").fetchall()
    con.close()

    wh = Warehouse(old)
    assert wh.schema_version() == SCHEMA_VERSION
    stamp = ", ".join(STAMP_COLUMNS)
    assert rows(wh, f"SELECT {v6_columns['runs']} FROM runs") == runs_before
    assert rows(wh, f"SELECT {stamp} FROM runs") == [(None, None, None)]
    assert rows(wh, "SELECT count(*) FROM samples UNION ALL SELECT count(*) FROM messages") == (
        rows(current, "SELECT count(*) FROM samples UNION ALL SELECT count(*) FROM messages")
    )

    hashed.clear()
    [again] = wh.ingest_logs([path])  # no stat recorded yet: hashed, and it is recorded
    assert (again.samples_added, again.samples_total, hashed) == (0, 12, [str(path)])
    [again] = wh.ingest_logs([path])
    assert (again.samples_added, again.samples_total, hashed) == (0, 12, [str(path)])
    assert rows(wh, f"SELECT {v6_columns['runs']} FROM runs") == runs_before
