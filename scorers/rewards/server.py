"""The reward server behind `gradebook reward serve`: OpenRLHF's remote-reward HTTP protocol.

    POST / (or /get_reward)  {"query": [...], "prompts": [...], "labels": [...]}
      -> 200 {"rewards": [...], "scores": [...], "extra_logs": {"unscored": [...]},
              "verifier_fingerprint": "..."}
    GET /health -> 200 {"status": "ok", "verifier": ..., "verifier_fingerprint": ..., ...}

A bad request is a 4xx whose body is {"error": "<one line>"} (the same line is the status
reason); an unexpected fault is a 500 of the same shape, and the server goes on serving.

Built on the standard library's http.server, not an ASGI server: the work is CPU-bound grading
that blocks on worker pipes and the sandbox, so an event loop would only hand it to threads, and
no dependency is needed. Concurrency is bounded twice: a fixed pool of connection threads reads
and answers requests (more connections wait in the listen backlog), and a fixed pool of grader
threads (as many as the verifier has helper workers) grades the items of every request in
arrival order, each item's time limit starting when its grading starts. Connections are closed
after each answer (HTTP/1.0), so an idle client never holds a connection thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from scorers.grade import Grade
from scorers.rewards._core import Item, grade_now
from scorers.rewards.openrlhf import OpenRLHFReward

__all__ = ["BadRequest", "RewardServer", "ServerLimits"]

PATHS = ("/", "/get_reward")


class BadRequest(ValueError):
    """A request the server refuses: its HTTP status and a one-line reason."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = " ".join(reason.split())[:300]


@dataclass(frozen=True)
class ServerLimits:
    """Attributes:
    connections: requests read and answered at once (each on its own thread).
    max_body_bytes: largest request body accepted (413 beyond).
    max_items: most queries in one request (413 beyond).
    read_timeout_s: a client that sends nothing for this long is dropped.
    """

    connections: int = 64
    max_body_bytes: int = 256 * 1024 * 1024
    max_items: int = 65_536
    read_timeout_s: float = 60.0


