"""Agentic tasks that bring their own image run in it and are re-scored in it: a compose file
whose Dockerfile adds a tool the scorer calls, generated (real eval() runs, mockllm), captured,
and scored in that image (real scoring stage, real Docker Engine, real DuckDB); re-scored after
the image is removed (rebuilt from the recipe kept in the workspace store) and with the recipe
gone too (unscored, never wrong)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import task_image_kit as kit
from cli_kit import gradebook, shell_env
from conftest import need
from inspect_ai.log import read_eval_log
from process_kit import wait_for

from flows.generate import run_generation
from sweeps.config import ModelConfig, TaskConfig, WorkspacesConfig
from warehouse import Warehouse

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MODEL = ModelConfig(model="mockllm/model", args_from="workspace_kit:mock_args")


@pytest.fixture(scope="module")
def client():
    """The Engine, with gradebook's sandbox image (what the kit's images are built FROM); every
    image this module's recipes built is removed at its end (the recipes are this run's own)."""
    from scorers.sandbox.pool import SandboxUnavailable, engine_with_image
    from scorers.sandbox.task_image import RECIPE_LABEL

    try:
        docker_client, _ = engine_with_image()
    except SandboxUnavailable as exc:
        need(False, f"Docker sandbox unavailable: {exc}")
    recipes: list[str] = []
    docker_client.test_recipes = recipes
    yield docker_client
    import docker.errors

    for digest in recipes:
        for image in docker_client.api.images(filters={"label": f"{RECIPE_LABEL}={digest}"}):
            try:  # best effort, never forced: another checkout's container may use it
                for tag in image.get("RepoTags") or [image["Id"]]:
                    docker_client.api.remove_image(tag)
            except docker.errors.APIError:
                pass


def generate(tmp: Path, task: str, args: dict, **task_keys) -> str:
    settings = WorkspacesConfig(store=tmp / "store")
    task_cfg = TaskConfig(task=f"{kit.KIT}@{task}", args=args, **task_keys)
    (result,) = run_generation(MODEL, [task_cfg], tmp / "logs", workspaces=settings)
    assert result.status == "success" and result.errored == 0, result
    return str(result.log)


def score(log: str, db: Path, verifier: str) -> None:
    from flows.score import score_flow

    score_flow([log], str(db), verifiers=[verifier], workers=2, progress=False)


def q(db: Path, sql: str) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute(sql).fetchall()


def remove_image(client, ref: str) -> None:
    """Remove an image once no container uses it (never forced: a container another test
    still runs keeps it)."""
    import docker.errors

    def gone() -> bool:
        try:
            client.images.remove(ref)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.APIError:  # 409: a container still being removed uses it
            return False
        return True

    wait_for(gone, 120, f"image {ref} removed")


def records(log: str) -> list[dict]:
    return [s.store["gradebook_workspace"]["sandboxes"][0] for s in read_eval_log(log).samples]


def restored(db: Path) -> list[dict]:
    rows = q(db, "SELECT metadata FROM latest_scores ORDER BY sample_id")
    return [json.loads(m)["sandbox"]["restored"]["default"] for (m,) in rows]


@pytest.fixture(scope="module")
def tool_scorers(tmp_path_factory) -> Path:
    """The kit's scorer file, one path for the module: a scorer name stands for one spec in a
    process, so every test grades with the same file."""
    return kit.scorer_file(tmp_path_factory.mktemp("scorers"))


@pytest.fixture(scope="module")
def squares(client, prefect_api, tmp_path_factory, tool_scorers):
    """One log of a task written for Inspect's ("docker", "compose.yaml"), generated under
    gradebook's sandbox by its config entry's `sandbox = "gradebook"`; and the scorer file."""
    tmp = tmp_path_factory.mktemp("squares")
    recipe = kit.recipe_dir(tmp / "task")
    log = generate(tmp, "squares", {"recipe": str(recipe), "provider": "docker"},
                   sandbox="gradebook")  # fmt: skip
    (digest,) = {r["recipe"] for r in records(log)}
    client.test_recipes.append(digest)
    return log, tool_scorers, tmp / "store"


RIGHT_VERDICTS = [
    ("1", "scored", 1.0, "from the image|squares", "checker: 1 is right"),
    ("2", "scored", 0.0, "from the image|squares", "checker: 0 is wrong"),
    ("3", "scored", 1.0, "from the image|squares", "checker: 9 is right"),
]
VERDICTS = "SELECT sample_id, status, value, answer, explanation FROM latest_scores ORDER BY 1"


def test_a_task_image_with_the_scorers_tool_is_generated_captured_and_scored_in_it(
    squares, client, tmp_path
):
    log, scorers, store = squares
    boxes = records(log)
    # generated in the task's own image, under gradebook's provider, not Inspect's docker
    assert {(b["status"], b["provider"], b["service"]) for b in boxes} == {
        ("captured", "gradebook", "default")
    }
    (image_id,) = {b["image_id"] for b in boxes}
    assert client.images.get(image_id).labels["gradebook.task-service"] == "default"
    # the recipe is kept, content-addressed, in the workspace store beside the workspaces
    (recipe,) = {b["recipe"] for b in boxes}
    assert (store / "sha256" / recipe[:2] / f"{recipe}.tar.zst").is_file()

    db = tmp_path / "gb.duckdb"
    score(log, db, f"{scorers}@tool_check")
    # the tool is there, the image's own file came with the workspace, its service's variable
    # is set: the verdicts the agent's work deserves
    assert q(db, VERDICTS) == RIGHT_VERDICTS
    assert {(r["image_id"], "rebuilt_from_recipe" in r) for r in restored(db)} == {
        (image_id, False)
    }


def test_its_image_removed_the_log_is_rescored_in_the_image_rebuilt_from_its_recipe(
    squares, client, tmp_path
):
    log, scorers, _ = squares
    (image_id,) = {b["image_id"] for b in records(log)}
    remove_image(client, image_id)
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{scorers}@tool_check")
    assert q(db, VERDICTS) == RIGHT_VERDICTS
    # not silently another image: the rebuilt one is named beside the one recorded
    ((recipe, recorded, new),) = {
        (r["rebuilt_from_recipe"], r["recorded_image_id"], r["image_id"]) for r in restored(db)
    }
    assert recorded == image_id and new != image_id
    assert recipe == records(log)[0]["recipe"]


def test_verdicts_from_an_image_since_rebuilt_are_graded_again_in_the_new_one(
    squares, client, prefect_api, tmp_path
):
    """A changed image re-grades as a changed verifier does: attempt 2 under the same
    fingerprint, the old verdicts kept as history; then nothing is left to do."""
    from scorers.sandbox.task_image import RECIPE_LABEL

    log, scorers, _ = squares
    (recipe,) = {b["recipe"] for b in records(log)}
    verifier = f"{scorers}@tool_check"
    db = tmp_path / "gb.duckdb"
    score(log, db, verifier)
    (first,) = {r["image_id"] for r in restored(db)}
    # the image is rebuilt from its recipe (another warehouse's scoring, as a second host's)
    for image in client.api.images(filters={"label": f"{RECIPE_LABEL}={recipe}"}):
        remove_image(client, image["Id"])
    score(log, tmp_path / "other.duckdb", verifier)
    (rebuilt,) = {r["image_id"] for r in restored(tmp_path / "other.duckdb")}
    assert rebuilt != first

    score(log, db, verifier)
    assert q(db, VERDICTS) == RIGHT_VERDICTS
    assert q(db, "SELECT attempt, image_id, count(*) FROM scores GROUP BY ALL ORDER BY 1") == [
        (1, first, 3),
        (2, rebuilt, 3),
    ]
    assert q(db, "SELECT DISTINCT attempt, image_id FROM latest_scores") == [(2, rebuilt)]
    assert q(db, "SELECT n_scored FROM run_metrics") == [(3,)]
    # and again: the image restore would use is the one graded in
    env = shell_env(tmp_path / "home", api_url=prefect_api)
    again = gradebook("score", log, "--db", str(db), "--verifier", verifier, env=env, cwd=tmp_path)
    assert again.code == 0, again.stderr
    assert again.stdout.startswith("nothing to score: 3 samples already scored by tool_check@")
    assert q(db, "SELECT count(*) FROM scores") == [(6,)]


def test_with_neither_its_image_nor_its_recipe_it_is_unscored_never_wrong(
    squares, client, tmp_path
):
    from scorers.sandbox.task_image import RECIPE_LABEL

    log, scorers, store = squares
    (recipe,) = {b["recipe"] for b in records(log)}
    for image in client.api.images(filters={"label": f"{RECIPE_LABEL}={recipe}"}):
        remove_image(client, image["Id"])
    (store / "sha256" / recipe[:2] / f"{recipe}.tar.zst").unlink()
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{scorers}@tool_check")
    rows = q(db, "SELECT DISTINCT status, reason FROM latest_scores")
    assert rows == [("unscored", "sandbox_unavailable")]
    (why,) = {e for (e,) in q(db, "SELECT explanation FROM latest_scores")}
    assert f"recipe {recipe[:12]} is in none of the stores" in why, why


def test_a_dockerfile_alone_and_an_image_named_in_the_config_are_run_and_rescored_in(
    client, prefect_api, tmp_path, tool_scorers
):
    from scorers.sandbox.task_image import TASK_IMAGE_REPOSITORY

    recipe = kit.recipe_dir(tmp_path / "task")
    log = generate(tmp_path / "dockerfile", "squares_dockerfile", {"recipe": str(recipe)})
    (box,) = {(b["recipe_config"], b["image_id"], b["recipe"]) for b in records(log)}
    client.test_recipes.append(box[2])
    assert box[0] == "Dockerfile"
    scorers = tool_scorers
    score(log, tmp_path / "a.duckdb", f"{scorers}@tool_check")
    # no compose file: no service variables, the rest as with one
    assert q(tmp_path / "a.duckdb", VERDICTS) == [
        (n, s, v, "from the image|", e) for n, s, v, _, e in RIGHT_VERDICTS
    ]

    # the same image under a name of the user's only (its gradebook tag removed): a config
    # naming an image records its ID and no recipe
    named = f"gradebook-test-named:{box[2][:12]}"
    client.images.get(box[1]).tag(named)
    for tag in client.images.get(box[1]).tags:
        if tag.startswith(TASK_IMAGE_REPOSITORY + ":"):
            client.images.remove(tag)
    log = generate(tmp_path / "named", "squares_named", {"image": named})
    assert {(b["image"], b["image_id"], b["recipe"]) for b in records(log)} == {
        (named, box[1], None)
    }
    score(log, tmp_path / "b.duckdb", f"{scorers}@tool_check")
    assert [r[:3] for r in q(tmp_path / "b.duckdb", VERDICTS)] == [r[:3] for r in RIGHT_VERDICTS]
    remove_image(client, named)  # gone, and nothing to rebuild it from: unscored, never wrong
    score(log, tmp_path / "c.duckdb", f"{scorers}@tool_check")
    rows = q(
        tmp_path / "c.duckdb", "SELECT DISTINCT status, reason, explanation FROM latest_scores"
    )
    assert [(s, r) for s, r, _ in rows] == [("unscored", "sandbox_unavailable")]
    assert "no recipe was recorded to rebuild it" in rows[0][2], rows


def test_a_workspace_captured_under_another_provider_says_it_was_restored_into_a_stand_in(
    client, prefect_api, tmp_path, tool_scorers
):
    """Inspect's `local` provider here (the path Inspect's docker sandbox takes too): its
    files come back in gradebook's image, and the evidence says so."""
    log = generate(tmp_path, "squares_local", {})
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{tool_scorers}@answer_read")
    assert q(db, "SELECT sample_id, value FROM latest_scores ORDER BY 1") == [
        ("1", 1.0),
        ("2", 0.0),  # its agent's answer is wrong
    ]
    stand_in = "SELECT DISTINCT metadata->>'$.sandbox.restored.default.stand_in' FROM latest_scores"
    assert q(db, stand_in) == [
        ("captured under the 'local' sandbox; restored into gradebook's image",)
    ]


