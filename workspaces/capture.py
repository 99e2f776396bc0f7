"""Capture at generation: each sandbox's workspace archived before its container goes away.

`with_capture(task, settings)` gives the task a cleanup (Inspect's `Task.cleanup`: it runs
after the solvers of every sample, errored or cancelled ones too, while the sample's
sandboxes still exist, and before the provider's `sample_cleanup` removes them). For each named
sandbox of the sample it archives the declared paths (`CaptureSettings.paths`, else the task's
`metadata["workspace_paths"]`, else the sandbox's working directory), makes the archive
canonical and safe (workspaces.archive), stores it by digest (workspaces.store) and writes the
record into the sample's store under `STORE_KEY` (workspaces.record), so the log carries it.

It works with any Inspect sandbox provider through the sandbox API alone (`tar` to a file
under /tmp, then `read_file`), and streams the tar directly out of gradebook's own containers
(`GradebookSandboxEnvironment.archive`: their root file system is read-only).

Capture never fails a sample's generation: whatever goes wrong (no `tar` in the image, a
workspace past the cap, a full disk) is recorded as a `failed` sandbox with its reason, and the
sample's sandbox scorers are later `unscored` (`workspace_not_captured`) with that reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from workspaces.archive import DEFAULT_MAX_BYTES, ArchiveError, Canonical, canonical, check_roots
from workspaces.record import NOT_CAPTURED, STORE_KEY, SandboxRecord, WorkspaceRecord
from workspaces.store import BucketStore, WorkspaceStore, open_store

__all__ = ["CaptureSettings", "capture_sample", "with_capture"]

_TAR_SLACK = 1024 * 1024  # tar's own end blocks and padding beyond the archive's cap
PATHS_KEY = "workspace_paths"  # a task's declared workspace paths, in Task.metadata


@dataclass(frozen=True)
class CaptureSettings:
    """Where and how much a sweep captures.

    Attributes:
        store: the workspace store: a directory, or a bucket prefix (`s3://bucket/prefix`).
        max_bytes: cap on one archive (uncompressed); a bigger workspace is a failed capture.
        paths: the workspace paths (absolute, in the sandbox) for every sandbox of the task;
            empty: the task's `metadata["workspace_paths"]`, else each sandbox's working
            directory.
        timeout_s: how long one sandbox's capture may take.
    """

    store: Path | str
    max_bytes: int = DEFAULT_MAX_BYTES
    paths: tuple[str, ...] = ()
    timeout_s: float = 120.0


def _has_sandbox(task: Any) -> bool:
    if task.sandbox is not None:
        return True
    try:
        return any(sample.sandbox is not None for sample in task.dataset)
    except Exception:  # noqa: BLE001 - a dataset that cannot be walked: assume none
        return False


def with_capture(task: Any, settings: CaptureSettings) -> Any:
    """The task, with every sample's sandbox workspaces captured at its end (a task without a
    sandbox is returned as it is). The task's own cleanup, if any, runs after the capture."""
    if not _has_sandbox(task):
        return task
    own: Callable[[Any], Awaitable[None]] | None = task.cleanup
    declared = tuple(settings.paths) or tuple((task.metadata or {}).get(PATHS_KEY) or ())
    spec = task.sandbox

    async def cleanup(state: Any) -> None:
        try:
            await capture_sample(state, settings, paths=declared, spec=spec)
        finally:
            if own is not None:
                await own(state)

    task.cleanup = cleanup
    return task


def _environments() -> dict[str, Any]:
    # Inspect keeps a sample's sandboxes in this context variable; `sandbox(name)` reads it
    # too, but has no way to list the names
    from inspect_ai.util._sandbox.context import sandbox_environments_context_var

    return dict(sandbox_environments_context_var.get(None) or {})


def _inner(env: Any) -> Any:
    from inspect_ai.util._sandbox.events import SandboxEnvironmentProxy

    while isinstance(env, SandboxEnvironmentProxy):
        env = env._sandbox  # noqa: SLF001 - the provider's own object behind the event proxy
    return env


def _provider(env: Any) -> str:
    from inspect_ai._util.registry import registry_info

    try:
        # as a task names it: "docker", "local", "gradebook" (not "inspect_ai/docker")
        return registry_info(type(env)).name.rsplit("/", 1)[-1]
    except Exception:  # noqa: BLE001 - an unregistered class: its name
        return type(env).__name__


def _config(spec: Any) -> Any:
    """The task's sandbox config as JSON: a file is named with its sha256."""
    config = getattr(spec, "config", None)
    if config is None:
        return None
    if isinstance(config, str):
        path = Path(config)
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            return {"file": path.name, "sha256": digest}
        return {"value": config}
    dump = getattr(config, "model_dump", None)
    return dump(mode="json") if callable(dump) else {"value": str(config)}


