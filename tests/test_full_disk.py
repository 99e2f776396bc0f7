"""A full disk or a read-only file system under the warehouse: `ingest` and `score` exit 2 with
one line, the file keeps what it held, and the same command finishes once there is room.

Real file systems: a small tmpfs filled to the last few KB, and a read-only bind mount. Both
need root (mount); locally the test skips without it, under CI it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_kit import file_state, gradebook, shell_env
from conftest import need
from gate_world import run_eval

from warehouse import Warehouse

pytestmark = pytest.mark.slow


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextmanager
def _mounted(point: Path, *args: str) -> Iterator[Path]:
    point.mkdir(parents=True, exist_ok=True)
    need(os.geteuid() == 0 and _mount(*args, str(point)), f"cannot mount {args} (needs root)")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], capture_output=True)
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@contextmanager
def full_tmpfs(root: Path, holding: Path, free_kb: int = 16) -> Iterator[Path]:
    """A tmpfs holding a copy of the warehouse `holding`, filled up to `free_kb` KB free."""
    size_kb = holding.stat().st_size // 1024 + 8192  # room for the work, once the filler goes
    with _mounted(root / "tmpfs", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs") as mnt:
        shutil.copy(holding, mnt / holding.name)
        stat = os.statvfs(mnt)
        spare = stat.f_bavail * stat.f_frsize - free_kb * 1024
        (mnt / "filler").write_bytes(b"\0" * max(spare, 0))
        yield mnt


def _counts(db: Path) -> dict[str, tuple[int, str]]:
    with Warehouse(db).read() as con:
        runs = con.execute("SELECT task, n_samples, ingest_state FROM runs").fetchall()
        scores = con.execute("SELECT count(*) FROM scores").fetchone()[0]
    return {task: (n, state) for task, n, state in runs} | {"scores": (scores, "")}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("disk-logs")
    meta = {"verifiers": ["math"]}
    first = run_eval(
        root / "a", [f"ANSWER: {i}" for i in range(4)], task_name="first", metadata=meta
    )
    # enough text that its samples do not fit in the space left
    big = [f"ANSWER: {i} " + "padding " * 2000 for i in range(40)]
    second = run_eval(root / "b", big, task_name="second", metadata=meta)
    return first, second


def _one_line(ran, cause: str) -> None:
    assert ran.code == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr + ran.stdout
    assert len(ran.stderr_lines) == 1, ran.stderr
    assert cause in ran.stderr_lines[0]


def test_a_full_disk_is_one_line_and_loses_nothing(logs, tmp_path: Path, prefect_api: str) -> None:
    first, second = logs
    seed = tmp_path / "w.duckdb"
    Warehouse(seed).ingest_logs([first])
    env = shell_env(tmp_path / "prefect-home", api_url=prefect_api)
    with full_tmpfs(tmp_path, seed) as mnt:
        db = mnt / "w.duckdb"
        before = _counts(db)

        ran = gradebook("ingest", str(second), "--db", str(db), env=env, cwd=tmp_path)
        _one_line(ran, "no space left on device")
        assert _counts(db)["first"] == before["first"]  # what it held is there

        ran = gradebook("score", str(first), "--db", str(db), env=env, cwd=tmp_path)
        _one_line(ran, "no space left on device")
        assert _counts(db)["scores"] == before["scores"]

        # room again: the same commands finish the work
        (mnt / "filler").unlink()
        assert gradebook("ingest", str(second), "--db", str(db), env=env, cwd=tmp_path).code == 0
        assert gradebook("score", str(first), "--db", str(db), env=env, cwd=tmp_path).code == 0
        after = _counts(db)
    assert after["first"] == before["first"]
    assert after["second"] == (40, "complete")
    assert after["scores"][0] == 4


def test_a_read_only_file_system_is_one_line_and_changes_nothing(
    logs, tmp_path: Path, prefect_api: str
) -> None:
    first, second = logs
    src = tmp_path / "src"
    src.mkdir()
    Warehouse(src / "w.duckdb").ingest_logs([first])
    before = file_state(src / "w.duckdb")
    env = shell_env(tmp_path / "prefect-home", api_url=prefect_api)
    with _mounted(tmp_path / "ro", "--bind", str(src)) as ro:
        need(_mount("-o", "remount,bind,ro", str(ro)), "cannot remount read-only")
        db = ro / "w.duckdb"
        ran = gradebook("ingest", str(second), "--db", str(db), env=env, cwd=tmp_path)
        _one_line(ran, "read-only file system")
        ran = gradebook("score", str(first), "--db", str(db), env=env, cwd=tmp_path)
        _one_line(ran, "read-only file system")
        # reading still works: a no-op ingest and a query need no write
        assert gradebook("ingest", str(first), "--db", str(db), env=env, cwd=tmp_path).code == 0
        assert gradebook("sql", "SELECT 1", "--db", str(db), env=env, cwd=tmp_path).code == 0
    assert file_state(src / "w.duckdb") == before