def test_a_two_service_compose_task_gets_each_service_as_a_named_sandbox(
    client, prefect_api, tmp_path, tool_scorers
):
    from scorers.sandbox.image import image_tag

    recipe = kit.recipe_dir(tmp_path / "task", services=kit.TWO_SERVICES.format(base=image_tag()))
    log = generate(tmp_path, "squares_two", {"recipe": str(recipe)})
    sample = read_eval_log(log).samples[0]
    boxes = {b["name"]: b for b in sample.store["gradebook_workspace"]["sandboxes"]}
    client.test_recipes.append(boxes["default"]["recipe"])
    assert set(boxes) == {"default", "helper"}
    # the helper runs the image it names (no build), the default the one built with the tool
    assert boxes["helper"]["image"] == image_tag()
    assert boxes["helper"]["image_id"] == client.images.get(image_tag()).id
    assert (boxes["helper"]["user"], boxes["default"]["user"]) == ("root", "10002:10002")
    scorers = tool_scorers
    db = tmp_path / "gb.duckdb"
    score(log, db, f"{scorers}@two_services")
    assert q(db, "SELECT sample_id, value, answer FROM latest_scores ORDER BY 1") == [
        ("1", 1.0, "helper 1"),
        ("2", 0.0, "helper 2"),  # its agent's answer is wrong: the tool says so
    ]


