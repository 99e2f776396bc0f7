"""A task's image recipe read into what gradebook's sandbox honours: each compose key it cannot
honour refused in one line naming it, the no-ops accepted, the recipe one content-addressed
archive (the same files, the same digest; a changed file, a new one), read back from a store
as hostile input."""

from __future__ import annotations

import io
import tarfile
import textwrap
from pathlib import Path

import pytest

from scorers.sandbox.recipe import RecipeError, is_recipe_file, parse_recipe, read_recipe


def _task(tmp: Path, service_lines: str = "", top: str = "") -> Path:
    (tmp / "image").mkdir(exist_ok=True)
    (tmp / "image" / "Dockerfile").write_text("FROM base\n")
    (tmp / "image" / "tool").write_text("#!/bin/sh\n")
    body = textwrap.indent(textwrap.dedent(service_lines), "    ")
    (tmp / "compose.yaml").write_text(
        f"services:\n  default:\n    build: image\n{body}{textwrap.dedent(top)}"
    )
    return tmp / "compose.yaml"


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        ("ports: ['8080:80']\n", "services.default.ports: published ports cannot be honoured"),
        ("volumes: ['/etc:/host-etc']\n", "services.default.volumes: host volumes cannot"),
        ("privileged: true\n", "services.default.privileged: privileged containers cannot"),
        ("networks: [backend]\n", "services.default.networks: networks between services"),
        ("network_mode: host\n", "services.default.network_mode: only `network_mode: none`"),
        ("cap_add: [NET_ADMIN]\n", "services.default.cap_add: added capabilities cannot"),
        ("devices: ['/dev/kvm']\n", "services.default.devices: not supported"),
    ],
)
def test_each_compose_key_that_cannot_be_honoured_is_refused_in_one_line_naming_it(
    tmp_path, lines, named
):
    with pytest.raises(RecipeError) as raised:
        read_recipe(_task(tmp_path, lines))
    message = str(raised.value)
    assert named in message and "\n" not in message, message


def test_networks_and_volumes_between_services_are_refused_at_the_top_level(tmp_path):
    with pytest.raises(RecipeError, match=r"compose.yaml: networks: networks between services"):
        read_recipe(_task(tmp_path, top="networks:\n  backend: {}\n"))
    with pytest.raises(RecipeError, match=r"compose.yaml: volumes: host volumes"):
        read_recipe(_task(tmp_path, top="volumes:\n  data: {}\n"))


def test_what_the_lockdown_already_does_is_accepted(tmp_path):
    recipe = read_recipe(
        _task(
            tmp_path,
            "network_mode: none\ninit: true\ncommand: tail -f /dev/null\nprivileged: false\n"
            "ports: []\nmem_limit: 256m\ncpus: 0.5\nx-default: true\nworking_dir: /work/repo\n"
            "user: '1000'\nenvironment: [MODE=test, EMPTY]\n",
        )
    )
    (service,) = recipe.services
    assert (service.working_dir, service.user, service.environment) == (
        "/work/repo", "1000", {"MODE": "test", "EMPTY": ""}
    )  # fmt: skip
    assert (service.mem_limit_mb, service.cpus, service.context) == (256, 0.5, "image")


def test_the_recipe_is_one_archive_whose_digest_follows_its_files(tmp_path):
    compose = _task(tmp_path)
    first, again = read_recipe(compose), read_recipe(compose)
    assert first.digest == again.digest and first.archive == again.archive
    with tarfile.open(fileobj=io.BytesIO(first.archive)) as tar:
        names = tar.getnames()
        assert names == ["compose.yaml", "image", "image/Dockerfile", "image/tool"]
        assert {m.mtime for m in tar.getmembers()} == {0}
    (tmp_path / "unrelated.py").write_text("x = 1\n")  # outside every build context
    assert read_recipe(compose).digest == first.digest
    (tmp_path / "image" / "tool").write_text("#!/bin/sh\necho changed\n")
    assert read_recipe(compose).digest != first.digest


def test_a_dockerfile_alone_is_a_one_service_recipe_of_its_directory(tmp_path):
    _task(tmp_path)
    recipe = read_recipe(tmp_path / "image" / "Dockerfile")
    assert [(s.name, s.context, s.dockerfile) for s in recipe.services] == [
        ("default", ".", "Dockerfile")
    ]
    assert is_recipe_file("image/Dockerfile") and is_recipe_file("compose.yaml")
    assert not is_recipe_file("notes.yaml") and not is_recipe_file(None)


def test_the_default_service_is_the_one_marked_else_the_one_named_default_else_the_first(
    tmp_path,
):
    (tmp_path / "compose.yaml").write_text(
        "services:\n  a: {image: x}\n  b: {image: y, x-default: true}\n  default: {image: z}\n"
    )
    assert [s.name for s in read_recipe(tmp_path / "compose.yaml").services] == [
        "b", "a", "default"
    ]  # fmt: skip


def test_a_recipe_read_back_from_a_store_is_checked_again(tmp_path):
    recipe = read_recipe(_task(tmp_path))
    assert parse_recipe(recipe.archive, "compose.yaml").services == recipe.services
    hostile = io.BytesIO()
    with tarfile.open(fileobj=hostile, mode="w") as tar:
        data = b"services:\n  default: {image: x, privileged: true}\n"
        info = tarfile.TarInfo("compose.yaml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(RecipeError, match="privileged"):
        parse_recipe(hostile.getvalue(), "compose.yaml")
    with pytest.raises(RecipeError, match="no readable 'Dockerfile'"):
        parse_recipe(hostile.getvalue(), "Dockerfile")


def test_a_missing_or_malformed_compose_file_is_one_line(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        read_recipe(tmp_path / "compose.yaml")
    (tmp_path / "compose.yaml").write_text("services: [a, b\n")
    with pytest.raises(RecipeError, match="not a YAML compose file"):
        read_recipe(tmp_path / "compose.yaml")
    (tmp_path / "compose.yaml").write_text("services:\n  default: {working_dir: /w}\n")
    with pytest.raises(RecipeError, match="services.default: needs `build` or `image`"):
        read_recipe(tmp_path / "compose.yaml")
