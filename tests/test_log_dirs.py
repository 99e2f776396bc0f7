"""A directory of logs is accepted where logs are, as Inspect's own commands accept a log dir;
and `score --scored-logs` that would overwrite the originals is refused before any scoring."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_world import run_eval
from typer.testing import CliRunner

from flows.cli import app
from warehouse import Warehouse
from warehouse.logs import find_logs

runner = CliRunner()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    run_eval(root, ["0", "1"], task_name="top", metadata={"verifiers": ["math"]})
    run_eval(root / "nested" / "deeper", ["0", "1", "2"], task_name="nested")
    (root / "logs.json").write_text("{}")  # Inspect's own listing file: not a log
    (root / "notes.json").write_text('{"not": "a log"}')
    (root / "clear\x1b[2J.json").write_text("[]")  # a name from elsewhere: shown, never sent
    return root


def test_ingest_takes_a_directory_of_logs_recursively(log_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    result = runner.invoke(app, ["ingest", str(log_dir), "--db", str(db)])
    assert result.exit_code == 0, result.output
    with Warehouse(db).read() as con:
        runs = dict(con.execute("SELECT task, n_samples FROM runs").fetchall())
    assert runs == {"top": 2, "nested": 3}
    # only logs are ingested; a .json file that is not one is named as skipped, not silently
    assert "notes.json" in result.output and "skipped" in result.output
    assert "notes.json: run" not in result.output


def test_a_directory_given_relative_skips_only_what_is_not_a_log(
    log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(log_dir.parent)
    paths, skipped = find_logs([log_dir.name])
    assert len(paths) == 2  # the two logs, named once each
    assert sorted(Path(s).name for s in skipped) == ["clear\x1b[2J.json", "notes.json"]


def test_a_directory_without_logs_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["ingest", str(tmp_path / "empty"), "--db", str(tmp_path / "w")])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no Inspect logs" in lines[0] and "empty" in lines[0]
    assert not (tmp_path / "w").exists()


def test_scored_copies_into_the_logs_own_dir_are_refused_before_scoring(
    log_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    [log] = sorted(log_dir.glob("*.eval"))
    result = runner.invoke(app, ["score", str(log), "--db", str(db), "--scored-logs", str(log_dir)])
    assert result.exit_code == 2
    assert "would overwrite the original log" in result.output
    assert not db.exists()  # nothing was ingested or scored first


@pytest.mark.slow
def test_score_takes_a_directory_of_logs(prefect_api, log_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    result = runner.invoke(
        app, ["score", str(log_dir / "nested"), str(log_dir), "--db", str(db), "--verifier", "math"]
    )
    assert result.exit_code == 0, result.output
    with Warehouse(db).read() as con:
        scored = dict(
            con.execute(
                "SELECT r.task, count(*) FROM scores s JOIN runs r USING (run_id) GROUP BY ALL"
            ).fetchall()
        )
    assert scored == {"top": 2, "nested": 3}
    assert "notes.json" in result.output and "clear\\x1b[2J.json" in result.output
    assert "\x1b" not in result.output
