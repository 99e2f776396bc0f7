"""Where a log from elsewhere's compose file is looked for, read from a hostile log: under
`--task-dir` first, then beside the log's task file, never outside either; everything else is a
stand-in that says so (pure: no Engine; tests/test_foreign_images.py runs them for real)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from inspect_ai.util import ExecResult

from workspaces.foreign_image import missing_tool, resolve_foreign


def _task(root: Path, extra: str = "") -> Path:
    (root / "image").mkdir(parents=True)
    (root / "image" / "Dockerfile").write_text("FROM base\n")
    (root / "compose.yaml").write_text(
        textwrap.dedent(
            """\
            services:
              app:
                build: image
              helper:
                image: base
            """
        )
        + extra
    )
    (root / "task.py").write_text("raise SystemExit('never imported')\n")
    return root


def _run(kind: object, config: object, task_file: object = None) -> dict:
    return {"eval_sandbox": {"type": kind, "config": config}, "task_file": task_file}


def test_task_dir_first_then_beside_the_task_file(tmp_path):
    tmp_path = tmp_path.resolve()
    given, beside = _task(tmp_path / "given"), _task(tmp_path / "beside")
    task_file = str(beside / "task.py")
    found = resolve_foreign(_run("docker", "compose.yaml", task_file), str(given))
    assert found is not None
    assert (found.found, found.names, found.network) == (
        str(given / "compose.yaml"), ("app", "helper"), True
    )  # fmt: skip
    found = resolve_foreign(_run("docker", "compose.yaml", task_file), None)
    assert found is not None
    # the log chose that directory: its build gets no network
    assert (found.found, found.network) == (str(beside / "compose.yaml"), False)
    # an absolute path of the machine that wrote the log: its name, in the task's directory
    found = resolve_foreign(_run("gradebook", "/home/them/evals/compose.yaml"), str(given))
    assert found is not None and found.found == str(given / "compose.yaml")


def test_a_config_that_leaves_the_task_directory_is_never_followed(tmp_path):
    _task(tmp_path / "outside")
    inside = tmp_path / "task"
    inside.mkdir()
    found = resolve_foreign(_run("docker", "../outside/compose.yaml"), str(inside))
    assert found is not None and found.recipe is None and found.found is None
    assert found.stand_in is not None and "not found" in found.stand_in


@pytest.mark.parametrize(
    ("run", "says"),
    [
        (_run("docker", "compose.yaml", "/nowhere/task.py"),
         "'compose.yaml' of the 'docker' sandbox not found: gradebook's image stands in; pass "
         "--task-dir with the task's directory to score in its own image (looked at "
         "/nowhere/compose.yaml)"),
        (_run("docker", "compose.yaml"), "(the log names no task file)"),
        (_run("docker", None), "ran under the 'docker' sandbox (no compose file named)"),
        (_run("k8s", "values.yaml"), "ran under the 'k8s' sandbox ('values.yaml')"),
        (_run("local", None), "ran under the 'local' sandbox"),
        (_run("gradebook", {"image": "repo-env:1"}), "ran in image 'repo-env:1'"),
        ({"eval_sandbox": ["docker"]}, "the log's sandbox spec is unreadable"),
    ],
)  # fmt: skip
def test_what_is_not_at_hand_is_a_stand_in_that_says_so(run, says):
    found = resolve_foreign(run, None)
    assert found is not None and found.recipe is None
    assert found.stand_in is not None and says in found.stand_in, found.stand_in


@pytest.mark.parametrize("run", [None, _run("gradebook", None), _run("gradebook", {})])
def test_gradebooks_own_image_is_the_right_one(run):
    assert resolve_foreign(run, None) is None


def test_a_refused_key_is_one_line_naming_it(tmp_path):
    root = _task(tmp_path / "task", "    ports: ['8080:80']\n")
    found = resolve_foreign(_run("docker", "compose.yaml", str(root / "task.py")), None)
    assert found is not None and found.recipe is None
    assert found.refused is not None and "services.helper.ports: published ports" in found.refused


@pytest.mark.parametrize(
    ("code", "stderr", "missing"),
    [
        (127, "sh: 1: checker: not found", True),
        (126, 'exec: "checker": executable file not found in $PATH', True),
        (126, "permission denied", False),
        (1, "checker: 0 is wrong", False),
        (0, "", False),
    ],
)
def test_a_missing_program_is_told_from_a_failing_one(code, stderr, missing):
    result = ExecResult(success=code == 0, returncode=code, stdout="", stderr=stderr)
    assert missing_tool(result) is missing
