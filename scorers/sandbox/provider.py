"""An Inspect sandbox provider ("gradebook") on the same locked-down containers as the scorer.

For agentic tasks that need a sandbox during generation on engines where Inspect's own docker
sandbox cannot run (Engine < 24, no Compose v2). One container per sample, network-less,
read-only root, tmpfs /work, resource caps, non-root; removed at sample cleanup. Use it as
`Task(..., sandbox="gradebook")`. Commands run as the submission uid unless `user` is given.

A task with several named sandboxes (`sandbox("helper")`) gives their names in the config:
`sandbox=("gradebook", GradebookSandboxConfig(environments=["default", "helper"]))`, one
container each, the first the default. `archive` streams a tar of the workspace out (what
workspaces.capture keeps of a sample's sandbox).

A task that brings its own image runs in it, under the same lockdown (no network, capabilities
dropped, no-new-privileges, caps, a lifeline; the working directory writable and holding the
image's own files there): `sandbox=("gradebook", "compose.yaml")` (one named sandbox per
service), `("gradebook", "Dockerfile")`, or `GradebookSandboxConfig(image="name:tag")`. Recipes
are read and built by scorers.sandbox.recipe and scorers.sandbox.task_image, once per recipe,
in `task_init`. A task written for Inspect's `("docker", "compose.yaml")` runs here unchanged
with `eval(sandbox="gradebook")`: this provider is docker-compatible (`config_files`), so Inspect
hands it the task's own compose file.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from typing import Any, Literal, Union, overload

import anyio
from inspect_ai.util import ExecResult, SandboxEnvironment, SandboxEnvironmentConfigType, sandboxenv
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits
from pydantic import BaseModel, Field, field_validator

from scorers.sandbox.image import image_tag, sandbox_users
from scorers.sandbox.image_cache import cap_bytes, mark_used, prune
from scorers.sandbox.pool import (
    SandboxLimits,
    TaskImageRun,
    _frames,
    create_container,
    owner_label,
    reap_orphans,
)
from scorers.sandbox.recipe import COMPOSE_NAMES, Recipe, RecipeError, is_recipe_file, read_recipe
from scorers.sandbox.task_image import (
    RunImage,
    local_image,
    recipe_images,
    workdir_files,
    workdir_owner,
)
from scorers.sandbox.task_image import run_image as image_run

# Writes stdin to argv[1], creating parent directories (the root filesystem is read-only,
# so `docker cp`/put_archive cannot be used; only /work is writable).
_WRITE = (
    "import os, sys\n"
    "path = sys.argv[1]\n"
    "os.makedirs(os.path.dirname(path) or '.', exist_ok=True)\n"
    "with open(path, 'wb') as f:\n"
    "    f.write(sys.stdin.buffer.read())\n"
)


def _exec_blocking(
    client: Any,
    container_id: str,
    cmd: list[str],
    *,
    user: str,
    workdir: str,
    env: dict[str, str] | None,
    stdin: bytes | None,
    timeout: float | None,
    cap: int,
) -> tuple[int, bytes, bytes]:
    api = client.api
    exec_id = api.exec_create(
        container_id,
        cmd,
        stdin=stdin is not None,
        stdout=True,
        stderr=True,
        user=user,
        workdir=workdir,
        environment=env,
    )["Id"]
    response = api.exec_start(exec_id, socket=True)
    sock: socket.socket = getattr(response, "_sock", response)
    out, err, buffer = bytearray(), bytearray(), bytearray()
    deadline = time.monotonic() + timeout if timeout else None
    try:
        if stdin is not None:
            sock.sendall(stdin)
            sock.shutdown(socket.SHUT_WR)
        while True:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                _kill_exec(api, exec_id)
                raise TimeoutError(f"command timed out after {timeout}s: {cmd[:1]}")
            ready, _, _ = select.select([sock], [], [], wait)
            if not ready:
                continue
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buffer += chunk
            for stream, data in _frames(buffer):
                target = out if stream == 1 else err
                target.extend(data)
            if len(out) + len(err) > cap:
                _kill_exec(api, exec_id)
                raise RuntimeError(f"command output exceeded {cap} bytes")
    finally:
        sock.close()
    code = api.exec_inspect(exec_id).get("ExitCode")
    return (code if code is not None else 1), bytes(out), bytes(err)


def _kill_exec(api: Any, exec_id: str) -> None:
    # The exec's host pid: dockerd has no "kill exec" call. Killing it ends the command only.
    pid = api.exec_inspect(exec_id).get("Pid")
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class GradebookSandboxConfig(BaseModel, frozen=True):
    """The "gradebook" provider's config: the names of a sample's sandboxes (one container
    each; the first is the default), and the image they run (a local one: nothing is pulled;
    None: gradebook's own sandbox image)."""

    # a tuple: Inspect hashes a task's sandbox spec, config included
    environments: tuple[str, ...] = Field(default=("default",), min_length=1)
    image: str | None = None

    @field_validator("environments")
    @classmethod
    def _names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v) or not all(name.strip() for name in v):
            raise ValueError("environment names must be distinct and non-empty")
        return v


