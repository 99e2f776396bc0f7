"""gradebook's own scorers are installed code: a log naming one is scored with no flag (issue 38).

A log of the bundled `math_verified` task names its scorer, `math_verifier`, defined in
gradebook's own `scorers/math/scorer.py`. However the log names it (as this gradebook records
it, by registry name and module; as a gradebook before it recorded it, by that file's path; as
Inspect records it, by registry name alone), `gradebook score` into a fresh warehouse resolves
it through gradebook's Inspect entry point, as one verifier with the sweep's fingerprint. A file
that is not installed code (the same scorer copied elsewhere, as another checkout holds it)
still needs the user's word, and is never imported on the log's.

Every command runs as a user's shell runs it: the console script, a fresh environment, real
Inspect generation with mockllm, real Prefect flow runs and grading workers, real DuckDB files.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import cli_kit
import pytest

from warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[1]
NAME = "math_verifier[timeout_s=2.0]"  # the task passes timeout_s: a variant's name

# mockllm's answers: the first bundled problem right, every other one wrong
MOCK = textwrap.dedent(
    """\
    from inspect_ai.model import ModelOutput, ModelUsage

    from tasks.math import bundled_samples, scripted_completions


    def mock_args():
        scripts = {c.id: c for c in scripted_completions()}

        def outputs(input, tools, tool_choice, config):
            prompt = " ".join(str(getattr(m, "text", m)) for m in input)
            for i, sample in enumerate(bundled_samples()):
                if str(sample.input) in prompt:
                    script = scripts[str(sample.id)]
                    said = script.correct if i == 0 else script.wrong
                    break
            else:
                said = "no idea"
            usage = ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)
            return ModelOutput.from_content(model="mockllm/model", content=said).model_copy(
                update={"usage": usage}
            )

        return {"custom_outputs": outputs}
    """
)

SWEEP = textwrap.dedent(
    """\
    name = "math"
    log_dir = "logs"
    warehouse = "first.duckdb"

    [[models]]
    name = "m"
    model = "mockllm/model"
    args_from = "math_mock:mock_args"

    [[tasks]]
    task = "math_verified"
    limit = 2

    [gates]
    min_accuracy = 0.0
    """
)


def _graded(db: Path) -> dict[str, set[tuple[str, float]]]:
    """fingerprint -> the (sample id, value) pairs graded under it, over every run."""
    with Warehouse(db).read() as con:
        rows = con.execute(
            "SELECT fingerprint, sample_id, value FROM scores WHERE scorer = ?", [NAME]
        ).fetchall()
    out: dict[str, set[tuple[str, float]]] = {}
    for fingerprint, sample, value in rows:
        out.setdefault(fingerprint, set()).add((sample, value))
    return out


def _runs(db: Path) -> int:
    with Warehouse(db).read() as con:
        return con.execute(
            "SELECT count(DISTINCT run_id) FROM scores WHERE scorer = ?", [NAME]
        ).fetchone()[0]


def _copy(log: Path, to: Path, eval_id: str, verifiers: list | None) -> Path:
    """The log as another run (its own eval id) whose metadata names `verifiers` (None: none,
    as a log Inspect itself wrote)."""
    from inspect_ai.log import read_eval_log, write_eval_log

    copy = read_eval_log(str(log))
    copy.eval.eval_id = eval_id
    metadata = {k: v for k, v in (copy.eval.metadata or {}).items() if k != "verifiers"}
    copy.eval.metadata = {**metadata, **({"verifiers": verifiers} if verifiers else {})}
    write_eval_log(copy, str(to))
    return to


def test_every_bundled_task_names_its_scorer_by_registry_name_never_by_a_path(
    tmp_path: Path,
) -> None:
    """What generate records in a bundled task's log: its own scorer by registry name and
    module, so the log is scored anywhere (a new bundled scorer must be in OWN_SCORER_MODULES,
    which gradebook's entry point registers)."""
    from scorers.inspect_scorers.installed import OWN_SCORER_MODULES
    from scorers.inspect_scorers.specs import task_scorer_specs
    from sweeps.tasks import BUNDLED_TASK_MODULES, _bundled_tasks, load_task

    data = tmp_path / "gsm8k.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    needs = {"gsm8k_verified": {"path": str(data)}}
    tasks = sorted(_bundled_tasks())
    assert len(tasks) >= len(BUNDLED_TASK_MODULES)
    for name in tasks:
        specs = task_scorer_specs(load_task(name, needs.get(name, {})))
        assert specs, name
        for spec in specs:
            assert spec.file is None and spec.module in OWN_SCORER_MODULES, (name, spec)


@pytest.mark.slow
def test_a_log_naming_gradebooks_own_scorer_is_scored_with_no_flag_in_a_fresh_warehouse(
    prefect_api, tmp_path: Path
) -> None:
    from inspect_ai.log import read_eval_log

    (tmp_path / "math_mock.py").write_text(MOCK)
    (tmp_path / "math.toml").write_text(SWEEP)
    env = cli_kit.shell_env(tmp_path / "home", api_url=prefect_api, PYTHONPATH=str(tmp_path))

    def gradebook(*args: str) -> cli_kit.Ran:
        return cli_kit.gradebook(*args, env=env, cwd=tmp_path)

    swept = gradebook("sweep", "math.toml")
    assert swept.code == 0, swept.stdout + swept.stderr
    [log] = (tmp_path / "logs").glob("*.eval")
    [(fingerprint, verdicts)] = _graded(tmp_path / "first.duckdb").items()
    assert verdicts == {("m01", 1.0), ("m02", 0.0)}  # right, then wrong

    own_file = str(ROOT / "scorers" / "math" / "scorer.py")
    file_spec = {"kind": "file", "scorer": "math_verifier", "file": own_file,
                 "params": {"timeout_s": 2.0}}  # fmt: skip
    by_path = _copy(log, tmp_path / "by_path.eval", "byPathRun0000000000000", [file_spec])
    by_inspect = _copy(log, tmp_path / "by_inspect.eval", "byInspectRun000000000", None)

    fresh = tmp_path / "second.duckdb"
    scored = gradebook("score", str(log), str(by_path), str(by_inspect), "--db", str(fresh))
    assert scored.code == 0, scored.stdout + scored.stderr
    assert "--verifier-module" not in scored.stdout + scored.stderr
    # one verifier, the sweep's fingerprint, the sweep's verdicts, in each of the three runs
    assert _graded(fresh) == {fingerprint: verdicts}
    assert _runs(fresh) == 3
    # this gradebook's log names it by registry name and module, no path of this machine's
    [recorded] = read_eval_log(str(log), header_only=True).eval.metadata["verifiers"]
    assert recorded["kind"] == "registry" and "file" not in recorded, recorded

    # the same scorer copied elsewhere (another checkout of gradebook holds one like it) is not
    # installed code here: the log's word imports nothing
    marker = tmp_path / "imported"
    elsewhere = tmp_path / "elsewhere" / "scorers" / "math" / "scorer.py"
    elsewhere.parent.mkdir(parents=True)
    shutil.copy(own_file, elsewhere)
    elsewhere.write_text(f"open({str(marker)!r}, 'w').close()\n" + elsewhere.read_text())
    other = _copy(log, tmp_path / "other.eval", "otherCheckoutRun00000",
                  [{**file_spec, "file": str(elsewhere)}])  # fmt: skip
    refused = gradebook("score", str(other), "--db", str(tmp_path / "third.duckdb"))
    assert refused.code == 2, refused.stdout + refused.stderr
    [line] = refused.stderr_lines
    assert str(other) in line and f"--verifier-module {elsewhere}@math_verifier" in line, line
    assert not marker.exists()
