"""Restore at scoring: a scorer that calls `sandbox()` gets a fresh container with the workspace
its sample's agent left, captured at generation (workspaces.capture).

`Sandboxes` is one sample's sandboxes while one scorer grades it. Within `provided()` Inspect's
`sandbox()` and `sandbox("name")` return them (the scorer runs unchanged), each a
`RecordingSandbox` (workspaces.evidence) over a `LazySandbox`, which on its first call:

1. takes a place among the containers this process may run at once (`container_slots`: as many
   as the sandbox pool runs, one per core),
2. reads the archive its record names from the store, checks its sha256 and makes it canonical
   again (a stored object is hostile input: workspaces.archive),
3. starts a locked-down container from gradebook's sandbox image, exactly as the sandbox pool's
   (no network, read-only root, capabilities dropped, non-root, memory/pids/CPU caps, a
   lifeline that ends it with this process), with a tmpfs at each workspace path; or, for a
   sandbox that ran in the task's own image, from that image (the one recorded when this
   Engine has it, else rebuilt from the recipe kept in the store: workspaces.restore_image),
   under the same lockdown, as the user and with the variables its service had,
4. unpacks the archive there as the sandbox uid (`archive.EXTRACT`).

A sample whose log has no record (a log from elsewhere, or a task without a sandbox) gets a
fresh container of the same image for any name it asks for: enough for a scorer that runs the
completion's code. When its log names the compose file or Dockerfile it ran in and that file is
at hand (`--task-dir`, or beside the log's task file), the container is of that image instead,
one per service (workspaces.foreign_image); when it is not, gradebook's image stands in and
the evidence says so (`stand_in`). In any stand-in, a command the image lacks (exit 127) leaves
the sample `sandbox_unavailable`, never graded wrong. `aclose()` removes every container the
sample started, whatever happened, also one still starting when the scorer was cancelled.

Re-judging from the warehouse alone: a sample whose last grading under the same fingerprint
left it unscored because its judge failed (`grader_failed`) after every sandbox call had
completed is handed those calls (`sandbox_replay` in its state: the scoring stage's retry puts
them there), and its sandboxes answer the same calls with the recorded results, in order, with
no container. A call that differs from the recorded one (a scorer that does not repeat itself)
leaves the sample unscored (`verifier_error`), and its next retry restores a container.

What cannot be restored is not guessed at: the scorer's first sandbox call raises, and
`settle()` turns the sample's result into `unscored` with the reason, whatever the scorer made
of the exception: `sandbox_unavailable` (no Docker Engine or image; graded again by
`--retry-unscored`), `workspace_not_captured` (capture failed at generation, with its reason),
`workspace_missing` (the store does not hold the archive; also retried), `workspace_unusable`
(the archive or the record is damaged or too large).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, Union, overload

from inspect_ai.util import ExecResult, SandboxEnvironment

from scorers.sandbox.image import ImageBuildError, image_tag, sandbox_users
from scorers.sandbox.pool import (
    SandboxLimits,
    SandboxUnavailable,
    TaskImageRun,
    create_container,
    engine_with_image,
    owner_label,
)
from scorers.sandbox.provider import GradebookSandboxEnvironment
from scorers.sandbox.recipe import RecipeError
from scorers.sandbox.task_image import (
    RunImage,
    TaskImageUnavailable,
    workdir_files,
    workdir_owner,
)
from workspaces.archive import DEFAULT_MAX_BYTES, EXTRACT, ArchiveError, canonical, check_roots
from workspaces.evidence import Evidence, RecordingSandbox, sha256_of
from workspaces.foreign_image import (
    FOREIGN_KEY,
    FOREIGN_MARK,
    TASK_DIR_ENV,
    Foreign,
    foreign_image,
    missing_tool,
    resolve_foreign,
)
from workspaces.record import STORE_KEY, SandboxRecord, WorkspaceRecord
from workspaces.restore_image import restore_image
from workspaces.store import ObjectMissing, ObjectUnusable, open_store, split_stores

__all__ = [
    "RESTORE_LABEL",
    "STORES_ENV",
    "LazySandbox",
    "REPLAY_KEY",
    "Replay",
    "ReplaySandbox",
    "RestoreSettings",
    "Sandboxes",
    "ScoringFailure",
    "container_slots",
]

STORES_ENV = (
    "GRADEBOOK_WORKSPACE_STORES"  # more stores to look in: directories or URLs (os.pathsep)
)
RESTORE_LABEL = "gradebook.workspace"  # on every restore container: "restore"
_EXTRACT_TIMEOUT_S = 120
_MIB = 1024 * 1024

Reason = Literal[
    "sandbox_unavailable",
    "workspace_not_captured",
    "workspace_missing",
    "workspace_unusable",
    "verifier_error",
]
REPLAY_KEY = "sandbox_replay"  # in a sample's state: the calls of its last grading, to replay


class ScoringFailure(Exception):
    """A sample's sandbox could not be given to its scorer: `reason` is the unscored reason."""

    def __init__(self, reason: Reason, explanation: str) -> None:
        super().__init__(explanation)
        self.reason = reason
        self.explanation = explanation