def _names(config: SandboxEnvironmentConfigType | None) -> list[str]:
    if isinstance(config, GradebookSandboxConfig):
        return list(config.environments)
    return ["default"]


# the images of the recipe each task's config names, read (and built) by its task_init: the
# recipe is packed once per task run, not once per sample
_RECIPES: dict[str, dict[str, RunImage]] = {}


def task_images(
    client: Any, config: SandboxEnvironmentConfigType | None, *, fresh: bool = False
) -> dict[str, RunImage]:
    """The task's own images a config names, by sandbox name ({}: gradebook's own image),
    built where needed (once per recipe). A recipe file is relative to the task's directory
    (the working directory Inspect runs a task's sandbox calls in).

    Raises:
        RecipeError: a recipe gradebook cannot honour (one line naming the key).
        TaskImageUnavailable: an image that cannot be built or found.
    """
    if is_recipe_file(config):
        assert isinstance(config, str)
        key = os.path.abspath(config)
        if fresh or key not in _RECIPES:
            recipe: Recipe = read_recipe(config)
            _RECIPES[key] = recipe_images(client, recipe)
        return _RECIPES[key]
    if isinstance(config, GradebookSandboxConfig) and config.image:
        named = config.image
        image = local_image(client, named, why="named by the sandbox config")
        return {name: image_run(image, named) for name in config.environments}
    if config is not None and not isinstance(config, GradebookSandboxConfig):
        raise RecipeError(
            f"sandbox config {config!r}: give a compose file, a Dockerfile or a "
            "GradebookSandboxConfig"
        )
    return {}


def _limits(image: RunImage) -> SandboxLimits:
    """gradebook's caps, lowered where the service asks for less."""
    base = SandboxLimits()
    memory = min(base.memory_mb, image.mem_limit_mb or base.memory_mb)
    return SandboxLimits(memory_mb=memory, pids=base.pids, cpus=min(base.cpus, image.cpus or base.cpus),
                         work_mb=base.work_mb, output_bytes=base.output_bytes)  # fmt: skip


