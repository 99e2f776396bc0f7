"""The documentation cannot drift from the code: the CLI reference is the real `--help`, and the
sweep-config reference names every config key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import typer

from flows.config import ClusterConfig, ModelConfig, SweepConfig, TaskConfig
from gates.rules import GateRules

ROOT = Path(__file__).resolve().parents[1]
GEN_CLI = ROOT / "docs" / "gen_cli.py"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"


def _check(page: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GEN_CLI), "--check", "--page", str(page)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_reference_is_current() -> None:
    # A changed command, option or help text without `make docs` fails here (and in CI).
    result = _check(CLI_PAGE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cli_reference_covers_every_command() -> None:
    from flows.cli import app

    root = typer.main.get_command(app)
    headings = set(re.findall(r"^## (gradebook.*)$", CLI_PAGE.read_text(), re.M))
    ctx = root.context_class(root)
    for name in root.list_commands(ctx):
        assert f"gradebook {name}" in headings
        sub = root.get_command(ctx, name)
        if hasattr(sub, "list_commands"):
            for child in sub.list_commands(sub.context_class(sub)):
                assert f"gradebook {name} {child}" in headings


def test_stale_cli_reference_fails_the_check(tmp_path: Path) -> None:
    # The check must notice a page that no longer matches the code, and say what to run.
    stale = tmp_path / "cli.md"
    stale.write_text(CLI_PAGE.read_text().replace("--retry-unscored", "--retry-failed"))
    result = _check(stale)
    assert result.returncode == 1
    assert "stale" in result.stderr and "make docs" in result.stderr
    assert "--retry-unscored" in result.stdout  # the diff shows what changed


def test_config_reference_names_every_key() -> None:
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    documented = set(re.findall(r"`\[*([a-z_]+)\]*`", page))  # `key`, `[gates]`, `[[models]]`
    for model in (SweepConfig, ModelConfig, TaskConfig, ClusterConfig, GateRules):
        for name, field in model.model_fields.items():
            if field.exclude:  # not a config key (set by the loader)
                continue
            assert name in documented, f"{model.__name__}.{name} is not in docs/reference/config.md"