@dataclass(frozen=True)
class RestoreSettings:
    """The sandbox a sandbox scorer's samples are restored into (its image and limits are what
    its fingerprint covers: scorers.inspect_scorers.sandboxed.sandbox_spec).

    Attributes:
        image: the image (gradebook's sandbox image unless GRADEBOOK_SANDBOX_IMAGE says).
        limits: the container caps (the sandbox pool's).
        max_bytes: cap on an archive read back from the store.
        stores: more stores (directories or `s3://` URLs), tried after the one a record names.
        task_dir: where a log from elsewhere's compose file is looked for first (`--task-dir`).
    """

    image: str
    limits: SandboxLimits = SandboxLimits()
    max_bytes: int = DEFAULT_MAX_BYTES
    stores: tuple[str, ...] = ()
    task_dir: str | None = None

    @classmethod
    def here(cls) -> RestoreSettings:
        stores = tuple(split_stores(os.environ.get(STORES_ENV, "")))
        return cls(image=image_tag(), stores=stores, task_dir=os.environ.get(TASK_DIR_ENV) or None)


_SLOTS: dict[int, asyncio.Semaphore] = {}
_SLOTS_LOCK = threading.Lock()


def container_slots() -> asyncio.Semaphore:
    """The running event loop's limit on samples holding restore containers at once: the
    sandbox pool's own bound (one per core)."""
    loop = asyncio.get_running_loop()
    with _SLOTS_LOCK:
        found = _SLOTS.get(id(loop))
        if found is None:
            found = _SLOTS[id(loop)] = asyncio.Semaphore(max(1, os.cpu_count() or 1))
        return found


# this process's Docker clients whose Engine answered, by the environment that names the Engine
_CLIENTS: dict[tuple[str | None, ...], Any] = {}
_CLIENT_LOCK = threading.Lock()
_ENGINE_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


def _client(image: str, *, check: bool = False) -> Any:
    """A Docker client whose Engine answered and held `image` (checked once per process and
    Engine, and again with `check`: after a container failed to start).

    Raises:
        SandboxUnavailable: no Engine, or no image.
    """
    key = tuple(os.environ.get(name) for name in _ENGINE_ENV) + (image,)
    with _CLIENT_LOCK:
        if key in _CLIENTS and not check:
            return _CLIENTS[key]
        try:
            client, _ = engine_with_image(image, _CLIENTS.get(key))
        except ImageBuildError as exc:
            _CLIENTS.pop(key, None)
            raise SandboxUnavailable(str(exc)) from None
        except SandboxUnavailable:
            _CLIENTS.pop(key, None)
            raise
        _CLIENTS[key] = client
        return client


