"""The program that runs INSIDE the sandbox container, in three roles (argv[1]).

It is shipped as source with every exec (`python3 -I -S -B -c <this file> ROLE`), so the image
only needs python3, and this file is part of the unit_tests verifier's fingerprint.

Trust is split by process and uid (docs/design/sandbox.md has the threat model):

- ``harness`` (uid HARNESS): receives the test source on stdin (never written to a file), runs
  it itself, and reports the verdict on its own stdout. The names the tests call are proxies
  that forward calls to the submission process.
- ``submission`` (uid SANDBOX): executes the model's code and answers calls. Arguments and
  results cross the socket as tagged JSON decoded into builtins only, so nothing the submission
  builds (an object whose ``__eq__`` is always true, a patched ``AssertionError``) can exist in
  the harness. Exiting early, crashing or hanging leaves a call unanswered: not passed.
- ``janitor`` (uid SANDBOX): after a run, kills every process of the submission uid, wipes the
  work dir and the uid's SysV IPC objects, and prints CLEAN only when nothing is left.
The container's main process (under tini, uid HARNESS) is a watchdog (`scorers.sandbox.pool`) that
exits when its owner's end of its stdin closes, so a host process that dies, even by SIGKILL,
takes its containers with it. The per-test wall-clock limit holds inside the container too: the harness server waits for each
test's harness at most ``limit_s`` (the host's limit plus a margin) and then ends the whole
container by signalling PID 1 (tini forwards it to the watchdog), whether or not the host is
still there to do it.

Only the standard library is used: the image has nothing else.
"""

from __future__ import annotations

import base64
import builtins
import io
import json
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback

MAX_MESSAGE = 16 * 1024 * 1024
MAX_DEPTH = 100
DETAIL_CAP = 2000
CONNECT_WAIT_S = 5.0


# --- framing: 4-byte big-endian length + UTF-8 JSON ------------------------------------------


