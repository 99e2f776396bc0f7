"""The pipeline commands refuse bad input with one line and exit code 2, before any flow runs."""

from __future__ import annotations

from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def test_sweep_with_a_bad_config_exits_2_naming_file_and_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        'name = "x"\n[[models]]\nmodel = "gpt4"\n[[tasks]]\ntask = "t"\nverifiers = ["math"]\n'
    )
    result = runner.invoke(app, ["sweep", str(cfg)])
    assert result.exit_code == 2
    assert f"{cfg}: models[0] (gpt4).model: must be an Inspect model string" in result.output


def test_sweep_with_a_missing_config_exits_2(tmp_path):
    result = runner.invoke(app, ["sweep", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "no such file" in result.output


def test_score_missing_log_and_unknown_verifier_exit_2(tmp_path):
    result = runner.invoke(app, ["score", str(tmp_path / "x.eval")])
    assert result.exit_code == 2 and "log not found" in result.output
    log = tmp_path / "y.eval"
    log.write_bytes(b"")
    result = runner.invoke(app, ["score", str(log), "--verifier", "nope"])
    assert result.exit_code == 2 and "unknown verifier 'nope'" in result.output
    assert "--verifier-module" in result.output  # the fix, in the same line


def test_rescore_without_a_warehouse_exits_2(tmp_path):
    result = runner.invoke(app, ["rescore", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2 and "no warehouse here" in result.output


def test_verifiers_lists_the_registered_verifiers_with_fingerprints(tmp_path, monkeypatch):
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier

    # no warehouse named and none here: what this install knows (a named missing one is exit 2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRADEBOOK_DB", raising=False)
    result = runner.invoke(app, ["verifiers"])
    assert result.exit_code == 0
    assert "math" in result.output
    assert fingerprint(get_verifier("math")).digest[:12] in result.output
