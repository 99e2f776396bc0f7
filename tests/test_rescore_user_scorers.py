"""A user's own Inspect scorer, edited after the sweep that graded with it (issue 38, item 1).

`rescore` given only the warehouse cannot load an edited scorer file on the warehouse's word:
it names each verifier it could not check and the command that checks it, and exits 2 (never
"every verifier's fingerprint is current"). That command, run as printed, re-scores them; so
does `rescore --config SWEEP.toml`, which loads what the config names (the scorer file its
`verifiers` name, the task's own scorer) and takes its warehouse as the default `--db`.

Each command runs as a user's shell runs it (the console script by its path, a fresh
environment): real Inspect generation with mockllm, real Prefect flow runs, grading workers and
DuckDB. One task is scored by the scorer the config names (`colors.py@colour_word`), the other
by its own scorer with a param (a variant: `colour_word[ignore_case=true]`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import cli_kit
import pytest

from warehouse import Warehouse

pytestmark = pytest.mark.slow

COLORS = textwrap.dedent(
    """\
    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState, generate

    WORDS = ("red", "blue")


    def _samples():
        return MemoryDataset(
            [Sample(input=f"Name colour number {i}", target="any", id=i) for i in (1, 2, 3)],
            name="colors",
        )


    @task
    def colors():
        return Task(dataset=_samples(), solver=generate())


    @task
    def colors_own():
        return Task(dataset=_samples(), solver=generate(), scorer=colour_word(ignore_case=True))


    @scorer(metrics=[accuracy()])
    def colour_word(ignore_case: bool = False):
        async def score(state: TaskState, target: Target) -> Score:
            said = state.output.completion.strip()
            said = said.lower() if ignore_case else said
            return Score(value=CORRECT if said in WORDS else INCORRECT, answer=said)

        return score
    """
)

# mockllm's answers, by colour number: what `args_from` names (a callable cannot be TOML)
MOCK = textwrap.dedent(
    """\
    from inspect_ai.model import ModelOutput, ModelUsage

    ANSWERS = {"1": "red", "2": "purple", "3": "Blue"}


    def mock_args():
        def outputs(input, tools, tool_choice, config):
            prompt = " ".join(str(getattr(m, "text", m)) for m in input)
            said = ANSWERS[prompt.strip()[-1]]
            usage = ModelUsage(input_tokens=5, output_tokens=1, total_tokens=6)
            return ModelOutput.from_content(model="mockllm/model", content=said).model_copy(
                update={"usage": usage}
            )

        return {"custom_outputs": outputs}
    """
)

SWEEP = textwrap.dedent(
    """\
    name = "colors"
    log_dir = "logs"
    warehouse = "colors.duckdb"

    [[models]]
    name = "m"
    model = "mockllm/model"
    args_from = "colors_mock:mock_args"

    [[tasks]]
    task = "colors.py@colors"
    verifiers = ["colors.py@colour_word"]

    [[tasks]]
    task = "colors.py@colors_own"

    [gates]
    min_accuracy = 0.0
    """
)

NAMED, OWN = "colour_word", "colour_word[ignore_case=true]"


def _verdicts(db: Path) -> dict[str, dict[str, float]]:
    """verifier -> sample id -> its value under the verifier's newest fingerprint."""
    with Warehouse(db).read() as con:
        rows = con.execute(
            "SELECT scorer, sample_id, value FROM latest_scores ORDER BY scorer, sample_id"
        ).fetchall()
    out: dict[str, dict[str, float]] = {}
    for scorer, sample, value in rows:
        out.setdefault(scorer, {})[sample] = value
    return out


def _fingerprints(db: Path) -> dict[str, int]:
    with Warehouse(db).read() as con:
        rows = con.execute(
            "SELECT scorer, count(DISTINCT fingerprint) FROM scores GROUP BY scorer"
        ).fetchall()
    return dict(rows)


def _edit(colors: Path, words: str) -> None:
    colors.write_text(COLORS.replace('WORDS = ("red", "blue")', f"WORDS = {words}"))


def test_an_edited_scorer_is_never_reported_current_and_the_printed_command_rescores_it(
    prefect_api, tmp_path: Path
) -> None:
    colors = tmp_path / "colors.py"
    colors.write_text(COLORS)
    (tmp_path / "colors_mock.py").write_text(MOCK)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    db = tmp_path / "colors.duckdb"
    env = cli_kit.shell_env(tmp_path / "home", api_url=prefect_api, PYTHONPATH=str(tmp_path))
    env["COLUMNS"] = "250"  # a command to paste is one line on any terminal; tables too

    def gradebook(*args: str) -> cli_kit.Ran:
        return cli_kit.gradebook(*args, env=env, cwd=tmp_path)

    swept = gradebook("sweep", "sweep.toml")
    assert swept.code == 0, swept.stdout + swept.stderr
    # red, purple, Blue: case matters to the named scorer, not to the task's own variant
    assert _verdicts(db) == {
        NAMED: {"1": 1.0, "2": 0.0, "3": 0.0},
        OWN: {"1": 1.0, "2": 0.0, "3": 1.0},
    }

    # purple becomes a colour: neither verifier can be rebuilt from the warehouse alone
    _edit(colors, '("red", "blue", "purple")')
    bare = gradebook("rescore", "--db", "colors.duckdb")
    assert bare.code == 2, bare.stdout + bare.stderr
    assert "Traceback" not in bare.stdout + bare.stderr
    assert "fingerprint is current" not in bare.stdout
    for name in (NAMED, OWN):
        assert f"not checked: verifier {name!r} is not loaded here: {colors} changed" in bare.stdout
    assert f"2 verifiers not checked ({NAMED}, {OWN}): their grades may be stale" in bare.stdout
    printed = bare.stdout.rstrip().splitlines()[-1].strip()
    assert " rescore --db colors.duckdb --verifier-module " in printed, bare.stdout
    assert _fingerprints(db) == {NAMED: 1, OWN: 1}  # nothing graded, nothing recorded

    # the command, run as printed by a shell, re-scores both as their file is now
    healed = cli_kit.run(["/bin/sh", "-c", printed], env, tmp_path)
    assert healed.code == 0, healed.stdout + healed.stderr
    assert "not checked" not in healed.stdout
    assert _fingerprints(db) == {NAMED: 2, OWN: 2}
    assert _verdicts(db) == {
        NAMED: {"1": 1.0, "2": 1.0, "3": 0.0},
        OWN: {"1": 1.0, "2": 1.0, "3": 1.0},
    }
    assert healed.stdout.count("flip ") == 2  # sample 2 under each verifier

    # graded on the user's word, the new code is this user's: the warehouse alone now suffices
    again = gradebook("rescore", "--db", "colors.duckdb")
    assert again.code == 0, again.stdout + again.stderr
    assert "nothing to re-score: every verifier's fingerprint is current" in again.stdout

    # only red is a colour: `--config` loads the scorer file and the task's own scorer, and
    # finds the warehouse in the config
    _edit(colors, '("red",)')
    configured = gradebook("rescore", "--config", "sweep.toml")
    assert configured.code == 0, configured.stdout + configured.stderr
    assert "not checked" not in configured.stdout
    assert _fingerprints(db) == {NAMED: 3, OWN: 3}
    assert _verdicts(db) == {
        NAMED: {"1": 1.0, "2": 0.0, "3": 0.0},
        OWN: {"1": 1.0, "2": 0.0, "3": 0.0},
    }
