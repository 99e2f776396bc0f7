"""Run untrusted code in warm, locked-down Docker containers, through the `docker` Python SDK.

Why not Inspect's docker sandbox: it needs Compose v2 and Engine >= 24, which Debian's
`docker.io` does not ship; the SDK talks to the Engine API directly and needs neither.

Every container is created network-less, with a read-only root filesystem, a size-capped tmpfs
work dir, memory (= memory+swap), pids and CPU caps, all capabilities dropped,
no-new-privileges, a non-root user and tini as PID 1 (so killed processes are reaped). A pool
keeps a few such containers started, each with two long-lived processes started by `docker
exec` under different uids (see `scorers/sandbox/_harness.py`): the trusted harness server and the
submission zygote. One test costs two forks, not a container: the harness server forks a fresh
harness that holds the tests, the zygote forks the submission; afterwards the zygote kills every
process of the submission uid and wipes the work dir and IPC objects. A container whose run
timed out, or that did not report CLEAN, is destroyed and replaced in the background; nothing a
submission leaves behind reaches the next one.

Nothing outlives the process that owns a container: the container's main process is a
watchdog reading a lifeline (its stdin, held open by the owner) and exits at EOF, so a killed
owner's containers stop and are removed by Docker within moments; and the per-test wall-clock
limit also holds inside the container, where the harness server ends the container once a test
overruns its limit by INSIDE_MARGIN_S. Containers also carry `gradebook.sandbox=1`, an owner
label (host, pid, process start time) and the owner's pid namespace; a new pool removes the
containers of owners that no longer run: those of older versions, and one created in the
instant its owner was killed, before it started (a record without a process).
Other checkouts, test runs and CI jobs share the Engine: a reaper judges only owners it can see
(its own host and pid namespace), and a container that another process removes while it looks
is not an error.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import scorers.sandbox._harness as _harness
from scorers.sandbox.image import ImageBuildError, image_tag, sandbox_users

LABEL = "gradebook.sandbox"
OWNER_LABEL = "gradebook.owner"
PIDNS_LABEL = "gradebook.owner-pidns"  # the pid namespace the owner's pid is numbered in
# The harness the containers run is the source this process imported (and fingerprinted), not
# the file as it reads later; recorded by scorers.identity.loaded_code when the import was recorded.
HARNESS_SOURCE = (
    getattr(_harness.__spec__.loader, "recorded_source", None)
    or Path(_harness.__file__).read_bytes()
).decode("utf-8")
_PYTHON = ["python3", "-I", "-S", "-B", "-c", HARNESS_SOURCE]
# The container's main process: it reads its stdin, the lifeline its owner holds open, and exits
# at EOF (the owner closed it or died), which ends tini and every process in the container.
_WATCHDOG = ["python3", "-I", "-S", "-B", "-c", "import sys; sys.stdin.buffer.read()"]

RunStatus = Literal["passed", "failed", "timeout", "error"]
# How long after the host's own deadline the container ends a run by itself: the host kills
# the container at its deadline; this margin only matters when the host did not (it died).
INSIDE_MARGIN_S = 5.0


class SandboxUnavailable(RuntimeError):
    """No Docker Engine, or no sandbox image: the code was NOT run (never falls back to the host)."""


def engine_with_image(image: str | None = None, client: Any = None) -> tuple[Any, str]:
    """A Docker client whose Engine answers, and the sandbox image tag it holds: what a pool
    needs before it starts a container, so it is also the check that the sandbox is up.

    Args:
        image: image tag; the recipe's hash tag (see `scorers.sandbox.image`) when None.
        client: a `docker.DockerClient`; one from the environment when None.

    Raises:
        SandboxUnavailable: no Docker Engine answers, or the image is not built.
    """
    import docker
    import docker.errors

    try:
        client = client or docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(
            f"Docker Engine not reachable ({exc.__class__.__name__}): start it with "
            "`make services` (infra/docker/ensure_docker.sh)"
        ) from exc
    image = image or image_tag()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise SandboxUnavailable(
            f"sandbox image {image} is not built: run `gradebook sandbox build`"
        ) from None
    return client, image


def sandbox_down() -> str | None:
    """Why the sandbox cannot run code right now (what the code scorer would record as
    `sandbox_unavailable`), or None when the Engine answers and the image is built."""
    try:
        client, _ = engine_with_image()
    except (SandboxUnavailable, ImageBuildError) as exc:
        return str(exc)
    client.close()
    return None


@dataclass(frozen=True)
class SandboxLimits:
    """Per-container resource caps (each test runs in one such container)."""

    memory_mb: int = 512
    pids: int = 128
    cpus: float = 1.0
    work_mb: int = 64
    output_bytes: int = 64 * 1024


@dataclass(frozen=True)
class RunOutcome:
    """What the harness reported (or why it could not)."""

    status: RunStatus
    passed: bool
    detail: str
    duration_s: float
    calls: int = 0
    output: str = ""


def _owner_id(pid: int) -> str | None:
    """host:pid:start-time, so a recycled pid is not mistaken for a live owner."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{socket.gethostname()}:{pid}:{start}"