@sandboxenv(name="gradebook")
class GradebookSandboxEnvironment(SandboxEnvironment):
    """One hardened container per sample (see scorers/sandbox/pool.py for the limits).

    Args:
        client: a `docker.DockerClient`.
        container: the started container (`scorers.sandbox.pool.LiveContainer`).
        image: the image it was started from.
        workdir: where relative paths and commands without `cwd` go.
    """

    def __init__(
        self,
        client: Any,
        container: Any,
        image: str | None = None,
        workdir: str = "/work",
        *,
        task_image: RunImage | None = None,
    ) -> None:
        super().__init__()
        self._client = client
        self._container = container
        self.image = image
        self.workdir = workdir
        # a task's own image: what capture records of it (its ID, its recipe)
        self.task_image = task_image
        users = sandbox_users()
        self._default_user = (
            task_image.user if task_image else f"{users.sandbox_uid}:{users.sandbox_uid}"
        )

    @classmethod
    def config_files(cls) -> list[str]:
        # docker-compatible: Inspect hands this provider a task's own compose file or Dockerfile
        return [*COMPOSE_NAMES, "Dockerfile"]

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return GradebookSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        import docker

        def init() -> None:
            client = docker.from_env(timeout=600)
            reap_orphans(client)
            built = task_images(client, config, fresh=True)  # built before any sample
            if built:
                prune(client, cap_bytes(), keep=frozenset(i.image_id for i in built.values()))

        await anyio.to_thread.run_sync(init)

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        import docker

        client = docker.from_env(timeout=120)
        own = await anyio.to_thread.run_sync(lambda: task_images(client, config))
        for image in own.values():
            mark_used(image.image_id)

        def start(name: str) -> GradebookSandboxEnvironment:
            harness_uid = sandbox_users().harness_uid
            task_image = own.get(name)
            if task_image is None:
                image = image_tag()
                container = create_container(
                    client, image, SandboxLimits(), user=f"{harness_uid}:{harness_uid}",
                    owner=owner_label(),
                )  # fmt: skip
                return cls(client, container, image)
            limits = _limits(task_image)
            files = workdir_files(client, task_image.image_id, task_image.workdir,
                                  limits.work_mb * 2**20)  # fmt: skip
            run = TaskImageRun(task_image.workdir, task_image.environment, workdir_owner(files))
            container = create_container(
                client, task_image.ref, limits, user=f"{harness_uid}:{harness_uid}",
                owner=owner_label(), task_image=run,
            )  # fmt: skip
            env = cls(client, container, task_image.ref, task_image.workdir, task_image=task_image)
            if files:
                try:
                    env._unpack_image_files(files)
                except BaseException:
                    container.remove()
                    raise
            return env

        names = list(own) if is_recipe_file(config) else _names(config)
        environments: dict[str, SandboxEnvironment] = {}
        try:
            for name in names:
                environments[name] = await anyio.to_thread.run_sync(start, name)
        except BaseException:
            for started in environments.values():
                await anyio.to_thread.run_sync(started.as_type(cls)._container.remove)
            raise
        return environments

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            env = environment.as_type(GradebookSandboxEnvironment)
            await anyio.to_thread.run_sync(lambda e=env: e._container.remove())

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        stdin = input.encode() if isinstance(input, str) else input
        workdir = self._path(cwd) if cwd else self.workdir
        code, out, err = await anyio.to_thread.run_sync(
            lambda: _exec_blocking(
                self._client,
                self._container.id,
                cmd,
                user=user or self._default_user,
                workdir=workdir,
                env=env,
                stdin=stdin,
                timeout=timeout,
                cap=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
            )
        )
        return ExecResult(
            success=code == 0,
            returncode=code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
        )

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        result = await self.exec(
            ["python3", "-I", "-S", "-c", _WRITE, self._path(file)], input=data
        )
        if not result.success:
            if "Permission denied" in result.stderr:
                raise PermissionError(f"cannot write {file}: {result.stderr.strip()[-200:]}")
            raise RuntimeError(f"cannot write {file}: {result.stderr.strip()[-200:]}")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007
        path = self._path(file)
        code, out, err = await anyio.to_thread.run_sync(
            lambda: _exec_blocking(
                self._client,
                self._container.id,
                ["cat", "--", path],
                user=self._default_user,
                workdir=self.workdir,
                env=None,
                stdin=None,
                timeout=60,
                cap=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE,
            )
        )
        if code != 0:
            message = err.decode(errors="replace")
            if "No such file" in message:
                raise FileNotFoundError(f"{file} does not exist in the sandbox")
            if "Is a directory" in message:
                raise IsADirectoryError(f"{file} is a directory")
            raise PermissionError(f"cannot read {file}: {message.strip()[-200:]}")
        return out.decode() if text else out

    def _unpack_image_files(self, files: bytes) -> None:
        """Put the image's own files at the working directory into its tmpfs, as the user
        commands run as (a tar read from the image: `workdir_files`)."""
        code, _, err = _exec_blocking(
            self._client,
            self._container.id,
            [
                "tar",
                "-x",
                "-f",
                "-",
                "--no-same-owner",
                "--strip-components=1",
                "-C",
                self.workdir,
            ],  # fmt: skip
            user=self._default_user,
            workdir="/",
            env=None,
            stdin=files,
            timeout=120,
            cap=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
        )
        if code != 0:
            raise RuntimeError(
                f"could not copy the image's files into {self.workdir}: "
                f"{err.decode(errors='replace').strip()[-300:]}"
            )

    def _path(self, file: str) -> str:
        return file if file.startswith("/") else f"{self.workdir}/{file}"

    async def archive(self, paths: list[str], cap: int, timeout: float = 120) -> tuple[bytes, str]:
        """A tar stream of `paths` (absolute) as the sandbox uid reads them, and tar's
        complaints (files it could not read are left out, not fatal).

        Raises:
            RuntimeError: the stream is longer than `cap` bytes, or tar failed.
            TimeoutError: it took longer than `timeout` seconds.
        """
        relative = [p.lstrip("/") or "." for p in paths]
        code, out, err = await anyio.to_thread.run_sync(
            lambda: _exec_blocking(
                self._client,
                self._container.id,
                [
                    "tar",
                    "--create",
                    "--file=-",
                    "--ignore-failed-read",
                    "--directory=/",
                    "--",
                    *relative,
                ],  # fmt: skip
                user=self._default_user,
                workdir="/",
                env=None,
                stdin=None,
                timeout=timeout,
                cap=cap,
            )
        )
        message = err.decode(errors="replace")
        if code not in (0, 1):  # 1: a file changed while it was read (kept as read)
            raise RuntimeError(f"tar exited {code}: {message.strip()[-300:]}")
        return out, message
