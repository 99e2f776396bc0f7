"""Task specs: bundled names and file specs give the same tasks; a task file that uses @dataclass
(which Inspect's own file loader breaks) runs end to end; a spec that cannot load is refused with
one line and exit 2 before anything starts."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.model import ModelOutput, ModelUsage
from typer.testing import CliRunner

from flows.cli import app
from sweeps.config import parse_config
from sweeps.tasks import TaskLoadError, load_task
from warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

# A user's task file: `from __future__ import annotations` + @dataclass is what Inspect 0.3.285's
# loader fails on. It also imports a module next to it and reads a data file by a relative
# path, as task files loaded by Inspect may.
USER_TASK = textwrap.dedent(
    """
    from __future__ import annotations

    import json
    from dataclasses import dataclass

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import generate

    from sums_helpers import PROMPT


    @dataclass(frozen=True)
    class Problem:
        a: int
        b: int

        @property
        def total(self) -> int:
            return self.a + self.b


    @task
    def sums(scale: int = 1) -> Task:
        rows = [json.loads(line) for line in open("sums.jsonl")]
        problems = [Problem(r["a"] * scale, r["b"] * scale) for r in rows]
        return Task(
            dataset=[
                Sample(id=i, input=PROMPT.format(p.a, p.b), target=str(p.total))
                for i, p in enumerate(problems, start=1)
            ],
            solver=generate(),
        )
    """
)


def write_user_task(directory: Path) -> Path:
    (directory / "sums_helpers.py").write_text('PROMPT = "What is {} + {}?"\n')
    (directory / "sums.jsonl").write_text("".join(f'{{"a": {i}, "b": {i}}}\n' for i in (1, 2, 3)))
    path = directory / "sums_task.py"
    path.write_text(USER_TASK)
    return path


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "name", "args"),
    [
        ("math.py", "math_verified", {}),
        ("math.py", "gsm8k_verified", {"path": "gsm8k/test.jsonl", "limit": 5}),
        ("code.py", "humaneval", {"limit": 3}),
    ],
)
def test_bundled_tasks_load_by_name_and_by_file_spec(shared_data, file, name, args):
    if "path" in args:
        args = {**args, "path": str(shared_data / args["path"])}
    by_name = load_task(name, args)
    by_file = load_task(f"{ROOT / 'tasks' / file}@{name}", args)
    assert by_file.name == by_name.name == name
    assert [(s.id, s.target) for s in by_file.dataset] == [
        (s.id, s.target) for s in by_name.dataset
    ]
    assert len(by_file.dataset) > 0


def test_a_user_task_file_with_a_dataclass_loads_with_its_args(tmp_path):
    path = write_user_task(tmp_path)
    task = load_task(f"{path}@sums", {"scale": 10})
    assert [(s.input, s.target) for s in task.dataset] == [
        ("What is 10 + 10?", "20"),
        ("What is 20 + 20?", "40"),
        ("What is 30 + 30?", "60"),
    ]
    # a file that defines one task needs no "@name"
    assert len(load_task(str(path)).dataset) == 3


def test_an_unknown_task_arg_is_refused_not_dropped(tmp_path):
    # Inspect's own loader warns and drops it: a typo would silently run the default
    with pytest.raises(TaskLoadError, match=r"sums has no parameter\(s\) \['scael'\]"):
        load_task(f"{write_user_task(tmp_path)}@sums", {"scael": 10})


# -- end to end ------------------------------------------------------------------------------


def _math_outputs(wrong: set[str]) -> Any:
    """mockllm answers for the bundled math problems: right, except for the given ids."""
    from tasks.math import bundled_samples, scripted_completions

    script = {s.id: s for s in scripted_completions()}
    by_question = {str(s.input): script[str(s.id)] for s in bundled_samples()}

    def outputs(input: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        prompt = " ".join(str(getattr(m, "text", m)) for m in input)
        item = next(v for q, v in by_question.items() if q in prompt)
        text = item.wrong if item.id in wrong else item.correct
        output = ModelOutput.from_content(model="mockllm/model", content=text)
        return output.model_copy(
            update={"usage": ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)}
        )

    return outputs


@pytest.mark.slow
def test_sweep_with_the_issues_file_spec_scores_into_the_warehouse(
    prefect_api, tmp_path, monkeypatch
):
    from flows.sweep import EXIT_OK, sweep_flow
    from tasks.math import bundled_samples

    ids = [str(s.id) for s in bundled_samples()[:4]]
    monkeypatch.chdir(ROOT)  # "tasks/math.py" is found from the current directory
    cfg = parse_config(
        {
            "name": "taskspec",
            "models": [
                {"model": "mockllm/model", "args": {"custom_outputs": _math_outputs({ids[1]})}}
            ],
            "tasks": [{"task": "tasks/math.py@math_verified", "limit": 4, "verifiers": ["math"]}],
            "gates": {"min_coverage": None, "max_regression": None},
        },
        source=tmp_path / "sweep.toml",
    )
    result = sweep_flow(cfg, workers=1, progress=False)

    (row,) = result.rows
    assert row.note is None
    assert (row.task, row.samples, row.errored, row.scored) == ("math_verified", 4, 0, 4)
    assert row.accuracy == pytest.approx(3 / 4)
    assert result.exit_code == EXIT_OK
    with Warehouse(cfg.warehouse).read() as con:
        scores = dict(
            con.execute(
                "SELECT sample_id, value FROM scores WHERE scorer = 'math' ORDER BY sample_id"
            ).fetchall()
        )
    assert scores == {i: (0.0 if i == ids[1] else 1.0) for i in ids}


# The args_from target: mockllm answers "What is a + b?" right (TOML cannot hold a callable).
SUMS_MODEL = textwrap.dedent(
    """
    import re

    from inspect_ai.model import ModelOutput, ModelUsage


    def offline_args():
        def outputs(input, tools, tool_choice, config):
            prompt = " ".join(str(getattr(m, "text", m)) for m in input)
            a, b = map(int, re.search(r"What is (\\d+) \\+ (\\d+)\\?", prompt).groups())
            output = ModelOutput.from_content(model="mockllm/model", content=f"ANSWER: {a + b}")
            usage = ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)
            return output.model_copy(update={"usage": usage})

        return {"custom_outputs": outputs}
    """
)


@pytest.mark.slow
def test_cli_sweep_runs_a_user_task_file_with_a_dataclass(prefect_api, tmp_path, monkeypatch):
    write_user_task(tmp_path)
    (tmp_path / "sums_model.py").write_text(SUMS_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "sums"\nwarehouse = "gb.duckdb"\n'
        '[[models]]\nmodel = "mockllm/model"\nargs_from = "sums_model:offline_args"\n'
        '[[tasks]]\ntask = "sums_task.py@sums"\nargs = {scale = 2}\nverifiers = ["math"]\n'
    )
    result = runner.invoke(app, ["sweep", str(cfg)])

    assert result.exit_code == 0, result.output
    with Warehouse(tmp_path / "gb.duckdb").read() as con:
        rows = con.execute(
            "SELECT sample_id, value, answer FROM scores WHERE scorer = 'math' ORDER BY sample_id"
        ).fetchall()
    assert rows == [("1", 1.0, "4"), ("2", 1.0, "8"), ("3", 1.0, "12")]


# A task file whose data file is an arg (USER_TASK's is written into its code).
SUMS_FROM_TASK = textwrap.dedent(
    """
    import json

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import generate


    @task
    def sums_from(path: str) -> Task:
        rows = [json.loads(line) for line in open(path)]
        return Task(
            dataset=[
                Sample(id=i, input=f"What is {r['a']} + {r['b']}?", target=str(r["a"] + r["b"]))
                for i, r in enumerate(rows, start=1)
            ],
            solver=generate(),
        )
    """
)


def _write_data(directory: Path, first: int) -> None:
    """data/sums.jsonl and a GSM8K-format data/gsm8k.jsonl whose sums start at `first`."""
    (directory / "data").mkdir(parents=True)
    pairs = [(first + i, first + i) for i in range(3)]
    (directory / "data" / "sums.jsonl").write_text(
        "".join(f'{{"a": {a}, "b": {b}}}\n' for a, b in pairs)
    )
    (directory / "data" / "gsm8k.jsonl").write_text(
        "".join(
            f'{{"question": "What is {a} + {b}?", "answer": "{a} plus {b}\\n#### {a + b}"}}\n'
            for a, b in pairs
        )
    )


@pytest.mark.slow
def test_relative_data_paths_in_task_args_are_taken_next_to_the_config(
    prefect_api, tmp_path, monkeypatch
):
    # The same relative arg, a file task and a bundled one, run from another directory: both
    # read the data next to the config. Decoys sit where each used to look (the task file's
    # directory and the current directory).
    sweeps, tasks_dir, elsewhere = tmp_path / "sweeps", tmp_path / "tasks", tmp_path / "elsewhere"
    _write_data(sweeps, first=1)
    _write_data(tasks_dir, first=100)
    _write_data(elsewhere, first=500)
    (tasks_dir / "sums_from.py").write_text(SUMS_FROM_TASK)
    (tmp_path / "sums_model.py").write_text(SUMS_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(elsewhere)
    (sweeps / "sweep.toml").write_text(
        'name = "paths"\nwarehouse = "gb.duckdb"\n'
        '[[models]]\nmodel = "mockllm/model"\nargs_from = "sums_model:offline_args"\n'
        '[[tasks]]\ntask = "../tasks/sums_from.py@sums_from"\n'
        'args = {path = "data/sums.jsonl"}\nverifiers = ["math"]\n'
        '[[tasks]]\ntask = "gsm8k_verified"\nargs = {path = "data/gsm8k.jsonl"}\n'
        'verifiers = ["math"]\n'
    )
    result = runner.invoke(app, ["sweep", "../sweeps/sweep.toml"])

    assert result.exit_code == 0, result.output
    with Warehouse(sweeps / "gb.duckdb").read() as con:
        rows = con.execute(
            "SELECT r.task, json_extract_string(r.task_args, '$.path'), s.input, sc.value "
            "FROM scores sc JOIN samples s USING (run_id, sample_id, epoch) "
            "JOIN runs r USING (run_id) WHERE sc.scorer = 'math' ORDER BY r.task, s.sample_id"
        ).fetchall()
    expected = [(f"What is {a} + {a}?", 1.0) for a in (1, 2, 3)]
    for task_name in ("gsm8k_verified", "sums_from"):
        got = [
            (prompt[prompt.index("What is") :], value)
            for t, _, prompt, value in rows
            if t == task_name
        ]
        assert got == expected, rows
    assert {path for _, path, _, _ in rows} == {
        str(sweeps / "data" / "gsm8k.jsonl"),
        str(sweeps / "data" / "sums.jsonl"),
    }


# -- bad specs -------------------------------------------------------------------------------


def _bad_specs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    write_user_task(tmp_path)
    (tmp_path / "broken.py").write_text("from inspect_ai import task\nimport no_such_module_here\n")
    return {
        "missing @task name": ("sums_task.py@summs", "sums_task.py has no @task named 'summs'"),
        "import error": ("broken.py@anything", "raised ModuleNotFoundError"),
        "unknown registered name": ("math_verifed", "no task named 'math_verifed'"),
        "unknown task arg": ("sums_task.py@sums", "sums has no parameter(s) ['scael']"),
    }


@pytest.mark.parametrize("command", ["sweep", "generate", "serve"])
@pytest.mark.parametrize(
    "case", ["missing @task name", "import error", "unknown registered name", "unknown task arg"]
)
def test_a_task_that_cannot_load_is_one_line_and_exit_2_before_anything_runs(
    tmp_path, monkeypatch, command, case
):
    spec, why = _bad_specs(tmp_path)[case]
    # Nothing answers here: the task check must come before the command touches Prefect.
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    cfg = tmp_path / "sweep.toml"
    args = "args = {scael = 2}\n" if case == "unknown task arg" else ""
    cfg.write_text(
        'name = "bad"\n[[models]]\nmodel = "mockllm/model"\n'
        '[[tasks]]\ntask = "math_verified"\nverifiers = ["math"]\n'
        f'[[tasks]]\ntask = "{spec}"\n{args}verifiers = ["math"]\n'
    )
    result = runner.invoke(app, [command, str(cfg)])

    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {cfg}: tasks[1] (")
    assert spec.split("@")[-1] in line and why in line
    assert not (tmp_path / "logs").exists() and not (tmp_path / "gradebook.duckdb").exists()


def test_a_bad_task_found_while_the_local_server_boots_stops_that_server(tmp_path):
    # no PREFECT_API_URL: sweep starts its own server and checks tasks while it boots; the
    # check fails, so the command is one line and exit 2, and no server is left running
    import os
    import subprocess
    import sys

    spec, why = _bad_specs(tmp_path)["missing @task name"]
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'name = "bad"\n[[models]]\nmodel = "mockllm/model"\n'
        f'[[tasks]]\ntask = "{spec}"\nverifiers = ["math"]\n'
    )
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["GRADEBOOK_PREFECT_HOME"] = str(home)  # where the shared local server would live
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "sweep", str(cfg)],
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert out.returncode == 2, out.stderr
    (line,) = (out.stdout + out.stderr).strip().splitlines()
    assert line.startswith(f"error: {cfg}: tasks[0] (") and why in line

    # a process whose environment names this test's PREFECT_HOME (Linux's /proc)
    marker = f"PREFECT_HOME={home}".encode()
    left = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                left.append(environ.parent.name)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    assert left == []
    assert not (tmp_path / "logs").exists()