def test_a_refused_compose_key_fails_the_task_in_one_line_naming_it(client, prefect_api, tmp_path):
    recipe = kit.recipe_dir(tmp_path / "task")
    compose = recipe / "compose.yaml"
    compose.write_text(compose.read_text() + "    ports: ['8080:80']\n")
    task_cfg = TaskConfig(task=f"{kit.KIT}@squares", args={"recipe": str(recipe)})
    (result,) = run_generation(MODEL, [task_cfg], tmp_path / "logs",
                               workspaces=WorkspacesConfig(store=tmp_path / "store"))  # fmt: skip
    assert result.status == "error", result
    assert "services.default.ports: published ports cannot be honoured" in result.error
    assert "\n" not in result.error


def test_the_image_cache_keeps_its_cap_removing_only_its_own_least_recently_used(
    client, tmp_path, monkeypatch
):
    import os
    import uuid

    from scorers.sandbox import image_cache, task_image
    from scorers.sandbox.image import image_tag
    from scorers.sandbox.recipe import read_recipe

    ours, theirs = f"test-{uuid.uuid4().hex[:8]}@here", f"other-{uuid.uuid4().hex[:8]}@there"

    def build(name: str, owner: str) -> str:
        monkeypatch.setattr(task_image, "built_by", lambda: owner)
        root = tmp_path / name
        root.mkdir()
        (root / "f.txt").write_text(name + uuid.uuid4().hex)
        (root / "Dockerfile").write_text(f"FROM {image_tag()}\nCOPY f.txt /f.txt\n")
        recipe = read_recipe(root / "Dockerfile")
        client.test_recipes.append(recipe.digest)
        tag, built = task_image.build_service(client, recipe, recipe.services[0])
        assert built
        return client.images.get(tag).id

    old, new, middle = build("old", ours), build("new", ours), build("middle", ours)
    other = build("other", theirs)  # another user's: never touched, whatever its age
    marks = {old: 1_000, middle: 2_000, new: 3_000, other: 0}
    for image_id, when in marks.items():
        image_cache.mark_used(image_id)
        mark = image_cache._marks() / image_id.removeprefix("sha256:")
        os.utime(mark, (when, when))
    holder = client.api.create_container(old, ["true"])["Id"]  # a container uses the oldest
    try:
        size = max(int(client.images.get(i).attrs["Size"]) for i in marks)
        monkeypatch.setattr(image_cache, "built_by", lambda: ours)
        pruned = image_cache.prune(client, int(2.5 * size))
        assert pruned.in_use == [old]  # the oldest, kept: a container uses it
        assert pruned.removed == [middle]  # then the least recently used of ours
        assert set(marks) & set(client.api.images(quiet=True)) == {old, new, other}
    finally:
        client.api.remove_container(holder, force=True)


