"""An error line says what the user meant, in the user's words: a mistyped name gets the names
it was probably meant to be (a verifier, a task, a sweep), a percentage given for a fraction
says so, a generation setting beside a model says where it goes, and a zip that is not an
Inspect log is called that, not a KeyError."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_world import run_eval
from typer.testing import CliRunner

from flows.cli import app
from warehouse import Warehouse

runner = CliRunner()


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("typos")
    log = run_eval(root / "logs", ["0", "1"], metadata={"verifiers": ["math"], "sweep": "nightly"})
    db = root / "w.duckdb"
    [res] = Warehouse(db).ingest_logs([log])
    assert res.error is None, res.error
    return log, db


def _error_line(result) -> str:  # noqa: ANN001 - click's Result
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_mistyped_verifier_names_the_close_ones(swept: tuple[Path, Path]) -> None:
    log, db = swept
    line = _error_line(
        runner.invoke(app, ["score", str(log), "--db", str(db), "--verifier", "maths"])
    )
    assert "unknown verifier 'maths'" in line and "did you mean 'math'" in line


def test_a_mistyped_task_or_verifier_in_a_config_names_the_close_ones(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.toml"
    cfg.write_text(
        'name = "t"\n[[models]]\nname = "m"\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verifed"\n'
    )
    line = _error_line(runner.invoke(app, ["generate", str(cfg)]))
    assert "no task named 'math_verifed'" in line and "did you mean 'math_verified'" in line
    cfg.write_text(
        'name = "t"\n[[models]]\nname = "m"\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["maths"]\n'
    )
    line = _error_line(runner.invoke(app, ["generate", str(cfg)]))
    assert "'maths'" in line and "did you mean 'math'" in line


def test_a_mistyped_sweep_names_the_close_ones(swept: tuple[Path, Path]) -> None:
    _, db = swept
    result = runner.invoke(app, ["gate", "--db", str(db), "--sweep", "nightlly", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "sweep 'nightlly' (did you mean 'nightly'?) has no runs" in result.output


def test_a_percentage_for_a_fraction_says_so_in_the_flags_words(swept: tuple[Path, Path]) -> None:
    _, db = swept
    line = _error_line(
        runner.invoke(app, ["gate", "--db", str(db), "--min-accuracy", "75", "--dry-run"])
    )
    assert line.startswith("error: gate rule --min-accuracy 75: ") and "0.75 for 75%" in line
    assert "constrained-float" not in line


def test_a_generation_setting_beside_the_model_says_where_it_goes(tmp_path: Path) -> None:
    cfg = tmp_path / "temp.toml"
    cfg.write_text(
        'name = "t"\n[[models]]\nname = "m"\nmodel = "mockllm/model"\ntemprature = 0.5\n'
        '[[tasks]]\ntask = "math_verified"\n'
    )
    line = _error_line(runner.invoke(app, ["generate", str(cfg)]))
    assert "temprature: unknown key" in line and "'temperature'" in line
    assert "config = { temperature = ... }" in line


def test_a_zip_that_is_not_an_inspect_log_is_called_that(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "photos.eval"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("holiday.txt", "not a log")
    line = _error_line(runner.invoke(app, ["ingest", str(path), "--db", str(tmp_path / "w")]))
    assert "not an Inspect log" in line and "KeyError" not in line


@pytest.mark.parametrize(
    ("body", "raised"),
    [
        ("import sys\nsys.exit(7)\n", "SystemExit: 7"),
        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    ],
)
def test_a_verifier_module_that_exits_at_import_is_named_exit_2(
    swept: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    raised: str,
) -> None:
    log, db = swept
    (tmp_path / "quits_at_import.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["score", str(log), "--db", str(db), "--verifier-module", "quits_at_import"]
    line = _error_line(runner.invoke(app, args))
    assert "--verifier-module quits_at_import: importing it raised " + raised in line
    assert "quits_at_import.py:" in line  # where it raised


def test_an_unknown_verifier_is_said_without_loading_every_installed_package_again(
    swept: tuple[Path, Path], tmp_path: Path
) -> None:
    """The installed packages' scorer names are kept per environment: the second command
    naming a scorer none of them provides says so without importing their registries."""
    import os
    import subprocess
    import sys

    log, db = swept
    code = (
        "import sys\nimport flows.cli._app as app\nfrom flows.cli import main\n"
        "app._exit = lambda code: None  # report below, not os._exit\n"
        f"sys.argv = ['gradebook', 'score', {str(log)!r}, '--db', {str(db)!r}, "
        "'--verifier', 'exactt']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'inspect_evals'})\n"
        "print('RESULT', code, loaded)\n"
    )
    env = {**os.environ, "GRADEBOOK_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        [result] = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT")]
        return result, done.stderr

    first, err = run()
    assert first.startswith("RESULT 2") and "did you mean 'exact'" in err
    second, err = run()
    assert second == "RESULT 2 []", second  # no package's registry imported this time
    assert "unknown verifier 'exactt' (did you mean 'exact'?)" in err