def send(sock: socket.socket, obj: object) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("the submission process closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> object:
    (size,) = struct.unpack(">I", _recv_exact(sock, 4))
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes exceeds {MAX_MESSAGE}")
    return json.loads(_recv_exact(sock, size))


# --- plain data: tagged JSON, decoded into builtins only ----------------------------------------


def encode(value: object, depth: int = 0) -> object:
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply to transfer")
    t = type(value)
    if value is None or t in (bool, str, int, float):
        return value
    # Subclasses are flattened to their builtin base: what crosses is only the plain value.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"T": [encode(v, depth + 1) for v in value]}
    if isinstance(value, frozenset):
        return {"F": [encode(v, depth + 1) for v in value]}
    if isinstance(value, set):
        return {"S": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"D": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"B": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, complex):
        return {"C": [value.real, value.imag]}
    raise TypeError(f"cannot transfer a value of type {t.__name__} (plain data only)")


def decode(value: object, depth: int = 0) -> object:
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(value)
    if value is None or t in (bool, str, int, float):
        return value
    if t is list:
        return [decode(v, depth + 1) for v in value]
    if t is dict and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "B" and type(inner) is str:
            return base64.b64decode(inner)
        if tag == "C" and type(inner) is list and len(inner) == 2:
            return complex(float(inner[0]), float(inner[1]))
        if type(inner) is list:
            items = [decode(v, depth + 1) for v in inner]
            if tag == "T":
                return tuple(items)
            if tag == "S":
                return set(items)
            if tag == "F":
                return frozenset(items)
            if tag == "D" and all(type(p) is list and len(p) == 2 for p in items):
                return {k: v for k, v in items}
    raise ValueError("not plain data")


# --- harness (trusted) ------------------------------------------------------------------------


class RemoteError(Exception):
    """The submission raised (or could not answer); carries its exception's name and message."""


# Exceptions a test may legitimately expect from the candidate; anything else is RemoteError.
_EXPECTED_EXCEPTIONS = {
    name: getattr(builtins, name)
    for name in (
        "ValueError",
        "TypeError",
        "KeyError",
        "IndexError",
        "ZeroDivisionError",
        "RuntimeError",
        "ArithmeticError",
        "LookupError",
        "OverflowError",
    )
}


class _Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.calls = 0

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        send(self.sock, {"call": name, "args": encode(list(args)), "kwargs": encode(kwargs)})
        self.calls += 1
        reply = recv(self.sock)
        if type(reply) is dict and "ok" in reply:
            return decode(reply["ok"])
        if type(reply) is dict and type(reply.get("raise")) is list and len(reply["raise"]) == 2:
            name_, msg = (str(x)[:500] for x in reply["raise"])
            exc_type = _EXPECTED_EXCEPTIONS.get(name_) or RemoteError
            raise exc_type(f"{name_}: {msg}" if exc_type is RemoteError else msg)
        raise RemoteError("malformed reply from the submission")


def _proxy(channel: _Channel, name: str):
    def remote(*args, **kwargs):
        return channel.call(name, args, kwargs)

    remote.__name__ = name
    remote.__qualname__ = name
    return remote


_REQUEST_ID = [""]


def _verdict(out, passed: bool, status: str, detail: str, calls: int) -> None:
    verdict = {
        "gradebook_verdict": 1,
        "id": _REQUEST_ID[0],
        "passed": passed,
        "status": status,
        "detail": detail[:DETAIL_CAP],
        "calls": calls,
    }
    out.write(json.dumps(verdict) + "\n")
    out.flush()


def _one_line(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


def run_harness(request: dict) -> int:
    _REQUEST_ID[0] = str(request.get("id", ""))
    tests, entry_point = request["tests"], request.get("entry_point")
    out = sys.stdout
    # Whatever the tests print must not mix with the verdict line.
    sys.stdout = io.StringIO()

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + request["sock"])
    server.listen(1)
    server.settimeout(request.get("accept_s", 10.0))
    try:
        conn, _ = server.accept()
    except TimeoutError:
        _verdict(out, False, "failed", "the submission process never connected", 0)
        return 0
    server.close()
    conn.settimeout(None)
    channel = _Channel(conn)

    try:
        hello = recv(conn)
    except (EOFError, ValueError, OSError) as exc:
        _verdict(out, False, "failed", f"submission exited before defining anything: {exc}", 0)
        return 0
    if type(hello) is not dict or hello.get("hello") is not True:
        error = str(hello.get("error", "")) if type(hello) is dict else ""
        _verdict(out, False, "failed", f"submission raised on load: {error[:DETAIL_CAP]}", 0)
        return 0
    names = [n for n in hello.get("names", []) if type(n) is str and n.isidentifier()]
    if entry_point and entry_point not in names:
        _verdict(out, False, "failed", f"submission does not define {entry_point!r}", 0)
        return 0

    namespace = {"__name__": "__gradebook_tests__"}
    for name in names:
        namespace[name] = _proxy(channel, name)
    try:
        exec(compile(tests, "<tests>", "exec"), namespace)  # noqa: S102 - trusted dataset tests
    except BaseException as exc:  # noqa: BLE001 - any exception means a test did not pass
        if isinstance(exc, EOFError):
            detail = "the submission process exited during a call"
        elif isinstance(exc, AssertionError):
            detail = "assertion failed: " + (_assert_line(exc) or "a test assertion")
        else:
            detail = _one_line(exc)
        _verdict(out, False, "failed", detail, channel.calls)
        return 0
    finally:
        try:
            send(conn, {"bye": True})
        except OSError:
            pass
    if channel.calls == 0:
        _verdict(out, False, "failed", "the tests never called the submission", 0)
        return 0
    _verdict(out, True, "passed", f"all tests passed ({channel.calls} calls)", channel.calls)
    return 0


def _assert_line(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    message = str(exc)
    where = f"line {frames[-1].lineno} of the tests" if frames else ""
    return ", ".join(x for x in (where, message[:300]) if x)


# --- submission (untrusted code runs here) ----------------------------------------------------


def run_submission(request: dict) -> int:
    # Unbuffered, so what the submission printed is on file even if it dies mid-way.
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    # Make this process (and everything it forks) the memory-cgroup OOM killer's first choice,
    # so a memory bomb kills the submission, not the harness. Raising it needs no privilege.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            sock.connect("\0" + request["sock"])
            break
        except OSError:
            if time.monotonic() > deadline:
                return 2
            time.sleep(0.005)

    namespace = {"__name__": "__submission__", "__builtins__": __builtins__}
    try:
        exec(compile(request["code"], "<submission>", "exec"), namespace)  # noqa: S102 - sandboxed
    except Exception as exc:
        send(sock, {"hello": False, "error": _one_line(exc)})
        return 1
    names = [
        n
        for n, v in namespace.items()
        if not n.startswith("__") and callable(v) and not isinstance(v, type)
    ]
    send(sock, {"hello": True, "names": names})
    while True:
        message = recv(sock)
        if type(message) is not dict or "call" not in message:
            return 0
        try:
            fn = namespace[message["call"]]
            result = fn(*decode(message["args"]), **decode(message["kwargs"]))
            reply = {"ok": encode(result)}
        except Exception as exc:
            reply = {"raise": [type(exc).__name__, str(exc)[:500]]}
        send(sock, reply)


# --- janitor ----------------------------------------------------------------------------------


def _own_processes() -> list[int]:
    me, uid = os.getpid(), os.getuid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid and "Z" not in fields.get("State", ""):
            pids.append(int(entry))
    return pids


def _wipe(path: str) -> None:
    for entry in os.scandir(path):
        full = entry.path
        if entry.is_dir(follow_symlinks=False):
            os.chmod(full, 0o700)
            _wipe(full)
            os.rmdir(full)
        else:
            os.unlink(full)


def _remove_ipc() -> None:
    # IPC_RMID succeeds only for objects this uid owns or created: the submission's, never
    # anyone else's, so every listed id can simply be tried.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ipc_id = int(row.split()[1])
            if kind == "shm":
                libc.shmctl(ipc_id, ipc_rmid, None)
            elif kind == "msg":
                libc.msgctl(ipc_id, ipc_rmid, None)
            else:
                libc.semctl(ipc_id, 0, ipc_rmid)


def clean(work: str = "/work") -> dict:
    """Kill every other process of this uid, wipe the work dir and the uid's IPC objects."""
    for _ in range(200):
        # kill(-1) reaches every process this uid may signal in the container's pid namespace,
        # except the caller; a forking process cannot outrun it (fork fails once SIGKILL is
        # pending), but repeat until /proc shows none left.
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap_children()
        if not _own_processes():
            break
        time.sleep(0.005)
    left = _own_processes()
    output_bytes, output_head = 0, ""
    try:
        if os.path.isfile(OUTPUT_FILE):
            output_bytes = os.path.getsize(OUTPUT_FILE)
            with open(OUTPUT_FILE, "rb") as f:
                output_head = f.read(DETAIL_CAP).decode(errors="replace")
        _wipe(work)
        _remove_ipc()
        # POSIX message queues live in the container's ipc namespace, not in the work dir;
        # unlink succeeds only for this uid's own queues (the directory is sticky).
        if os.path.isdir("/dev/mqueue"):
            for name in os.listdir("/dev/mqueue"):
                try:
                    os.unlink(os.path.join("/dev/mqueue", name))
                except OSError:
                    pass
        leftover_files = os.listdir(work)
    except OSError as exc:
        return {"clean": False, "detail": f"wipe failed: {exc}"}
    return {
        "clean": not left and not leftover_files,
        "detail": f"processes {left[:5]}, files {leftover_files[:5]}",
        "output_bytes": output_bytes,
        "output_head": output_head,
    }


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# --- long-lived servers: one of each per container, forking one child per test ----------------


def _serve(handle) -> int:
    """Read one JSON request per stdin line, answer with one JSON line on stdout."""
    for line in sys.stdin.buffer:
        request = json.loads(line)
        reply = handle(request)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


def _fork_child(target, request: dict, stdout_fd: int, stderr_fd: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    # The child never returns into the server loop, whatever happens.
    code = 70
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        os.closerange(3, 256)
        code = target(request)
    finally:
        os._exit(code if type(code) is int else 70)


def harness_server() -> int:
    """uid HARNESS: a pristine process that forks a fresh harness per test (the test code never
    runs in the server itself, so nothing one test imports or patches reaches the next)."""
    devnull = os.open(os.devnull, os.O_WRONLY)

    def handle(request: dict) -> None:
        # The child's stdout is the server's: it writes exactly one verdict line there.
        pid = _fork_child(run_harness, request, 1, devnull)
        limit = request.get("limit_s")
        if not _wait_child(pid, float(limit) if type(limit) in (int, float) else None):
            end_container()

    return _serve(handle)


def _wait_child(pid: int, limit_s: float | None) -> bool:
    """Reap child `pid`; False when it was still running after `limit_s` seconds."""
    if limit_s is None:
        os.waitpid(pid, 0)
        return True
    deadline = time.monotonic() + limit_s
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here: poll
        fd = None
    try:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if fd is None:
                time.sleep(min(remaining, 0.01))
            else:
                select.select([fd], [], [], remaining)
    finally:
        if fd is not None:
            os.close(fd)


def end_container() -> None:
    """Stop the whole container from inside: tini (PID 1, this uid) forwards SIGTERM to the
    watchdog, whose exit ends tini and with it every process in the container."""
    os.kill(1, signal.SIGTERM)
    time.sleep(60)  # the container is going away around us


def submission_zygote() -> int:
    """uid SANDBOX: forks the submission for each test and, on request, cleans up after it.

    The zygote makes itself non-dumpable, so a submission (same uid) can neither ptrace it nor
    open its /proc fds (its stdout is the channel to the host). A submission can kill or stop
    it; the host then sees no CLEAN reply and destroys the container.
    """
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0

    def handle(request: dict) -> dict | None:
        if request.get("op") == "run":
            out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            _fork_child(_limited(run_submission), request, out, out)
            os.close(out)
            return None
        return {"id": request.get("id"), **clean(request.get("work", "/work"))}

    return _serve(handle)


def _limited(target):
    def run(request: dict) -> int:
        import resource

        # Output goes to a file on the work tmpfs; past the cap a write fails (SIGXFSZ kills).
        cap = int(request.get("output_cap", 65536))
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
        return target(request)

    return run


OUTPUT_FILE = "/work/.gradebook-output"


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    sys.exit({"harness": harness_server, "submission": submission_zygote}[role]())
