"""Two checkouts building the sandbox image at once (two `make services`): one builds, the other
waits for it and reuses the image, on the real Docker Engine."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import need
from process_kit import wait_for

from scorers.sandbox.image import IMAGE_REPOSITORY, recipe_digest

pytestmark = pytest.mark.docker

# A stand-in for infra/sandbox/build_rootfs.sh (debootstrap takes minutes and root): it records
# that it ran, then holds the build open until the test lets it finish.
RECIPE = """#!/usr/bin/env bash
# {nonce}
set -euo pipefail
touch "$GRADEBOOK_TEST_MARKS/started.$$"
while [[ ! -e "$GRADEBOOK_TEST_GO" ]]; do sleep 0.1; done
mkdir -p "$1/etc"
echo built > "$1/etc/recipe"
"""

BUILD = (
    "import sys; from pathlib import Path; from scorers.sandbox.image import build_image; "
    "tag, built = build_image(Path(sys.argv[1])); print(tag, built)"
)


def test_two_builds_of_one_recipe_at_once_run_the_recipe_once(tmp_path):
    import docker
    import docker.errors

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        need(False, f"Docker Engine not reachable: {exc}")
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "build_rootfs.sh").write_text(RECIPE.format(nonce=uuid.uuid4().hex))
    (recipe / "users.env").write_text("HARNESS_UID=10001\nSANDBOX_UID=10002\n")
    marks, go = tmp_path / "marks", tmp_path / "go"
    marks.mkdir()
    env = {
        **os.environ,
        "GRADEBOOK_TEST_MARKS": str(marks),
        "GRADEBOOK_TEST_GO": str(go),
    }

    def build(name: str) -> tuple[subprocess.Popen[str], Path]:
        err = tmp_path / f"{name}.err"
        with open(err, "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", BUILD, str(recipe)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        return proc, err

    def started() -> int:
        return len(list(marks.iterdir()))

    tag = f"{IMAGE_REPOSITORY}:{recipe_digest(recipe)[:16]}"
    first, _ = build("first")
    second = None
    try:
        wait_for(lambda: started() == 1, 120, "the first build running its recipe")
        second, second_err = build("second")
        # the second either waits for the first (announcing it) or runs the recipe itself
        wait_for(
            lambda: "another process is building it" in second_err.read_text() or started() > 1,
            120,
            "the second build waiting or building",
        )
        go.touch()
        outs = [p.communicate(timeout=300)[0].split() for p in (first, second)]
        assert [p.returncode for p in (first, second)] == [0, 0], outs
        assert started() == 1, "the recipe ran twice"
        assert sorted(outs) == sorted([[tag, "True"], [tag, "False"]])
    finally:
        go.touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