def _pid_namespace() -> str:
    """This process's pid namespace (its inode number), "" where /proc does not say.

    Two CI jobs in containers that share the host's Docker socket and hostname number their
    processes separately: a pid in the other namespace says nothing about a process here."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    return link.partition("[")[2].rstrip("]")


_PID_NAMESPACE = _pid_namespace()


def owner_label(pid: int | None = None) -> str:
    """The owner label value (host:pid:start-time) of the containers that process `pid`
    (default: this one) starts.

    The format is the one every gradebook version writes and reaps by: an older version's
    reaper on the same Engine keeps a container only if this string names a live process."""
    pid = os.getpid() if pid is None else pid
    return _owner_id(pid) or f"{socket.gethostname()}:{pid}:0"


def _orphaned(labels: dict[str, str]) -> bool:
    """Whether a container's labels name an owner of this host and pid namespace that is gone.

    An owner this process cannot judge (another host, another pid namespace, no start time on
    either side, a label it does not read) is never an orphan: its containers are another
    machine's or job's to remove. Containers without a namespace label (older versions) are
    judged by host, pid and start time."""
    parts = labels.get(OWNER_LABEL, "").split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    if parts[2] == "0" or _owner_id(os.getpid()) is None:  # no /proc: liveness is unknowable
        return False
    if labels.get(PIDNS_LABEL, _PID_NAMESPACE) != _PID_NAMESPACE:
        return False
    return _owner_id(int(parts[1])) != ":".join(parts)


def reap_orphans(client: Any) -> int:
    """Remove sandbox containers whose owning process on this host no longer runs.

    Other processes (another checkout's pool, a test run, their own reapers) create and remove
    sandbox containers on the same Engine meanwhile: the listing is one call that carries the
    labels (no inspect per container, which fails with 404 for a container removed after the
    listing), and a container that is already gone when it is removed is simply not counted.

    Returns:
        How many containers this call removed.
    """
    import docker.errors

    removed = 0
    for summary in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        if not _orphaned(summary.get("Labels") or {}):
            continue
        try:
            client.api.remove_container(summary["Id"], force=True)
            removed += 1
        except docker.errors.APIError:  # gone already, or another reaper is removing it (409)
            pass
    return removed


class LiveContainer:
    """A started sandbox container and its lifeline.

    The container's main process (under tini) is a watchdog (`_WATCHDOG`): it reads the
    lifeline, the container's stdin held open by this process, and exits at EOF. So
    the container stops, and Docker removes it, as soon as this process closes the lifeline or
    dies for any reason (SIGKILL included); nothing of it outlives its owner.
    """

    def __init__(self, client: Any, container_id: str, lifeline: Any) -> None:
        self.client = client
        self.id = container_id
        self._lifeline = lifeline

    def close_lifeline(self) -> None:
        for closer in (getattr(self._lifeline, "_sock", None), self._lifeline):
            try:
                if closer is not None:
                    closer.close()
            except OSError:
                pass

    def remove(self) -> None:
        """End the container now (it is removed by Docker once stopped)."""
        self.close_lifeline()
        try:
            self.client.api.remove_container(self.id, force=True)
        except Exception as exc:  # noqa: BLE001 - already stopped and auto-removed
            # the closed lifeline ended it and Docker's auto-remove is under way ("removal in
            # progress", 409): the container is gone only when that finishes
            if getattr(getattr(exc, "response", None), "status_code", None) == 409:
                self._wait_gone()

    def _wait_gone(self, timeout_s: float = 30.0) -> None:
        import docker.errors

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.client.api.inspect_container(self.id)
            except docker.errors.NotFound:
                return
            except Exception:  # noqa: BLE001 - the Engine gone: nothing more to wait for
                return
            time.sleep(0.05)  # polling Docker's state: no event for "removed" is cheaper


def create_container(
    client: Any,
    image: str,
    limits: SandboxLimits,
    *,
    user: str,
    owner: str,
    pid_namespace: str = _PID_NAMESPACE,
    workdirs: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    task_image: TaskImageRun | None = None,
) -> LiveContainer:
    """Start one locked-down, labelled container whose main process is the watchdog.

    Args:
        client: a `docker.DockerClient`.
        image: the sandbox image tag.
        limits: resource caps.
        user: "uid:gid" of the container's main process (never root).
        owner: the owner label value (`owner_label()`; see `reap_orphans`).
        pid_namespace: the pid namespace the owner's pid is numbered in (this process's).
        workdirs: writable directories besides /work (absolute paths), each a tmpfs of
            `limits.work_mb` owned by the sandbox uid: where a restored workspace goes when its
            task's sandbox worked elsewhere (workspaces.restore). The root stays read-only.
        labels: more labels (the sandbox and owner labels are always set).
        task_image: the image is a task's own (`TaskImageRun` says how its service runs).
    """
    from docker.types import Ulimit

    api = client.api
    sandbox_uid = sandbox_users().sandbox_uid
    tmpfs = f"size={limits.work_mb}m,mode=0700,uid={sandbox_uid},gid={sandbox_uid}"
    workdir = "/work"
    mounts = {path: tmpfs for path in dict.fromkeys(["/work", *workdirs])}
    if task_image is not None:
        # A task image's users are its own: a writable place is open to each, as a fresh /tmp
        # is, but the working directory is owned as in the image (the kernel's tmpfs takes the
        # mode of the directory it covers, so an owner is needed to write it); the image's
        # files there are copied in once started (scorers.sandbox.task_image.workdir_files).
        open_to_all = f"size={limits.work_mb}m,mode=1777"
        workdir = task_image.workdir
        mounts = {path: open_to_all for path in dict.fromkeys([workdir, *workdirs, "/tmp"])}
        if task_image.owner is not None:
            uid, gid = task_image.owner
            mounts[workdir] = f"size={limits.work_mb}m,mode=0755,uid={uid},gid={gid}"
    host_config = api.create_host_config(
        init=True,
        auto_remove=True,
        network_mode="none",
        read_only=True,
        tmpfs=mounts,
        mem_limit=f"{limits.memory_mb}m",
        memswap_limit=f"{limits.memory_mb}m",
        pids_limit=limits.pids,
        nano_cpus=int(limits.cpus * 1e9),
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        ipc_mode="none",
        ulimits=[Ulimit(name="core", soft=0, hard=0)],
    )
    # stdin_open without detach: Docker closes the container's stdin once the one attached
    # client (the lifeline) disconnects (StdinOnce), which is what ends the watchdog
    container_id = api.create_container(
        image,
        # a task image's own ENTRYPOINT would be handed the watchdog as its arguments
        None if task_image else _WATCHDOG,
        entrypoint=_WATCHDOG if task_image else None,
        user=user,
        working_dir=workdir,
        environment=dict(task_image.environment) if task_image else None,
        labels={**(labels or {}), LABEL: "1", OWNER_LABEL: owner, PIDNS_LABEL: pid_namespace},
        stdin_open=True,
        detach=False,
        host_config=host_config,
    )["Id"]
    try:
        lifeline = api.attach_socket(container_id, params={"stdin": 1, "stream": 1})
        api.start(container_id)
    except BaseException:
        try:
            api.remove_container(container_id, force=True)
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass
        raise
    return LiveContainer(client, container_id, lifeline)


@dataclass(frozen=True)
class TaskImageRun:
    """How a container of a task's own image runs (scorers.sandbox.task_image.RunImage).

    Attributes:
        workdir: its working directory, writable (a tmpfs of `work_mb`).
        environment: the variables of its service.
        owner: (uid, gid) owning the working directory in the image (None: the image has
            none there; it is open to every user, as /tmp is).
    """

    workdir: str
    environment: Mapping[str, str]
    owner: tuple[int, int] | None = None


def _frames(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Pop complete Docker multiplexed-stream frames (8-byte header) from the buffer."""
    out = []
    while len(buffer) >= 8:
        stream, size = buffer[0], struct.unpack(">I", bytes(buffer[4:8]))[0]
        if len(buffer) < 8 + size:
            break
        out.append((stream, bytes(buffer[8 : 8 + size])))
        del buffer[: 8 + size]
    return out


