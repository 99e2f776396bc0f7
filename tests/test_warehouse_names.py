"""Any file name works as a warehouse, through every command.

DuckDB names a database after its file, and `wh.duckdb` used to name a catalog that clashed
with the `wh` schema the tables live in. The names below are the ones DuckDB treats specially
(reserved catalogs, its own schemas), the clashing one, and names a shell or an encoding might
trip on.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from gate_world import run_eval
from typer.testing import CliRunner

from flows.cli import app
from warehouse import Warehouse

NAMES = ["wh", "WH", "main", "temp", "system", "memory", "information_schema", "pg_catalog",
         "with space", "ünïcødé 数据"]  # fmt: skip
runner = CliRunner()


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    answers = [f"ANSWER: {i}" for i in range(3)]
    return run_eval(tmp_path_factory.mktemp("names"), answers, metadata={"verifiers": ["math"]})


def _ok(*args: str, codes: tuple[int, ...] = (0,)) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code in codes, (args, result.output)
    assert "Ambiguous reference" not in result.output
    return result.output


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_command_works_on_a_warehouse_of_any_name(
    prefect_api, log: Path, tmp_path: Path, name: str
) -> None:
    db = tmp_path / f"{name}.duckdb"
    d = str(db)
    _ok("ingest", str(log), "--db", d)
    _ok("score", str(log), "--db", d)
    assert "3 " in _ok("verifiers", "--db", d)  # 3 samples graded by math
    _ok("rescore", "--dry-run", "--db", d)
    _ok("rescore", "--db", d)
    with Warehouse(db).read() as con:
        [(run_id,)] = con.execute("SELECT run_id FROM runs").fetchall()
    _ok("gate", "--run", run_id, "--db", d, codes=(0, 1))
    _ok("report", "--db", d, "--out", str(tmp_path / "r.html"))
    assert "3" in _ok("sql", "--db", d, "SELECT count(*) AS n FROM latest_scores")
    _ok("export", "--db", d, "--parquet", str(tmp_path / "pq"))
    assert (tmp_path / "pq" / "run_metrics.parquet").is_file()

    # a user's own DuckDB client: attached under a name of their choosing, every view works
    con = duckdb.connect()
    con.execute(f"ATTACH '{d}' AS mine (READ_ONLY)")
    assert con.execute("SELECT count(*) FROM mine.run_metrics").fetchone() == (1,)
    con.close()


def test_reads_nested_in_one_process_share_the_file_and_release_its_lock(
    log: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    db = tmp_path / "wh.duckdb"
    wh = Warehouse(db)
    wh.ingest_logs([log])
    with wh.read() as outer, Warehouse(str(db)).read() as inner:
        assert outer.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        assert inner.execute("SELECT count(*) FROM samples").fetchone() == (3,)
    # every connection closed: another process can take the write lock at once
    write = "import duckdb, sys; duckdb.connect(sys.argv[1]).execute('CHECKPOINT')"
    assert subprocess.run([sys.executable, "-c", write, str(db)]).returncode == 0
