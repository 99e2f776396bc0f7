"""A judge outage, healed as a user is told to heal it: by the command gradebook prints.

The seed case (tests/judge_kit.py): 6 samples, 2 answered wrong; the judge fails on the 3
samples holding both wrong answers. Every command runs as a user's shell runs it (a fresh
environment, the console script by its path), and nothing but the sweep is given the config:
the heal and the gate rebuild the judge from the spec the warehouse stores.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import cli_kit
import judge_kit as jk
import pytest

from sweeps.mock_server import scripted_server
from warehouse import Warehouse

SECRET = "sk-judge-3f1c9e-never-stored"

SWEEP_TOML = """\
name = "judged"
log_dir = "logs"
warehouse = "w.duckdb"

[[models]]
name = "m"
model = "openai-api/gen/m"
base_url = "{gen_url}"
retry_on_error = 0

[[tasks]]
task = "sums.py@sums"
verifiers = ["model_graded_qa"]

[model_roles.grader]
model = "openai-api/judge/j"
base_url = "{judge_url}"
args = {{ max_retries = 0 }}
config = {{ max_retries = 1, attempt_timeout = 2, max_connections = 4 }}

[gates]
max_unscored_rate = 0.1
"""


def _shell(line: str, env: dict[str, str], cwd: Path) -> cli_kit.Ran:
    """A printed command line, run verbatim by a POSIX shell."""
    return cli_kit.run(["/bin/sh", "-c", line], env, cwd)


def _printed(stdout: str, word: str) -> str:
    """The printed command line that runs `gradebook WORD ...` (indented under its message)."""
    found = [
        line.strip()
        for line in stdout.splitlines()
        if line.startswith("  ") and re.search(rf"gradebook'? {word} ", line)
    ]
    assert found, f"no `{word}` command printed:\n{stdout}"
    return found[0]


def _stored_strings(db: Path) -> str:
    """Every text value of every warehouse table, as one string."""
    parts = []
    with Warehouse(db).read() as con:
        tables = con.execute(
            "SELECT table_schema, table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'wh' AND data_type IN ('VARCHAR', 'JSON')"
        ).fetchall()
        for schema, table, column in tables:
            rows = con.execute(f'SELECT "{column}"::VARCHAR FROM {schema}."{table}"').fetchall()
            parts += [r[0] for r in rows if r[0]]
    return "\n".join(parts)


@pytest.mark.slow
def test_the_printed_heal_rejudges_exactly_the_unscored_samples_then_the_gate_passes(
    prefect_api, tmp_path: Path
) -> None:
    from inspect_ai.log import read_eval_log

    judge = jk.Judge()
    (tmp_path / "sums.py").write_text(jk.TASK.format(questions=jk.QUESTIONS, targets=jk.TARGETS))
    with (
        scripted_server(jk.generator, models=["m"]) as gen,
        scripted_server(judge, models=["j"]) as judge_server,
    ):
        toml = SWEEP_TOML.format(gen_url=gen.base_url, judge_url=judge_server.base_url)
        (tmp_path / "sweep.toml").write_text(toml)
        env = cli_kit.shell_env(
            tmp_path / "home", api_url=prefect_api, GEN_API_KEY="test", JUDGE_API_KEY=SECRET
        )
        try:
            swept = cli_kit.gradebook("sweep", "sweep.toml", env=env, cwd=tmp_path)
            (tmp_path / "sweep.out").write_text(swept.stdout + swept.stderr)
            assert swept.code == 1, swept.stdout + swept.stderr
            # the summary: 3 unscored by the judge's failure, accuracy over scored 100%,
            # strict 50%, the gate fails
            [row] = [
                ln for ln in swept.stdout.splitlines() if "│" in ln and "model_graded_qa" in ln
            ]
            assert "3 (grader_failed 3)" in row and "100.0%" in row and "50.0%" in row, row
            assert "FAIL" in row
            assert "3 samples unscored (grader_failed 3): the judge did not answer" in swept.stdout
            heal, gate = _printed(swept.stdout, "rescore"), _printed(swept.stdout, "gate")
            assert "--retry-unscored" in heal and "--model-role" not in heal
            assert "--verifier-module" not in heal

            # while the judge is still down, the gate as printed fails on the 3 unscored
            down = _shell(gate, env, tmp_path)
            assert down.code == 1, down.stdout + down.stderr
            assert "3 unscored" in down.stdout and "gate: FAIL" in down.stdout
            assert _printed(down.stdout, "rescore") == heal  # it prints the same heal
        finally:
            judge.recover()

        # the judge is back: the heal, run verbatim, re-judges exactly those 3 samples and
        # never calls the model under test
        calls, generated = judge.count(), gen.count()
        assert generated == 6
        healed = _shell(heal, env, tmp_path)
        assert healed.code == 0, healed.stdout + healed.stderr
        assert sorted(judge.arrived[calls:]) == [1, 2, 3]
        assert gen.count() == generated
        assert "not checked" not in healed.stdout and "unscored (" not in healed.stdout

        passed = _shell(gate, env, tmp_path)
        assert passed.code == 0, passed.stdout + passed.stderr
        assert "accuracy_strict 0.667" in passed.stdout and "gate: PASS" in passed.stdout

        # `gate` on the warehouse alone, no flag naming the judge: evaluated, not CANNOT
        [run_id] = re.findall(r"run (\w{16,})", passed.stdout)[:1]
        bare = cli_kit.gradebook("gate", "--db", "w.duckdb", "--run", run_id,
                                 "--max-unscored-rate", "0.05", env=env, cwd=tmp_path)  # fmt: skip
        assert bare.code == 0, bare.stdout + bare.stderr
        assert "accuracy_strict 0.667" in bare.stdout

    # the judge's key never reached the warehouse or the log, only its variable's name
    stored = _stored_strings(tmp_path / "w.duckdb")
    assert SECRET not in stored and "JUDGE_API_KEY" in stored
    [log] = (tmp_path / "logs").glob("*.eval")
    assert SECRET.encode() not in log.read_bytes()
    assert SECRET not in read_eval_log(str(log)).model_dump_json()
    with Warehouse(tmp_path / "w.duckdb").read() as con:
        spec = json.loads(
            con.execute(
                "SELECT spec FROM verifier_specs WHERE name = 'model_graded_qa' AND latest"
            ).fetchone()[0]
        )
    assert spec["roles"]["grader"]["env"] == {"api_key": "JUDGE_API_KEY"}
    assert spec["roles"]["grader"]["base_url"].startswith("http://127.0.0.1:")