def parse_request(body: bytes, max_items: int) -> tuple[list[str], list[Any], list[Any]]:
    """The (queries, prompts, labels) of an OpenRLHF request body.

    Raises:
        BadRequest: not JSON, not an object, a missing or mistyped key, or lengths that differ.
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(HTTPStatus.BAD_REQUEST, 'the body must be a JSON object {"query": [...], '
                         '"prompts": [...], "labels": [...]}')  # fmt: skip
    queries = data.get("query")
    if not isinstance(queries, list):
        raise BadRequest(HTTPStatus.BAD_REQUEST, '"query" must be a list of strings')
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, f'"query"[{i}] is {type(q).__name__}, not a string'
            )
    if len(queries) > max_items:
        raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"{len(queries)} queries in one request; at most {max_items}")  # fmt: skip
    lists = {}
    for key in ("prompts", "labels"):
        value = data.get(key)
        if value is None:
            value = [None] * len(queries)
        if not isinstance(value, list):
            raise BadRequest(HTTPStatus.BAD_REQUEST, f'"{key}" must be a list')
        if len(value) != len(queries):
            raise BadRequest(HTTPStatus.BAD_REQUEST,
                             f'"{key}" has {len(value)} items for {len(queries)} queries')  # fmt: skip
        lists[key] = value
    return queries, lists["prompts"], lists["labels"]


class _Server(HTTPServer):
    """An HTTPServer answering each connection on a bounded thread pool."""

    request_queue_size = 1024  # the listen backlog: connections beyond the pool wait here
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: RewardServer) -> None:
        self.app = app
        self.connections = ThreadPoolExecutor(
            max_workers=app.limits.connections, thread_name_prefix="reward-conn"
        )
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections.submit(self._serve_one, request, client_address)

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - one connection's fault (reset, timeout) ends only it
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            self.app.log(f"connection from {client_address[0]} failed: {type(exc).__name__}: {exc}")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"
    server_version = "gradebook-reward"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.app.limits.read_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # thousands of requests a step: the server logs a summary instead

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.split("?")[0] not in ("/health", *PATHS):
            return self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path[:100]}"})
        self._send(HTTPStatus.OK, self.server.app.health())

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        try:
            if self.path.split("?")[0] not in PATHS:
                raise BadRequest(HTTPStatus.NOT_FOUND, f"no such path {self.path[:100]}; POST to /")
            body = self._body()
            queries, prompts, labels = parse_request(body, self.server.app.limits.max_items)
            answer = self.server.app.answer(queries, prompts, labels)
        except BadRequest as exc:
            self.server.app.count_rejected()
            return self._send(exc.status, {"error": exc.reason}, exc.reason)
        except Exception as exc:  # noqa: BLE001 - never take the server down; say what failed
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            self.server.app.log(f"request failed: {reason}")
            return self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": reason}, reason)
        self._send(HTTPStatus.OK, answer)

    def _not_allowed(self) -> None:
        reason = f"{self.command} is not supported; POST a batch to /"
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": reason}, reason)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        try:
            size = int(length)
        except ValueError:
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, f"bad Content-Length {length[:40]!r}"
            ) from None
        limit = self.server.app.limits.max_body_bytes
        if size < 0 or size > limit:
            raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                             f"a body of {size} bytes; at most {limit}")  # fmt: skip
        body = self.rfile.read(size)
        if len(body) < size:
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, f"the body ended after {len(body)} of {size} bytes"
            )
        return body

    def _send(self, status: HTTPStatus, payload: dict[str, Any], reason: str | None = None) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
        try:
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Gradebook-Fingerprint", self.server.app.fingerprint)
            self.end_headers()
            self.wfile.write(data)
        except (ConnectionError, TimeoutError):
            pass  # the client went away; its retry gets a fresh answer


class RewardServer:
    """OpenRLHF's remote reward over HTTP, grading with one gradebook reward.

    Args:
        reward: what to grade with (`scorers.rewards.openrlhf_reward(...)`).
        host, port: where to listen (port 0: any free port; see `url`).
        limits: connection and size bounds.
        log: where one-line notices go (a summary of the traffic every `report_every_s`).
    """

    def __init__(
        self,
        reward: OpenRLHFReward,
        host: str = "127.0.0.1",
        port: int = 5000,
        *,
        limits: ServerLimits | None = None,
        log: Callable[[str], None] = print,
        report_every_s: float = 30.0,
    ) -> None:
        self.reward = reward
        self.limits = limits or ServerLimits()
        self.log = log
        self.fingerprint = reward.fingerprint
        self._graders = ThreadPoolExecutor(
            max_workers=max(1, reward.spec.concurrency()), thread_name_prefix="reward-grade"
        )
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "rejected": 0, "graded": 0, "unscored": 0}
        self._reported = dict(self._counts)
        self._report_every_s = report_every_s
        self._stop = threading.Event()
        self._httpd = _Server((host, port), self)  # OSError when the address is taken
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def answer(self, queries: list[str], prompts: list[Any], labels: list[Any]) -> dict[str, Any]:
        """Grade one request's batch (items queue for the graders in arrival order)."""
        try:
            items = self.reward.items(queries, prompts, labels)
        except ValueError as exc:
            raise BadRequest(HTTPStatus.BAD_REQUEST, str(exc)) from None
        grades = self._grade(items)
        unscored = sum(g.status != "scored" for g in grades)
        with self._lock:
            self._counts["requests"] += 1
            self._counts["graded"] += len(grades)
            self._counts["unscored"] += unscored
        return {**self.reward.respond(grades), "verifier_fingerprint": self.fingerprint}

    def _grade(self, items: list[Item]) -> list[Grade]:
        spec = self.reward.spec
        futures: list[Future[Grade]] = [self._graders.submit(grade_now, spec, i) for i in items]
        return [f.result() for f in futures]

    def count_rejected(self) -> None:
        with self._lock:
            self._counts["rejected"] += 1

    def health(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self._counts)
        return {
            "status": "ok",
            "verifier": self.reward.verifier,
            "verifier_fingerprint": self.fingerprint,
            **counts,
        }

    # -- running ----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve until `close()` (from another thread) or KeyboardInterrupt."""
        reporter = threading.Thread(target=self._report_loop, daemon=True, name="reward-report")
        reporter.start()
        try:
            self._httpd.serve_forever(poll_interval=0.2)
        finally:
            self._stop.set()

    def start(self) -> RewardServer:
        """Serve in a background thread (tests, notebooks); returns self."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="reward-http")
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.connections.shutdown(wait=False, cancel_futures=True)
        self._graders.shutdown(wait=False, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _report_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._report_every_s):
            with self._lock:
                now, before = dict(self._counts), self._reported
                self._reported = now
            if now == before:
                continue
            took = time.monotonic() - last
            last = time.monotonic()
            self.log(
                f"{now['graded'] - before['graded']} graded in {took:.0f} s "
                f"({now['unscored'] - before['unscored']} unscored, "
                f"{now['rejected'] - before['rejected']} bad requests); "
                f"{now['graded']} since start"
            )