async def capture_sample(
    state: Any, settings: CaptureSettings, *, paths: Sequence[str] = (), spec: Any = None
) -> WorkspaceRecord | None:
    """Capture every sandbox of the running sample and record it in `state.store`; never
    raises (a failure is a `failed` sandbox in the record).

    Args:
        state: the sample's TaskState.
        settings: the store and the cap.
        paths: the workspace paths (empty: each sandbox's working directory).
        spec: the task's SandboxEnvironmentSpec (recorded as the sandbox config).

    Returns:
        The record written (None: the sample has no sandbox).
    """
    environments = _environments()
    if not environments:
        return None
    store = open_store(settings.store)
    records = []
    for name, env in environments.items():
        records.append(await _capture_one(name, _inner(env), store, settings, paths, spec))
    record = WorkspaceRecord(store=store.location, sandboxes=records)
    state.store.set(STORE_KEY, record.model_dump(mode="json"))
    return record


async def _capture_one(
    name: str,
    env: Any,
    store: WorkspaceStore | BucketStore,
    settings: CaptureSettings,
    paths: Sequence[str],
    spec: Any,
) -> SandboxRecord:
    t0 = time.perf_counter()
    provider = _provider(env)
    image = getattr(env, "image", None)
    base = {"name": name, "provider": provider, "image": image if isinstance(image, str) else None}
    try:
        base["config"] = _config(spec)
    except OSError:
        base["config"] = None
    roots: list[str] = []
    try:
        base |= await anyio.to_thread.run_sync(lambda: _task_image(env, store))
        async with asyncio.timeout(settings.timeout_s):
            base["workdir"] = await _workdir(env)
            roots = check_roots(list(paths) or [base["workdir"]])
            raw, complaints = await _read_tar(env, roots, settings.max_bytes + _TAR_SLACK)
        archive: Canonical = await anyio.to_thread.run_sync(
            lambda: canonical(raw, roots, max_bytes=settings.max_bytes)
        )
        stored = await anyio.to_thread.run_sync(lambda: store.put(archive.data, archive.digest))
    except Exception as exc:  # noqa: BLE001 - recorded; the sample's generation goes on
        return SandboxRecord(
            **base,
            status="failed",
            paths=roots,
            error=_why(exc, settings),
            not_captured=list(NOT_CAPTURED),
            seconds=round(time.perf_counter() - t0, 4),
        )
    left_out = [f"{s.path} ({s.why})" for s in archive.skipped]
    left_out += [f"unreadable: {line}" for line in complaints.splitlines() if line.strip()][:20]
    return SandboxRecord(
        **base,
        status="captured",
        paths=roots,
        digest=archive.digest,
        bytes=len(archive.data),
        stored_bytes=stored,
        files=archive.files,
        not_captured=[*NOT_CAPTURED, *left_out],
        seconds=round(time.perf_counter() - t0, 4),
    )


def _task_image(env: Any, store: WorkspaceStore | BucketStore) -> dict[str, Any]:
    """What a record keeps of a task's own image (gradebook's provider): its ID, and its recipe,
    stored in the workspace store (once per store and recipe) for a rebuild at restore."""
    run = getattr(env, "task_image", None)
    if run is None:
        return {}
    out = {"image_id": run.image_id, "service": run.service, "user": run.user,
           "environment": dict(run.environment)}  # fmt: skip
    if run.recipe is not None:
        if not store.has(run.recipe.digest):
            store.put(run.recipe.archive, run.recipe.digest)
        out |= {"recipe": run.recipe.digest, "recipe_config": run.recipe.config}
    return out


def _why(exc: BaseException, settings: CaptureSettings) -> str:
    if isinstance(exc, TimeoutError):
        return f"capture took longer than {settings.timeout_s:g}s"
    text = " ".join(str(exc).split())[:300]
    if "exceeded" in text and "bytes" in text:
        return f"the workspace is larger than its cap of {settings.max_bytes} bytes"
    if isinstance(exc, ArchiveError):
        return text
    return f"{type(exc).__name__}: {text}"


async def _workdir(env: Any) -> str:
    workdir = getattr(env, "workdir", None)
    if isinstance(workdir, str):
        return workdir
    result = await env.exec(["pwd"], timeout=30)
    if not result.success:
        raise RuntimeError(f"cannot find the sandbox's working directory: {result.stderr[-200:]}")
    return result.stdout.strip() or "/"


async def _read_tar(env: Any, roots: list[str], cap: int) -> tuple[bytes, str]:
    """A tar of `roots` out of the sandbox: streamed by gradebook's provider, else through a
    file under /tmp and `read_file` (any provider)."""
    archive = getattr(env, "archive", None)
    if callable(archive):
        return await archive(roots, cap)
    tmp = f"/tmp/.gradebook-workspace-{uuid.uuid4().hex}.tar"
    relative = [r.lstrip("/") for r in roots]
    made = await env.exec(
        [
            "tar",
            "--create",
            f"--file={tmp}",
            "--ignore-failed-read",
            "--directory=/",
            f"--exclude={tmp.lstrip('/')}",
            "--",
            *relative,
        ],  # fmt: skip
        timeout=120,
    )
    try:
        if made.returncode not in (0, 1):
            raise RuntimeError(f"tar exited {made.returncode}: {made.stderr.strip()[-300:]}")
        size = await env.exec(["stat", "-c", "%s", tmp], timeout=30)
        if size.success and size.stdout.strip().isdigit() and int(size.stdout.strip()) > cap:
            raise RuntimeError(f"command output exceeded {cap} bytes")
        data = await env.read_file(tmp, text=False)
    finally:
        await env.exec(["rm", "-f", tmp], timeout=30)
    return data, made.stderr