def test_the_agentic_demo_runs_and_rescores_in_its_own_image(
    client, prefect_api, tmp_path, monkeypatch
):
    """`gradebook demo --agentic --own-image`: the scorer calls `repo-check`, a tool only the
    task's image has; generated, captured and re-scored in that image, with the same verdicts
    and flips as the demo in gradebook's image."""
    from flows.cli.demo_agentic import IMAGE_SCORER, run_agentic_demo
    from flows.runtime.console import console

    monkeypatch.setattr(console, "width", 160)
    with console.capture() as captured:
        code = run_agentic_demo(tmp_path, tickets=6, own_image=True)
    out = captured.get()
    assert code == 0, out
    db = tmp_path / "demo.duckdb"
    # the demo's image is left on the Engine, as `gradebook demo` leaves it (and as the sandbox
    # image is): another checkout's demo may be starting a container of the same recipe now
    assert q(db, "SELECT DISTINCT image LIKE 'gradebook-task:%' FROM workspaces") == [(True,)]
    assert q(db, "SELECT sample_id::INTEGER, old_value, new_value FROM grade_flips "
                 "ORDER BY 1") == [(3, 1.0, 0.0), (6, 1.0, 0.0)]  # fmt: skip
    latest = q(db, f"SELECT sample_id::INTEGER, value, answer FROM latest_scores "
                   f"WHERE scorer = '{IMAGE_SCORER}' ORDER BY 1")  # fmt: skip
    assert [(n, v) for n, v, _ in latest] == [(1, 1.0), (2, 1.0), (3, 0.0), (4, 1.0), (5, 0.0),
                                              (6, 0.0)]  # fmt: skip
    assert all(a.startswith("repo-check: ") for _, _, a in latest), latest
    assert "model calls: 0" in out and "ran in the task's own image gradebook-task:" in out
