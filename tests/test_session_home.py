"""The test session never writes into the user's home: another gradebook of the same user (a
checkout's `serve`, `make demo`, another test run) keeps its Prefect server, fingerprint cache
and Inspect data under ~/.local/state, ~/.cache, ~/.local/share and ~/.prefect."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest
from process_kit import cli_env, gradebook, make_log


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_session_points_every_state_dir_away_from_home():
    home = Path.home().resolve()
    for var in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "PREFECT_HOME"):
        assert home not in Path(os.environ[var]).resolve().parents, var
    for var in ("GRADEBOOK_CACHE_DIR", "GRADEBOOK_PREFECT_HOME"):
        assert home not in Path(os.environ[var]).resolve().parents, var


@pytest.mark.slow
def test_a_cli_run_in_the_session_writes_nothing_under_home(tmp_path):
    # The command runs with HOME pointing at an empty directory and the rest of the session's
    # environment: whatever it would write into the user's real home lands there instead.
    log = make_log(tmp_path / "logs", 4)
    home = tmp_path / "home"
    home.mkdir()
    env = cli_env(HOME=str(home))
    db = tmp_path / "gb.duckdb"
    ran = gradebook("score", str(log), "--db", str(db), env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM scores").fetchone() == (4,)
    assert _tree(home) == []
