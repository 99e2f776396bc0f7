"""Logs from elsewhere: a log with no captured workspace whose `eval.sandbox` names a compose file
is scored in the image built from the task's files when they are at hand (beside the log's task
file, or `--task-dir`), and in gradebook's image, said to be a stand-in, when they are not.

The log is a real Inspect `eval()` of a task file declaring `sandbox=("docker",
"compose.yaml")`, run here under gradebook's provider (Inspect's own docker sandbox refuses this
Engine) with nothing captured: Inspect's loader records the task file and the compose file as
it does for any log. A copy "from another machine" has the two fields such a log would hold
there: the `docker` type its run used, and a task file that does not exist here. The compose
file builds an image with a `checker` the scorer calls, which gradebook's image lacks.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import task_image_kit as kit
from cli_kit import gradebook, shell_env
from conftest import need
from inspect_ai.log import read_eval_log, write_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.util import SandboxEnvironmentSpec

from warehouse import Warehouse

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASK_FILE = textwrap.dedent(
    """\
    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate


    @task
    def foreign_squares():
        samples = [Sample(id=i, input=f"square {i}", target=str(i * i)) for i in (1, 2, 3)]
        return Task(dataset=MemoryDataset(samples), solver=generate(),
                    sandbox=("docker", "compose.yaml"))
    """
)

SCORER = textwrap.dedent(
    '''
    """Grades the completion with the task image's own `checker`."""
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState
    from inspect_ai.util import sandbox


    @scorer(metrics=[accuracy()])
    def completion_check():
        async def score(state: TaskState, target: Target) -> Score:
            await sandbox().write_file("answer.txt", state.output.completion)
            ran = await sandbox().exec(["checker", "answer.txt", str(state.sample_id)])
            given = await sandbox().exec(["cat", "given.txt"])
            flavour = await sandbox().exec(["sh", "-c", "echo $TASK_FLAVOUR"])
            return Score(value=CORRECT if ran.success else INCORRECT,
                         answer=f"{given.stdout.strip()}|{flavour.stdout.strip()}",
                         explanation=(ran.stdout + ran.stderr).strip()[-200:])

        return score


    # not `two_services`: test_task_images registers that name from its own file, and a
    # process holding both refuses the second (one stored name, two scorers)
    @scorer(metrics=[accuracy()])
    def foreign_two_services():
        async def score(state: TaskState, target: Target) -> Score:
            await sandbox().write_file("answer.txt", state.output.completion)
            ran = await sandbox().exec(["checker", "answer.txt", str(state.sample_id)])
            helper = await sandbox("helper").exec(["sh", "-c", "command -v checker || echo none"])
            return Score(value=CORRECT if ran.success else INCORRECT, answer=helper.stdout.strip())

        return score
    '''
)

RIGHT_VERDICTS = [
    ("1", "scored", 1.0, "from the image|squares", "checker: 1 is right"),
    ("2", "scored", 0.0, "from the image|squares", "checker: 0 is wrong"),
    ("3", "scored", 1.0, "from the image|squares", "checker: 9 is right"),
]
VERDICTS = "SELECT sample_id, status, value, answer, explanation FROM latest_scores ORDER BY 1"


def answers(input: Any, tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
    """The model: the square asked for (wrong for sample kit.WRONG), with usage (offline)."""
    n = int(str(input[-1].text).split()[-1])
    return ModelOutput.from_content(
        "mockllm/model", str(0 if n == kit.WRONG else n * n)
    ).model_copy(update={"usage": ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)})


def q(db: Path, sql: str) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute(sql).fetchall()


def restored(db: Path) -> list[dict]:
    rows = q(db, "SELECT metadata FROM latest_scores ORDER BY sample_id")
    return [json.loads(m)["sandbox"]["restored"]["default"] for (m,) in rows]


def score(log: Path, db: Path, verifier: str) -> None:
    from flows.score import score_flow

    score_flow([str(log)], str(db), verifiers=[verifier], workers=2, progress=False)


def images_of(client, digest: str) -> list[str]:
    from scorers.sandbox.task_image import RECIPE_LABEL

    return [i["Id"] for i in client.api.images(filters={"label": f"{RECIPE_LABEL}={digest}"})]


def remove_images(client, digest: str) -> None:
    """This recipe's images (this test run's own: its Dockerfile holds a nonce), never forced."""
    import docker.errors

    for image_id in images_of(client, digest):
        try:
            client.api.remove_image(image_id)
        except docker.errors.APIError:  # a container still being removed uses it: left
            pass


@dataclass(frozen=True)
class Foreign:
    cwd: Path  # where `inspect eval` ran (the log's task file is relative to it)
    task_dir: Path  # the task file, its compose file and the image's build context
    here: Path  # the log as Inspect wrote it here
    away: Path  # the same log as from another machine
    digest: str  # the recipe's
    verifier: str  # the scorer file's completion_check


@pytest.fixture(scope="module")
def client():
    from scorers.sandbox.pool import SandboxUnavailable, engine_with_image

    try:
        docker_client, _ = engine_with_image()
    except SandboxUnavailable as exc:
        need(False, f"Docker sandbox unavailable: {exc}")
    return docker_client


@pytest.fixture(scope="module")
def foreign(client, prefect_api, tmp_path_factory):
    """The logs and their task's files; the task's image removed, so that scoring builds it."""
    from inspect_ai import eval as inspect_eval

    from scorers.sandbox.recipe import read_recipe

    tmp = tmp_path_factory.mktemp("foreign")
    task_dir = kit.recipe_dir(tmp / "task")
    (task_dir / "foreign_task.py").write_text(TASK_FILE)
    scorers = tmp / "foreign_scorers.py"
    scorers.write_text(SCORER)
    digest = read_recipe(task_dir / "compose.yaml").digest
    try:
        with contextlib.chdir(tmp):  # as a user runs `inspect eval task/foreign_task.py`
            (log,) = inspect_eval(
                "task/foreign_task.py", model=get_model("mockllm/model", custom_outputs=answers),
                sandbox="gradebook", score=False, log_dir=str(tmp / "logs"), display="none",
            )  # fmt: skip
        assert log.status == "success" and not any(s.error for s in log.samples or []), log.error
        here = Path(log.location)
        written = read_eval_log(str(here))
        # what the log names: the task file and its compose file; no workspace was captured
        assert written.eval.sandbox == SandboxEnvironmentSpec("gradebook", "compose.yaml")
        assert written.eval.task_file == "task/foreign_task.py"
        assert not any("gradebook_workspace" in s.store for s in written.samples or [])
        written.eval = written.eval.model_copy(update={
            "sandbox": SandboxEnvironmentSpec("docker", "compose.yaml"),
            "task_file": str(tmp / "elsewhere" / "foreign_task.py"),
        })  # fmt: skip
        away = tmp / "away" / here.name
        away.parent.mkdir()
        write_eval_log(written, str(away))
        remove_images(client, digest)
        assert images_of(client, digest) == []
        yield Foreign(tmp, task_dir, here, away, digest, f"{scorers}@completion_check")
    finally:
        remove_images(client, digest)


def test_scored_in_the_image_built_from_the_compose_file_beside_its_task_file(
    foreign, client, prefect_api, tmp_path
):
    db = tmp_path / "gb.duckdb"
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    # from where the eval ran: the log's task file is there
    ran = gradebook("score", str(foreign.here), "--db", str(db), "--verifier", foreign.verifier,
                    env=env, cwd=foreign.cwd)  # fmt: skip
    assert ran.code == 0, ran.stderr
    # the checker is there, the image's own file is at its working directory, its service's
    # variable is set: the verdicts the answers deserve
    assert q(db, VERDICTS) == RIGHT_VERDICTS
    (image_id,) = images_of(client, foreign.digest)  # built here, labelled with the recipe
    assert {(r["image_id"], r["built_from_task_files"], "stand_in" in r) for r in restored(db)} == {
        (image_id, str((foreign.task_dir / "compose.yaml").resolve()), False)
    }


def test_a_log_from_elsewhere_is_scored_in_its_task_image_with_task_dir(
    foreign, prefect_api, tmp_path
):
    moved = shutil.copytree(foreign.task_dir, tmp_path / "checkout" / "task")  # the user's copy
    db = tmp_path / "gb.duckdb"
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    ran = gradebook("score", str(foreign.away), "--db", str(db), "--verifier", foreign.verifier,
                    "--task-dir", str(moved), env=env, cwd=tmp_path)  # fmt: skip
    assert ran.code == 0, ran.stderr
    assert q(db, VERDICTS) == RIGHT_VERDICTS
    assert {r["built_from_task_files"] for r in restored(db)} == {
        str((moved / "compose.yaml").resolve())
    }


def test_without_its_task_files_it_is_never_graded_wrong_and_task_dir_heals_it(
    foreign, prefect_api, tmp_path
):
    db = tmp_path / "gb.duckdb"
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    ran = gradebook("score", str(foreign.away), "--db", str(db), "--verifier", foreign.verifier,
                    env=env, cwd=tmp_path)  # fmt: skip
    assert ran.code == 0, ran.stderr
    # gradebook's image stood in, and says so; the checker it lacks is not a wrong answer
    assert q(db, "SELECT DISTINCT status, reason FROM latest_scores") == [
        ("unscored", "sandbox_unavailable")
    ]
    (stand_in,) = {r["stand_in"] for r in restored(db)}
    assert "'compose.yaml' of the 'docker' sandbox not found" in stand_in, stand_in
    assert "--task-dir" in stand_in and str(foreign.away.parent.parent / "elsewhere") in stand_in
    (why,) = {e for (e,) in q(db, "SELECT explanation FROM latest_scores")}
    assert why.startswith("'checker' is not in gradebook's image"), why
    healed = gradebook("rescore", "--db", str(db), "--retry-unscored", "--verifier-module",
                       foreign.verifier, "--task-dir", str(foreign.task_dir), env=env,
                       cwd=tmp_path)  # fmt: skip
    assert healed.code == 0, healed.stderr
    assert q(db, "SELECT sample_id, status, value FROM current_scores ORDER BY 1") == [
        (n, s, v) for n, s, v, _, _ in RIGHT_VERDICTS
    ]


def test_a_compose_key_gradebook_cannot_honour_leaves_it_unscored_in_one_line(foreign, tmp_path):
    refused = shutil.copytree(foreign.task_dir, tmp_path / "task")
    compose = refused / "compose.yaml"
    compose.write_text(compose.read_text() + "    ports: ['8080:80']\n")
    log = read_eval_log(str(foreign.here))
    log.eval = log.eval.model_copy(update={"task_file": str(refused / "foreign_task.py")})
    write_eval_log(log, str(tmp_path / foreign.here.name))
    db = tmp_path / "gb.duckdb"
    score(tmp_path / foreign.here.name, db, foreign.verifier)
    rows = q(db, "SELECT DISTINCT status, reason, explanation FROM latest_scores")
    assert [(s, r) for s, r, _ in rows] == [("unscored", "sandbox_unavailable")]
    assert "services.default.ports: published ports cannot be honoured" in rows[0][2], rows
    assert "\n" not in rows[0][2]


def test_a_task_dir_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    env = shell_env(tmp_path / "home")
    missing = tmp_path / "no-such-task"
    log = tmp_path / "some.eval"
    log.write_bytes(b"")
    for args in (("score", str(log)), ("rescore",)):
        ran = gradebook(*args, "--db", str(tmp_path / "gb.duckdb"), "--task-dir", str(missing),
                        env=env, cwd=tmp_path)  # fmt: skip
        assert ran.code == 2, (args, ran.stderr)
        assert ran.stderr_lines == [
            f"error: --task-dir {missing}: no such directory; give the directory of the task "
            "file, where the compose file or Dockerfile its logs name is"
        ], ran.stderr
        url = "s3://bucket/tasks/fix-the-bug"
        ran = gradebook(*args, "--db", str(tmp_path / "gb.duckdb"), "--task-dir", url,
                        env=env, cwd=tmp_path)  # fmt: skip
        assert ran.code == 2, (args, ran.stderr)
        assert ran.stderr_lines == [
            f"error: --task-dir {url}: an object-store URL where a local path is needed: the "
            "task's image is built from its files on this machine; copy them here and give "
            "that directory"
        ], ran.stderr
        assert not (tmp_path / "s3:").exists()
    assert not (tmp_path / "gb.duckdb").exists()  # refused before anything was written


def test_each_compose_service_is_a_named_sandbox_in_its_own_image(
    foreign, client, prefect_api, tmp_path
):
    from inspect_ai import eval as inspect_eval

    from scorers.sandbox.image import image_tag
    from scorers.sandbox.recipe import read_recipe

    task_dir = kit.recipe_dir(tmp_path / "task", services=kit.TWO_SERVICES.format(base=image_tag()))
    (task_dir / "foreign_task.py").write_text(TASK_FILE)
    digest = read_recipe(task_dir / "compose.yaml").digest
    try:
        with contextlib.chdir(tmp_path):
            (log,) = inspect_eval(
                "task/foreign_task.py", model=get_model("mockllm/model", custom_outputs=answers),
                sandbox="gradebook", score=False, log_dir=str(tmp_path / "logs"), display="none",
            )  # fmt: skip
        assert log.status == "success", log.error
        log = read_eval_log(log.location)
        # its path made absolute: this process's grading workers run from elsewhere
        log.eval = log.eval.model_copy(update={"task_file": str(task_dir / "foreign_task.py")})
        write_eval_log(log, str(tmp_path / "log.eval"))
        db = tmp_path / "gb.duckdb"
        verifier = foreign.verifier.replace("@completion_check", "@foreign_two_services")
        score(tmp_path / "log.eval", db, verifier)
        # the default service's image has the checker; the helper runs the image it names
        assert q(db, "SELECT sample_id, value, answer FROM latest_scores ORDER BY 1") == [
            ("1", 1.0, "none"), ("2", 0.0, "none"), ("3", 1.0, "none")
        ]  # fmt: skip
        (built,) = images_of(client, digest)
        boxes = [
            json.loads(m)["sandbox"]["restored"]
            for (m,) in q(db, "SELECT metadata FROM latest_scores")
        ]
        assert {(b["default"]["image_id"], b["helper"]["image_id"]) for b in boxes} == {
            (built, client.images.get(image_tag()).id)
        }
    finally:
        remove_images(client, digest)
