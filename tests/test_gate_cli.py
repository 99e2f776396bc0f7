"""`gradebook gate` exit codes and messages, and the gate step as a real Prefect flow run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_world import exact, ingest, outage_judge, run_eval, score_run
from typer.testing import CliRunner

from flows.cli import app
from scorers.identity.fingerprint import fingerprint
from scorers.registry import Verifier, get_verifier, register
from warehouse import Warehouse

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    # A verifier registered under a name of its own, so its *current* fingerprint is computed
    # from code exactly as `gradebook gate` does it.
    register(Verifier("gate_exact", exact, "gate_world", label="exact match (test)"))
    current = fingerprint(get_verifier("gate_exact")).digest
    root = tmp_path_factory.mktemp("gatecli")
    wh = Warehouse(root / "g.duckdb")
    logs = root / "logs"
    good = ingest(wh, run_eval(logs, [str(i) for i in range(10)], task_name="cli_good"))
    score_run(wh, good, exact, scorer="gate_exact", fingerprint=current)
    bad = ingest(
        wh, run_eval(logs, ["x"] * 3 + [str(i) for i in range(3, 10)], task_name="cli_bad")
    )
    score_run(wh, bad, outage_judge, scorer="gate_exact", fingerprint=current)
    stale = ingest(wh, run_eval(logs, [str(i) for i in range(10)], task_name="cli_stale"))
    score_run(wh, stale, exact, scorer="gate_exact", fingerprint="0" * 64)
    return root / "g.duckdb", {"good": good, "bad": bad, "stale": stale}


def gate(*args: str):
    # wide enough that rich does not fold rule names across lines
    return CliRunner().invoke(app, ["gate", *args], env={"COLUMNS": "240"})


def test_exit_0_on_pass(db) -> None:
    path, runs = db
    res = gate("--db", str(path), "--run", runs["good"])
    assert res.exit_code == 0, res.output
    assert "PASS" in res.output and "max_unscored_rate[gate_exact]" in res.output


def test_exit_1_on_fail_names_the_rule_and_both_accuracies(db) -> None:
    path, runs = db
    res = gate("--db", str(path), "--run", runs["bad"])
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output
    assert "accuracy_strict 0.700" in res.output
    assert "accuracy over scored 1.000" in res.output


def test_exit_2_on_unknown_run(db) -> None:
    path, _ = db
    res = gate("--db", str(path), "--run", "does-not-exist")
    assert res.exit_code == 2
    assert "unknown run 'does-not-exist'" in res.output


def test_exit_2_after_verifier_change_says_to_rescore(db) -> None:
    path, runs = db
    res = gate("--db", str(path), "--run", runs["stale"], "--json")
    assert res.exit_code == 2
    payload = json.loads(res.output)
    [problem] = payload["runs"][0]["problems"]
    assert f"gradebook rescore --db {path} --scorer gate_exact`" in problem


def test_flags_override_rules_and_json_output(db) -> None:
    path, runs = db
    res = gate("--db", str(path), "--run", runs["bad"], "--max-unscored-rate", "0.5", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert payload["exit_code"] == 0
    assert payload["runs"][0]["rules"]["max_unscored_rate"] == 0.5
    worst = gate("--db", str(path), "--run", runs["good"], "--run", runs["bad"], "--dry-run")
    assert worst.exit_code == 1  # one failing run fails the gate


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-unscored-rate", "1.5"], "gate rule --max-unscored-rate 1.5: "),
        (["--metric", "f1"], "pass@K"),
        ([], "say what to gate"),
    ],
)
def test_bad_input_is_one_line_exit_2(db, args: list[str], message: str) -> None:
    path, runs = db
    run = ["--run", runs["good"]] if args else []
    res = gate("--db", str(path), *run, *args)
    assert res.exit_code == 2
    assert message in res.output


def test_missing_warehouse_is_exit_2(tmp_path: Path) -> None:
    res = gate("--db", str(tmp_path / "none.duckdb"), "--run", "x")
    assert res.exit_code == 2
    assert "no warehouse here" in res.output


def test_gate_flow_publishes_markdown_artifact(db, prefect_api) -> None:
    from prefect import get_client

    from flows.gate_stage import gate_flow

    path, runs = db
    current = fingerprint(get_verifier("gate_exact")).digest
    code = gate_flow(str(path), [runs["bad"]], fingerprints={"gate_exact": current})
    assert code == 1

    async def latest() -> str:
        async with get_client() as client:
            from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[f"gate-{runs['bad'].lower()}"])
                )
            )
            return arts[-1].data

    import asyncio

    markdown = asyncio.run(latest())
    assert "FAIL" in markdown
    assert "| max_unscored_rate[gate_exact] | 0.3 | <= 0.05 | **FAIL** |" in markdown
    assert "accuracy over scored 1" in markdown