class _ExecStream:
    """One attached long-lived `docker exec`: JSON lines in on stdin, JSON lines out on stdout."""

    def __init__(self, api: Any, container_id: str, role: str, user: str, workdir: str) -> None:
        exec_id = api.exec_create(
            container_id,
            [*_PYTHON, role],
            stdin=True,
            stdout=True,
            stderr=True,
            user=user,
            workdir=workdir,
        )["Id"]
        response_socket = api.exec_start(exec_id, socket=True)
        self._owner = response_socket
        self.sock: socket.socket = getattr(response_socket, "_sock", response_socket)
        self.stderr = bytearray()
        self._stdout = bytearray()
        self._buffer = bytearray()
        self.eof = False

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def read_line(self, deadline: float, cap: int = 1 << 20) -> dict[str, Any] | None:
        """The next stdout line as JSON; None on EOF, deadline, or a line longer than cap."""
        while True:
            newline = self._stdout.find(b"\n")
            if newline >= 0:
                line = bytes(self._stdout[:newline])
                del self._stdout[: newline + 1]
                try:
                    value = json.loads(line)
                except ValueError:
                    return None
                return value if isinstance(value, dict) else None
            if self.eof or len(self._stdout) > cap:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if not ready:
                return None
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                self.eof = True
                continue
            self._buffer += chunk
            for stream, data in _frames(self._buffer):
                if stream == 1:
                    self._stdout.extend(data)
                elif len(self.stderr) < cap:
                    self.stderr.extend(data[: cap - len(self.stderr)])

    def close(self) -> None:
        for closer in (self.sock.close, getattr(self._owner, "close", None)):
            try:
                if closer:
                    closer()
            except OSError:
                pass


