"""Bad input is exit 2 and ONE stderr line naming the input and what to do, for every command.

Each case runs the real console script in a subprocess (what a user's terminal and CI see) and
checks: the exit code, exactly one non-empty stderr line that names the bad input, no
traceback, the warehouse file untouched (bytes and mtime) or still absent, and no Prefect
server started for it (the command refused the input before any long work).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_kit import file_state, gradebook, shell_env
from gate_world import run_eval
from warehouse_logs import truncated

from warehouse import Warehouse

HOSTILE_NAME = "copied\x1b]0;owned\x07\x1b[2J"


@dataclass(frozen=True)
class World:
    root: Path
    log: Path  # a real log
    valid: Path  # a real warehouse holding that log's run
    notdb: Path  # a file that is not a DuckDB database
    broken_cfg: Path  # a sweep config whose verifier_modules entry raises on import
    nokey_cfg: Path  # a sweep config with an openai-api model whose API key is not set
    modules: Path  # where the broken verifier module lives (PYTHONPATH)
    cut: Path  # the real log, cut short (a copy that stopped half-way)
    cfgdir: Path  # a directory holding a sweep config, given where the config goes
    typo_cfg: Path  # a sweep config with a misspelt key
    hostile: Path  # the cut log under a name that would retitle and clear the terminal


def _config(path: Path, *, warehouse: Path, model: str, modules: list[str]) -> Path:
    path.write_text(
        textwrap.dedent(
            f"""\
            name = "bad"
            warehouse = "{warehouse}"
            log_dir = "{path.parent / "logs"}"
            verifier_modules = {modules!r}

            [[models]]
            model = "{model}"

            [[tasks]]
            task = "math_verified"
            limit = 1
            verifiers = ["math"]
            """
        )
    )
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("bad-input")
    log = run_eval(root / "logs", ["0", "1", "2"], metadata={"verifiers": ["math"]})
    valid = root / "valid.duckdb"
    [res] = Warehouse(valid).ingest_logs([log])
    assert res.error is None, res.error
    notdb = root / "notes.duckdb"
    notdb.write_bytes(b"these are my notes, not a database\n" * 100)
    modules = root / "modules"
    modules.mkdir()
    (modules / "broken_verifier.py").write_text(
        "VALUE = 1\nraise RuntimeError('the verifier module fails on purpose')\n"
    )
    broken_cfg = _config(
        root / "broken.toml",
        warehouse=root / "broken.duckdb",
        model="mockllm/model",
        modules=["broken_verifier"],
    )
    nokey_cfg = _config(
        root / "nokey.toml",
        warehouse=root / "nokey.duckdb",
        model="openai-api/nokeysvc/some-model",
        modules=[],
    )
    (root / "cut").mkdir()
    cut = truncated(log, root / "cut" / "copied-half-way.eval")
    hostile = truncated(log, root / "cut" / f"{HOSTILE_NAME}.eval")
    cfgdir = root / "configs"
    cfgdir.mkdir()
    (cfgdir / "nightly.toml").write_text('name = "n"\n')
    typo_cfg = root / "typo.toml"
    typo_cfg.write_text(
        'name = "typo"\nwarehouse = "typo.duckdb"\n[[models]]\nmodel = "mockllm/model"\n'
        'nmae = "m1"\n[[tasks]]\ntask = "math_verified"\n'
    )
    return World(
        root, log, valid, notdb, broken_cfg, nokey_cfg, modules, cut, cfgdir, typo_cfg, hostile
    )


# (case id, argv with placeholders, the file that must stay as it was, text the line must name)
CASES = [
    ("verifiers-notdb", ["verifiers", "--db", "{notdb}"], "notdb", "not a DuckDB database"),
    ("gate-notdb", ["gate", "--run", "x", "--db", "{notdb}"], "notdb", "not a DuckDB database"),
    (
        "report-notdb",
        ["report", "--db", "{notdb}", "--out", "{root}/r.html"],
        "notdb",
        "not a DuckDB database",
    ),
    ("ingest-notdb", ["ingest", "{log}", "--db", "{notdb}"], "notdb", "not a DuckDB database"),
    ("score-notdb", ["score", "{log}", "--db", "{notdb}"], "notdb", "not a DuckDB database"),
    ("rescore-notdb", ["rescore", "--db", "{notdb}"], "notdb", "not a DuckDB database"),
    (
        "rescore-dry-notdb",
        ["rescore", "--dry-run", "--db", "{notdb}"],
        "notdb",
        "not a DuckDB database",
    ),
    ("sql-notdb", ["sql", "SELECT 1", "--db", "{notdb}"], "notdb", "not a DuckDB database"),
    (
        "export-notdb",
        ["export", "--parquet", "{root}/pq", "--db", "{notdb}"],
        "notdb",
        "not a DuckDB database",
    ),
    ("sweep-module", ["sweep", "{broken_cfg}"], "broken_db", "broken_verifier"),
    ("generate-module", ["generate", "{broken_cfg}"], "broken_db", "broken_verifier"),
    ("serve-module", ["serve", "{broken_cfg}"], "broken_db", "broken_verifier"),
    ("gate-config-module", ["gate", "--config", "{broken_cfg}"], "broken_db", "broken_verifier"),
    ("sweep-no-key", ["sweep", "{nokey_cfg}"], "nokey_db", "NOKEYSVC_API_KEY"),
    ("generate-no-key", ["generate", "{nokey_cfg}"], "nokey_db", "NOKEYSVC_API_KEY"),
    ("rescore-unknown", ["rescore", "--db", "{valid}", "--scorer", "nope"], "valid", "'nope'"),
    (
        "rescore-dry-unknown",
        ["rescore", "--dry-run", "--db", "{valid}", "--scorer", "nope"],
        "valid",
        "'nope'",
    ),
    (
        "score-judge-no-grader",
        ["score", "{log}", "--db", "{valid}", "--verifier", "model_graded_qa"],
        "valid",
        "--model-role grader=MODEL",
    ),
    (
        "score-model-role-form",
        ["score", "{log}", "--db", "{valid}", "--model-role", "grader"],
        "valid",
        "--model-role 'grader'",
    ),
    (
        "score-model-role-no-judge",
        ["score", "{log}", "--db", "{valid}", "--model-role", "grader=openai-api/judge/j"],
        "valid",
        "no judge-graded scorer",
    ),
    (
        "rescore-model-role-json",
        ["rescore", "--db", "{valid}", "--model-role", "grader={{nope"],
        "valid",
        "not JSON",
    ),
    (
        "rescore-model-role-model",
        ["rescore", "--db", "{valid}", "--model-role", "grader=nomodel"],
        "valid",
        "Inspect model string",
    ),
    # a log cut short: not "EOCD not found" alone, but what the file is and what to do
    (
        "ingest-truncated",
        ["ingest", "{cut}", "--db", "{valid}"],
        "valid",
        "not a complete .eval archive: it ends before its zip directory",
    ),
    ("score-truncated", ["score", "{cut}", "--db", "{valid}"], "valid", "re-run its generation"),
    # a file name from elsewhere is hostile too: its control characters are shown, not sent
    (
        "score-hostile-file-name",
        ["score", "{hostile}", "--db", "{valid}"],
        "valid",
        "copied\\x1b]0;owned\\x07\\x1b[2J.eval: unreadable Inspect log",
    ),
    (
        "sweep-config-dir",
        ["sweep", "{cfgdir}"],
        "valid",
        "configs: is a directory, not a sweep config; pass the path of its .toml file (here: "
        "nightly.toml)",
    ),
    (
        "sweep-config-typo",
        ["sweep", "{typo_cfg}"],
        "valid",
        "models[0] (mockllm/model).nmae: unknown key; did you mean 'name'?",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "watched", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_exit_2_and_one_line(
    world: World, tmp_path: Path, argv: list[str], watched: str, names: str
) -> None:
    files = {
        "notdb": world.notdb,
        "valid": world.valid,
        "broken_db": world.root / "broken.duckdb",
        "nokey_db": world.root / "nokey.duckdb",
    }
    values = {
        "notdb": world.notdb,
        "valid": world.valid,
        "log": world.log,
        "root": tmp_path,
        "broken_cfg": world.broken_cfg,
        "nokey_cfg": world.nokey_cfg,
        "cut": world.cut,
        "cfgdir": world.cfgdir,
        "typo_cfg": world.typo_cfg,
        "hostile": world.hostile,
    }
    args = [a.format(**values) for a in argv]
    watched_file = files[watched]
    before = file_state(watched_file)
    home = tmp_path / "prefect-home"
    env = shell_env(
        home,
        PYTHONPATH=str(world.modules),
        # the openai-api model's server is named, its key is not
        NOKEYSVC_BASE_URL="http://127.0.0.1:9/v1",
    )
    ran = gradebook(*args, env=env, cwd=tmp_path, timeout=300)

    assert ran.code == 2, (ran.stdout, ran.stderr)
    assert "Traceback" not in ran.stderr + ran.stdout
    assert len(ran.stderr_lines) == 1, ran.stderr
    assert names in ran.stderr_lines[0]
    assert "[bold]" not in ran.stderr  # Inspect's rich markup is not shown raw
    assert "\x1b" not in ran.stderr + ran.stdout  # nothing steers the terminal
    assert file_state(watched_file) == before
    # refused before any long work: no Prefect server was started for it
    assert not home.exists() or not list(home.rglob("*.db"))


@pytest.mark.slow
def test_verifiers_of_a_warehouse_that_is_not_there_is_one_line(
    world: World, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.duckdb"
    ran = gradebook("verifiers", "--db", str(missing), env=shell_env(tmp_path), cwd=tmp_path)
    assert ran.code == 2  # a warehouse the user named: a typo, not "nothing graded yet"
    [line] = ran.stderr_lines
    assert str(missing) in line and "no such warehouse" in line
    assert not missing.exists()
    # with no --db and none in the directory: the installed verifiers, and a note
    ran = gradebook("verifiers", env=shell_env(tmp_path), cwd=tmp_path)
    assert ran.code == 0 and "math" in ran.stdout
    [line] = ran.stderr_lines
    assert "no warehouse here" in line
    assert not (tmp_path / "gradebook.duckdb").exists()