class Sandboxes:
    """One sample's sandboxes while one scorer grades it.

    Args:
        state_json: the sample's state as the scoring stage hands it over (its `store` holds
            the workspace record); None: no record.
        settings: where to restore (default: `RestoreSettings.here()`).
    """

    def __init__(self, state_json: str | None, settings: RestoreSettings | None = None) -> None:
        self.settings = settings or RestoreSettings.here()
        self.evidence = Evidence()
        self.failure: ScoringFailure | None = None
        self.record: WorkspaceRecord | None = None
        self._bad_record: str | None = None
        self.replay: Replay | None = None
        self.foreign: Foreign | None = None  # no record: what the log says it ran in
        try:
            # most samples have no record: a substring test spares parsing their whole state
            wanted = state_json and any(
                k in state_json for k in (STORE_KEY, REPLAY_KEY, FOREIGN_MARK)
            )
            state = json.loads(state_json) if wanted else {}
            state = state if isinstance(state, dict) else {}
            store = state.get("store")
            if isinstance(store, str):  # DuckDB hands a JSON column over as its text
                store = json.loads(store)
            self.replay = Replay.from_evidence(state.get(REPLAY_KEY))
            self.record = WorkspaceRecord.from_store(store)
            if self.record is None:
                self.foreign = resolve_foreign(state.get(FOREIGN_KEY), self.settings.task_dir)
        except (ValueError, TypeError) as exc:
            self._bad_record = str(exc)[:300]
        self._started: list[asyncio.Future[Any]] = []  # container starts, done or not
        self._slot: asyncio.Semaphore | None = None
        names = [s.name for s in self.record.sandboxes] if self.record else ["default"]
        self.default = names[0] if "default" not in names else "default"
        services = self.foreign.names if self.foreign is not None else ()
        if services:  # a recipe's services, its default first (Inspect's rule)
            names, self.default = list(services), services[0]
        open_ended = self.record is None and not services
        self.environments = _Environments(self, names, open_ended=open_ended)

    # -- what the scorer sees ----------------------------------------------------------------

    @contextlib.contextmanager
    def provided(self) -> Iterator[None]:
        """Within the block, Inspect's `sandbox()` returns this sample's sandboxes."""
        from inspect_ai.util._sandbox.context import (
            sandbox_default_context_var,
            sandbox_environments_context_var,
            sandbox_with_environments_context_var,
        )

        tokens = (
            sandbox_environments_context_var.set(self.environments),
            sandbox_with_environments_context_var.set({}),
            sandbox_default_context_var.set(self.default),
        )
        try:
            yield
        finally:
            sandbox_default_context_var.reset(tokens[2])
            sandbox_with_environments_context_var.reset(tokens[1])
            sandbox_environments_context_var.reset(tokens[0])

    async def reserve(self) -> None:
        """Take this sample's place among the containers (before its time limit starts, for a
        scorer known to use a sandbox; else at its first sandbox call)."""
        if self._slot is None:
            slot = container_slots()
            await slot.acquire()
            self._slot = slot

    def fail(self, failure: ScoringFailure) -> ScoringFailure:
        if self.failure is None:
            self.failure = failure
        return failure

    # -- the sample's end --------------------------------------------------------------------

    async def aclose(self) -> None:
        """Remove every container this sample started (waits for one still starting). Their
        lifelines are closed first, which ends them: the sample's place among the containers
        is free before Docker has finished removing them."""
        containers = []
        try:
            for started in self._started:
                try:
                    env = await asyncio.shield(started)
                except BaseException:  # noqa: BLE001, S112 - a start that failed left nothing
                    continue
                env._container.close_lifeline()  # noqa: SLF001 - its own container
                containers.append(env._container)  # noqa: SLF001
        finally:
            self._started.clear()
            if self._slot is not None:
                self._slot.release()
                self._slot = None
            loop = asyncio.get_running_loop()
            for container in containers:
                await loop.run_in_executor(None, container.remove)

    def settle(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """The sample's result row (scorers.workers.pool's ResultRow) with the sandbox evidence
        in its metadata, and `unscored` with the failure's reason if a sandbox could not be
        given (whatever the scorer returned after the exception)."""
        used = self.evidence.total or self.evidence.restored or self.failure
        if not used:
            return row
        try:
            meta = json.loads(row[5]) if row[5] else {}
        except (TypeError, ValueError):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        meta["sandbox"] = self.evidence.to_json()
        text = json.dumps(meta, default=str)
        if self.failure is not None:
            return ("unscored", None, None, self.failure.explanation[:300], self.failure.reason,
                    text, row[6])  # fmt: skip
        return (*row[:5], text, row[6])

    # -- restoring ---------------------------------------------------------------------------

    def _archive(self, record: SandboxRecord) -> tuple[bytes, list[str], list[Any]]:
        """The canonical archive a record names, from the first store that has it."""
        if self.record is None or not record.digest:
            raise ScoringFailure("workspace_unusable", "the workspace record names no archive")
        try:
            roots = check_roots(record.paths)
        except ArchiveError as exc:
            raise ScoringFailure("workspace_unusable", f"workspace record: {exc}") from None
        stores = [self.record.store, *self.settings.stores]
        data = None
        unreachable: list[str] = []
        for root in stores:
            try:
                data = open_store(root).get(record.digest, self.settings.max_bytes)
                break
            except ObjectMissing:
                continue
            except ObjectUnusable as exc:
                raise ScoringFailure("workspace_unusable", str(exc)) from None
            except (OSError, ValueError) as exc:  # an unreadable store: as if it were not there
                unreachable.append(" ".join(str(exc).split())[:200])
                continue
        if data is None:
            why = f" ({'; '.join(unreachable)})" if unreachable else ""
            raise ScoringFailure(
                "workspace_missing",
                f"workspace {record.digest[:12]} of sandbox {record.name!r} is in none of the "
                f"stores {', '.join(stores)}{why}: mount the store there, or name its directory "
                f"or URL in {STORES_ENV}, then grade again with --retry-unscored",
            )
        try:
            clean = canonical(data, roots, max_bytes=self.settings.max_bytes)
        except ArchiveError as exc:
            raise ScoringFailure("workspace_unusable", f"workspace archive: {exc}") from None
        return clean.data, roots, list(clean.skipped)

    def _start(
        self, name: str, roots: list[str], size: int, workdir: str, record: SandboxRecord | None
    ) -> GradebookSandboxEnvironment:
        """A started restore container (blocking: run in a thread)."""
        own = self._task_image(record) if record is not None else self._foreign_image(name)
        # a log from elsewhere, in its task's image: the image as it is, its own files at its
        # working directory (as gradebook's provider starts one)
        as_built = record is None and own is not None
        if as_built:
            assert own is not None
            workdir, roots = own.workdir, []
        image = own.ref if own is not None else self.settings.image
        client = _client(image)
        limits = self.settings.limits
        if size:
            # room for the restored files on top of the sandbox's own work space
            extra = math.ceil(size / _MIB) + 1
            limits = SandboxLimits(**{**asdict(limits), "work_mb": limits.work_mb + extra})
        harness = sandbox_users().harness_uid
        base = workdir if own is not None else "/work"
        writable = [r for r in roots if r != base and not r.startswith(base.rstrip("/") + "/")]
        if workdir != "/" and not any(
            workdir == r or workdir.startswith(r + "/") for r in [base, *roots]
        ):
            writable.append(workdir)  # the working directory, empty, as a fresh sandbox has it
        run, files = None, b""
        if own is not None:
            # the working directory owned as in the image (empty: the workspace goes there)
            files = workdir_files(client, own.image_id, workdir, limits.work_mb * _MIB)
            run = TaskImageRun(workdir, own.environment, workdir_owner(files))

        def create(client: Any) -> Any:
            return create_container(
                client,
                image,
                limits,
                user=f"{harness}:{harness}",
                owner=owner_label(),
                workdirs=writable,
                labels={RESTORE_LABEL: "restore"},
                task_image=run,
            )

        try:
            container = create(client)
        except Exception:  # noqa: BLE001 - the Engine or the image went away: say which
            client = _client(image, check=True)
            container = create(client)
        env = GradebookSandboxEnvironment(client, container, image, workdir, task_image=own)
        if as_built and files:
            try:
                env._unpack_image_files(files)  # noqa: SLF001 - the provider's own start step
            except BaseException:
                container.remove()
                raise
        return env

    def _task_image(self, record: SandboxRecord) -> RunImage | None:
        """The task's own image a record ran in (None: gradebook's), here or rebuilt."""
        if not record.image_id:
            return None
        stores = [self.record.store if self.record else "", *self.settings.stores]
        try:
            return restore_image(_engine(), record, [s for s in stores if s])
        except TaskImageUnavailable as exc:
            raise SandboxUnavailable(str(exc)) from None

    def _foreign_image(self, name: str) -> RunImage | None:
        """The image of service `name` of the recipe a log from elsewhere names (None: no
        recipe at hand, gradebook's), built here when needed."""
        if self.foreign is None or self.foreign.recipe is None:
            return None
        try:
            return foreign_image(_engine(), self.foreign, name)
        except (TaskImageUnavailable, RecipeError) as exc:
            raise SandboxUnavailable(str(exc)) from None

    async def start(self, name: str) -> GradebookSandboxEnvironment:
        """The container of sandbox `name`, restored (the first call of a LazySandbox).

        Raises:
            ScoringFailure: as the module says.
        """
        t0 = time.perf_counter()
        if self._bad_record is not None:
            raise self.fail(ScoringFailure("workspace_unusable", self._bad_record))
        if self.foreign is not None and self.foreign.refused:
            raise self.fail(ScoringFailure("sandbox_unavailable", self.foreign.refused))
        record = self.record.named(name) if self.record is not None else None
        if record is not None and record.status != "captured":
            raise self.fail(
                ScoringFailure(
                    "workspace_not_captured",
                    f"sandbox {name!r} was not captured at generation: {record.error or 'no reason given'}",
                )
            )
        loop = asyncio.get_running_loop()
        data, roots, skipped, workdir = b"", ["/work"], [], "/work"
        if record is not None:
            try:
                data, roots, skipped = await loop.run_in_executor(None, self._archive, record)
                workdir = _workdir(record.workdir, roots)
            except ScoringFailure as exc:
                raise self.fail(exc) from None
        await self.reserve()
        started = loop.run_in_executor(None, self._start, name, roots, len(data), workdir, record)
        self._started.append(started)
        try:
            env = await asyncio.shield(started)
        except SandboxUnavailable as exc:
            raise self.fail(ScoringFailure("sandbox_unavailable", str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - the Engine refused the container
            raise self.fail(
                ScoringFailure("sandbox_unavailable", f"could not start a sandbox container: {exc}")
            ) from None
        restored: dict[str, Any] = {"image": env.image, "paths": roots if record else [env.workdir]}
        if env.task_image is not None:
            restored["image_id"] = env.task_image.image_id
            if record is not None and env.task_image.image_id != record.image_id:
                # never silently another image: the rebuilt one is named beside the recorded
                restored["rebuilt_from_recipe"] = record.recipe
                restored["recorded_image_id"] = record.image_id
        if record is not None:
            result = await env.exec(
                ["python3", "-I", "-S", "-c", EXTRACT, *roots],
                input=data,
                cwd="/",
                timeout=_EXTRACT_TIMEOUT_S,
            )
            if not result.success:
                raise self.fail(
                    ScoringFailure(
                        "workspace_unusable",
                        f"restoring sandbox {name!r} failed: {result.stderr.strip()[-300:]}",
                    )
                )
            restored |= {"digest": record.digest, "files": int(result.stdout.strip() or 0)}
            if skipped:
                restored["skipped"] = [f"{s.path} ({s.why})" for s in skipped]
            if env.task_image is None and record.provider not in (None, "gradebook"):
                # never silently another image: its files came back, its image's tools did not
                restored["stand_in"] = (
                    f"captured under the {record.provider!r} sandbox"
                    + (f" ({record.image})" if record.image else "")
                    + "; restored into gradebook's image"
                )
        else:
            restored["fresh"] = True  # nothing was captured: the image as it is
            if self.foreign is not None and env.task_image is not None:
                restored["built_from_task_files"] = self.foreign.found
            elif self.foreign is not None and self.foreign.stand_in:
                restored["stand_in"] = self.foreign.stand_in  # never silently another image
        restored["seconds"] = round(time.perf_counter() - t0, 4)
        self.evidence.restored[name] = restored
        return env


def _engine() -> Any:
    """A Docker client for a task image's build or rebuild (minutes, at most).

    Raises:
        SandboxUnavailable: the Engine does not answer.
    """
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=600)  # a rebuild may take minutes
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(
            f"Docker Engine not reachable ({exc.__class__.__name__}): start it with `make services`"
        ) from None
    return client


def _workdir(recorded: str | None, roots: list[str]) -> str:
    """The restored sandbox's working directory: the recorded one when it is a usable path
    (the filesystem root, or a directory a workspace may be restored to), else /work."""
    if recorded is None:
        return "/work"
    if recorded == "/":
        return recorded
    try:
        return check_roots([recorded])[0]
    except ArchiveError:
        raise ScoringFailure(
            "workspace_unusable", f"workspace record: working directory {recorded!r} is unusable"
        ) from None


class _Environments(dict):  # type: ignore[type-arg]
    """A sample's sandboxes by name, as Inspect's context holds them. With no record (nothing
    was captured) any name a scorer asks for is a fresh sandbox of its own."""

    def __init__(self, owner: Sandboxes, names: list[str], *, open_ended: bool) -> None:
        super().__init__({n: self._make(owner, n) for n in names})
        self._owner = owner
        self._open = open_ended

    @staticmethod
    def _make(owner: Sandboxes, name: str) -> RecordingSandbox:
        inner = ReplaySandbox(owner, name) if owner.replay else LazySandbox(owner, name)
        return RecordingSandbox(name, inner, owner.evidence)

    def get(self, name: Any, default: Any = None) -> Any:
        if name not in self and self._open and isinstance(name, str):
            self[name] = self._make(self._owner, name)
        return super().get(name, default)


class LazySandbox(SandboxEnvironment):
    """Sandbox `name` of a sample: started and restored at its first call."""

    def __init__(self, owner: Sandboxes, name: str) -> None:
        super().__init__()
        self._owner = owner
        self._name = name
        self._env: GradebookSandboxEnvironment | None = None
        self._lock = asyncio.Lock()

    async def _ready(self) -> GradebookSandboxEnvironment:
        if self._env is None:
            async with self._lock:
                if self._env is None:
                    self._env = await self._owner.start(self._name)
        return self._env

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
        box = await self._ready()
        result = await box.exec(cmd, input, cwd, env, user, timeout, timeout_retry, concurrency)
        stand_in = self._owner.evidence.restored.get(self._name, {}).get("stand_in")
        if stand_in and missing_tool(result):
            # the sample's own image may have it: unscored, never graded wrong for its absence
            self._owner.fail(
                ScoringFailure(
                    "sandbox_unavailable",
                    f"{str(cmd[0] if cmd else '')[:60]!r} is not in gradebook's image, which "
                    f"stood in for the sample's own: {stand_in}",
                )
            )
        return result

    async def write_file(self, file: str, contents: str | bytes) -> None:
        await (await self._ready()).write_file(file, contents)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007
        return await (await self._ready()).read_file(file, text)  # type: ignore[call-overload]

    @classmethod
    async def sample_cleanup(cls, *args: Any, **kwargs: Any) -> None:
        """Not a provider: `Sandboxes.aclose` removes the containers."""


class ReplayMismatch(Exception):
    """A scorer's sandbox call that is not the one recorded next."""


class Replay:
    """The recorded sandbox calls of a sample's last grading, served back in order."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.next = 0

    @classmethod
    def from_evidence(cls, evidence: Any) -> Replay | None:
        """A replay of a grading's evidence (`score.metadata.sandbox`), when every call it made
        is kept whole; else None."""
        if isinstance(evidence, str):
            evidence = json.loads(evidence)
        if not isinstance(evidence, dict):
            return None
        calls = evidence.get("calls")
        if not isinstance(calls, list) or not calls or evidence.get("calls_total") != len(calls):
            return None
        if not all(isinstance(c, dict) and c.get("complete") is True for c in calls):
            return None
        return cls(calls)

    def take(self, name: str, op: str, **given: Any) -> dict[str, Any]:
        """The next recorded call, which must be this one.

        Raises:
            ReplayMismatch: it is not.
        """
        if self.next >= len(self.calls):
            raise ReplayMismatch(
                f"call {self.next + 1} ({op}) was not made in the recorded grading"
            )
        call = self.calls[self.next]
        same = call.get("sandbox") == name and call.get("op") == op
        if not same or any(call.get(k) != v for k, v in given.items()):
            raise ReplayMismatch(f"call {self.next + 1} ({op} in {name!r}) is not the recorded one")
        self.next += 1
        return call


class ReplaySandbox(SandboxEnvironment):
    """Sandbox `name` of a sample re-judged from its recorded calls: no container."""

    def __init__(self, owner: Sandboxes, name: str) -> None:
        super().__init__()
        self._owner = owner
        self._name = name

    def _take(self, op: str, **given: Any) -> dict[str, Any]:
        assert self._owner.replay is not None
        self._owner.evidence.restored.setdefault(self._name, {"replayed": True})
        try:
            return self._owner.replay.take(self._name, op, **given)
        except ReplayMismatch as exc:
            raise self._owner.fail(
                ScoringFailure(
                    "verifier_error",
                    f"re-judging from the recorded sandbox calls: {exc} (the scorer does not "
                    "repeat its calls); graded again in a restored container on the next retry",
                )
            ) from None

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
        call = self._take("exec", command=list(cmd), cwd=cwd, user=user,
                          input_sha256=sha256_of(input), env_sha256=sha256_of(env or None))  # fmt: skip
        code = int(call.get("exit_code") or 0)
        return ExecResult(success=code == 0, returncode=code,
                          stdout=str(call.get("stdout") or ""), stderr=str(call.get("stderr") or ""))  # fmt: skip

    async def write_file(self, file: str, contents: str | bytes) -> None:
        self._take("write_file", path=file, contents_sha256=sha256_of(contents))

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007
        return str(self._take("read_file", path=file, text=text).get("content") or "")

    @classmethod
    async def sample_cleanup(cls, *args: Any, **kwargs: Any) -> None:
        """Not a provider: nothing to clean up."""