@dataclass
class _Warm:
    """A started container with its harness server and submission zygote attached."""

    container: LiveContainer
    harness: _ExecStream
    zygote: _ExecStream
    runs: int = 0

    def close(self) -> None:
        self.harness.close()
        self.zygote.close()


class SandboxPool:
    """Warm sandbox containers and bounded concurrent test runs.

    Args:
        image: image tag; the recipe's hash tag (see `scorers.sandbox.image`) when None.
        limits: resource caps for every container.
        concurrency: at most this many tests run at once (default: number of cores); the pool
            keeps as many containers warm.
        client: a `docker.DockerClient`; one from the environment when None.

    Raises:
        SandboxUnavailable: no Docker Engine answers, or the image is not built.
    """

    def __init__(
        self,
        image: str | None = None,
        *,
        limits: SandboxLimits | None = None,
        concurrency: int | None = None,
        client: Any = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.concurrency = max(1, concurrency or os.cpu_count() or 1)
        self.client, self.image = engine_with_image(image, client)
        users = sandbox_users()
        self._harness_user = f"{users.harness_uid}:{users.harness_uid}"
        self._sandbox_user = f"{users.sandbox_uid}:{users.sandbox_uid}"
        self._sandbox_uid = users.sandbox_uid
        self._owner = owner_label()
        self.containers_owner = self._owner  # the owner label on every container it starts
        self._idle: queue.Queue[Any] = queue.Queue()
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._live: dict[str, LiveContainer] = {}
        self._starting = 0
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy of this pool is not the child's to use
        self._errors: list[str] = []
        self._maintenance = ThreadPoolExecutor(
            max_workers=max(2, self.concurrency), thread_name_prefix="sandbox-maint"
        )
        reap_orphans(self.client)
        for _ in range(self.concurrency):
            self._maintenance.submit(self._add_container)
        atexit.register(self.close)

    # -- container lifecycle ----------------------------------------------------------------

    def _create(self) -> Any:
        # PID 1 (tini) and the watchdog run as the harness uid: the janitor's kill(-1) as the
        # submission uid must not take the container down with it, and the harness server
        # (same uid) can end the container by signalling PID 1.
        return create_container(
            self.client, self.image, self.limits, user=self._harness_user, owner=self._owner
        )

    def _add_container(self) -> None:
        if self._closed:
            return
        with self._lock:
            self._starting += 1
        container = None
        try:
            container = self._create()
            with self._lock:
                self._live[container.id] = container
            api = self.client.api
            warm = _Warm(
                container,
                _ExecStream(api, container.id, "harness", self._harness_user, "/"),
                _ExecStream(api, container.id, "submission", self._sandbox_user, "/work"),
            )
        except Exception as exc:  # noqa: BLE001 - reported to the waiting caller
            with self._lock:
                self._errors.append(f"could not start a sandbox container: {exc}")
            if container is not None:
                self._destroy(container)
            return
        finally:
            with self._lock:
                self._starting -= 1
        if self._closed:
            self._destroy(warm)
            return
        self._idle.put(warm)

    def _destroy(self, item: Any) -> None:
        container = item
        if isinstance(item, _Warm):
            item.close()
            container = item.container
        with self._lock:
            self._live.pop(container.id, None)
        container.remove()

    def _replace(self, container: Any) -> None:
        self._destroy(container)
        self._add_container()

    def _take(self, wait_s: float = 60.0) -> Any:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                with self._lock:
                    errors, self._errors = self._errors, []
                    starving = not self._live and not self._starting
                if errors and starving:
                    raise SandboxUnavailable(errors[-1]) from None
                if starving:
                    self._maintenance.submit(self._add_container)
                if time.monotonic() > deadline:
                    raise SandboxUnavailable(
                        f"no sandbox container became ready in {wait_s:.0f}s"
                    ) from None

    # -- running tests ----------------------------------------------------------------------

    def run_tests(
        self, code: str, tests: str, *, entry_point: str | None = None, timeout_s: float = 10.0
    ) -> RunOutcome:
        """Run `tests` (trusted Python that raises on failure) against the submitted `code`.

        Args:
            code: the submission's source (untrusted; runs only inside the container).
            tests: test source, run by the harness process; it calls the submission's
                top-level functions by name through proxies.
            entry_point: the function the tests must find defined (None: no such check).
            timeout_s: hard wall-clock limit for the whole run; on expiry the container and
                every process in it are killed.
        """
        if self._closed:
            raise SandboxUnavailable("the sandbox pool is closed")
        with self._slots:
            container = self._take()
            return self._run_in(container, code, tests, entry_point, timeout_s)

    def _run_in(
        self, warm: _Warm, code: str, tests: str, entry_point: str | None, timeout_s: float
    ) -> RunOutcome:
        cap = self.limits.output_bytes
        request_id = secrets.token_hex(8)
        start = time.monotonic()
        deadline = start + timeout_s
        reusable = False
        try:
            sock = f"gradebook-{request_id}"
            warm.harness.send(
                {
                    "id": request_id,
                    "tests": tests,
                    "entry_point": entry_point,
                    "sock": sock,
                    "accept_s": timeout_s,
                    # the same limit, held inside the container too: past it the harness
                    # server ends the container (this process may be gone and not kill it)
                    "limit_s": timeout_s + INSIDE_MARGIN_S,
                }
            )
            warm.zygote.send({"op": "run", "sock": sock, "code": code, "output_cap": cap})
            verdict = _parse_verdict(warm.harness.read_line(deadline), request_id)
            if verdict is None:
                if time.monotonic() >= deadline:
                    return RunOutcome(
                        "timeout",
                        False,
                        f"timed out after {timeout_s:g}s",
                        time.monotonic() - start,
                    )
                tail = bytes(warm.harness.stderr[-500:]).decode(errors="replace").strip()
                return RunOutcome(
                    "error",
                    False,
                    f"the harness gave no verdict: {tail or 'no output'}",
                    time.monotonic() - start,
                )
            # Cleanup is part of the run: a test is only over once nothing of it is left.
            warm.zygote.send({"op": "clean", "id": request_id})
            report = warm.zygote.read_line(time.monotonic() + 5.0)
            duration = time.monotonic() - start
            if report is not None and report.get("id") == request_id and report.get("clean"):
                reusable = True
            output = str((report or {}).get("output_head", ""))
            output_bytes = int((report or {}).get("output_bytes", 0))
            if output_bytes >= cap:
                return RunOutcome(
                    "failed",
                    False,
                    f"output limit exceeded ({cap} bytes)",
                    duration,
                    verdict["calls"],
                    output,
                )
            status: RunStatus = "passed" if verdict["passed"] else "failed"
            return RunOutcome(
                status, verdict["passed"], verdict["detail"], duration, verdict["calls"], output
            )
        except Exception as exc:  # noqa: BLE001 - a Docker API failure is the sandbox's, not the code's
            return RunOutcome("error", False, f"sandbox error: {exc}", time.monotonic() - start)
        finally:
            warm.runs += 1
            if self._closed:
                self._destroy(warm)
            elif reusable:
                self._idle.put(warm)
            else:
                self._maintenance.submit(self._replace, warm)

    def close(self) -> None:
        """Remove every container this pool started (also runs at interpreter exit).

        A no-op in a forked child: the containers, and the exec streams to them, belong to the
        process that started them, which may still be using them."""
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        self._maintenance.shutdown(wait=True, cancel_futures=True)
        while True:
            try:
                self._destroy(self._idle.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            leftover, self._live = list(self._live.values()), {}
        for container in leftover:
            container.remove()
        atexit.unregister(self.close)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_verdict(verdict: dict[str, Any] | None, request_id: str) -> dict[str, Any] | None:
    """The harness's verdict line for this request, if it is well-formed."""
    if not isinstance(verdict, dict) or verdict.get("gradebook_verdict") != 1:
        return None
    if verdict.get("id") != request_id:
        return None
    if not isinstance(verdict.get("passed"), bool):
        return None
    return {
        "passed": verdict["passed"],
        "detail": str(verdict.get("detail", "")),
        "calls": int(verdict.get("calls", 0)),
    }


_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
    """The process-wide pool (created on first use; each worker process gets its own, a forked
    child too: it never shares the parent's containers)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed or _default_pool._pid != os.getpid():
            _default_pool = SandboxPool()
        return _default_pool


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def close_default_pool() -> None:
    global _default_pool
    with _default_lock:
        if _default_pool is not None:
            _default_pool.close()
            _default_pool = None
