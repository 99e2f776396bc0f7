"""The reward server behind `gradebook reward serve`: OpenRLHF's remote-reward HTTP protocol.

    POST / (or /get_reward)  {"query": [...], "prompts": [...], "labels": [...]}
      -> 200 {"rewards": [...], "scores": [...], "extra_logs": {"unscored": [...]},
              "verifier_fingerprint": "..."}
    GET /health -> 200 {"status": "ok", "verifier": ..., "verifier_fingerprint": ..., ...}

A bad request is a 4xx whose body is {"error": "<one line>"} (the same line is the status
reason); an unexpected fault is a 500 of the same shape, and the server goes on serving.

Requests are read by aiohttp's server on one event loop, so a client that sends slowly holds a
socket, never a thread: a trainer's request is read and answered while any number of stalled
clients are connected. Every request has a read deadline (`ServerLimits.read_timeout_s`): its
request line and headers must arrive within it of connecting (aiohttp's `keepalive_timeout`,
which also closes a connection that never sends a request), and its body within it after them
(`asyncio.timeout`; a 408 then). The work is CPU-bound grading that blocks on worker pipes and
the sandbox, so a read request goes to a fixed pool of `connections` threads, which parse it and
wait for a fixed pool of grader threads (as many as the verifier has helper workers) that
grades the items of every request in arrival order, each item's time limit starting when its
grading starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web

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
    connections: requests parsed and graded at once, each on its own thread (more wait,
        already read; a request being read holds no thread).
    max_body_bytes: largest request body accepted (413 beyond).
    max_items: most queries in one request (413 beyond).
    read_timeout_s: a request's deadline: its headers must arrive within this many seconds of
        connecting (else the connection is closed), its body within as long again (else 408).
        An idle connection is closed after it too. 60 s lets the largest body accepted
        (256 MB) arrive at 4.5 MB/s; a stalled client holds only a socket meanwhile.
    """

    connections: int = 64
    max_body_bytes: int = 256 * 1024 * 1024
    max_items: int = 65_536
    read_timeout_s: float = 60.0


def parse_request(body: bytes, max_items: int) -> tuple[list[str], list[Any], list[Any]]:
    """The (queries, prompts, labels) of an OpenRLHF request body.

    Raises:
        BadRequest: not JSON, nested too deeply, not an object, a missing or mistyped key, or
            lengths that differ.
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None
    except RecursionError:  # the decoder recurses per nesting level: "[[[[..." is the client's
        raise BadRequest(HTTPStatus.BAD_REQUEST, "the body's JSON is nested too deeply") from None
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


# aiohttp logs a malformed request (a port scanner's) with its traceback: the client gets its
# 400 from aiohttp, and the terminal stays for the traffic summary.
_QUIET = logging.getLogger("gradebook.reward.http")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); OSError when the address is taken or not local."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # backlog: connections beyond what the loop has accepted wait here
    return socket.create_server((host, port), family=family, backlog=1024)


class RewardServer:
    """OpenRLHF's remote reward over HTTP, grading with one gradebook reward.

    Args:
        reward: what to grade with (`scorers.rewards.openrlhf_reward(...)`).
        host, port: where to listen (port 0: any free port; see `url`).
        limits: connection, size and time bounds.
        log: where one-line notices go (a summary of the traffic every `report_every_s`).

    Raises:
        OSError: the address cannot be bound (taken, or not this machine's).
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
        # first: an address that cannot be bound fails before anything else is made
        self._sock = _listen(host, port)
        self.reward = reward
        self.limits = limits or ServerLimits()
        self.log = log
        self.fingerprint = reward.fingerprint
        self._graders = ThreadPoolExecutor(
            max_workers=max(1, reward.spec.concurrency()), thread_name_prefix="reward-grade"
        )
        self._answerers = ThreadPoolExecutor(
            max_workers=self.limits.connections, thread_name_prefix="reward-answer"
        )
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "rejected": 0, "graded": 0, "unscored": 0}
        self._reported = dict(self._counts)
        self._report_every_s = report_every_s
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) listened on."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

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

    def _answer_body(self, body: bytes) -> bytes:
        """A read body's answer, encoded (on an answer thread: parsing a big batch is CPU)."""
        queries, prompts, labels = parse_request(body, self.limits.max_items)
        return _encode(self.answer(queries, prompts, labels))

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

    # -- HTTP --------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        if request.method == "GET":
            if path not in ("/health", *PATHS):
                return self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {path[:100]}"})
            return self._send(HTTPStatus.OK, self.health())
        if request.method != "POST":
            reason = f"{request.method[:20]} is not supported; POST a batch to /"
            return self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": reason}, reason)
        try:
            if path not in PATHS:
                raise BadRequest(HTTPStatus.NOT_FOUND, f"no such path {path[:100]}; POST to /")
            body = await self._body(request)
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(self._answerers, self._answer_body, body)
        except BadRequest as exc:
            self.count_rejected()
            return self._send(exc.status, {"error": exc.reason}, exc.reason)
        except Exception as exc:  # noqa: BLE001 - never take the server down; say what failed
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            self.log(f"request failed: {reason}")
            return self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": reason}, reason)
        return self._response(HTTPStatus.OK, data)

    async def _body(self, request: web.Request) -> bytes:
        length = request.headers.get("Content-Length")
        if length is None:
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        try:
            size = int(length)
        except ValueError:
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, f"bad Content-Length {length[:40]!r}"
            ) from None
        limit = self.limits.max_body_bytes
        if size < 0 or size > limit:
            raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                             f"a body of {size} bytes; at most {limit}")  # fmt: skip
        deadline = self.limits.read_timeout_s
        try:
            async with asyncio.timeout(deadline):
                return await request.content.readexactly(size)
        except TimeoutError:
            got = request.content.total_bytes
            raise BadRequest(
                HTTPStatus.REQUEST_TIMEOUT,
                f"the body did not arrive within {deadline:g} s ({got} of {size} bytes); "
                "send it whole at once",
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            got = len(exc.partial) if isinstance(exc, asyncio.IncompleteReadError) else 0
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, f"the body ended after {got} of {size} bytes"
            ) from None

    def _send(
        self, status: HTTPStatus, payload: dict[str, Any], reason: str | None = None
    ) -> web.Response:
        return self._response(status, _encode(payload), reason)

    def _response(self, status: HTTPStatus, data: bytes, reason: str | None = None) -> web.Response:
        response = web.Response(
            body=data,
            status=status,
            reason=reason,
            content_type="application/json",
            headers={"X-Gradebook-Fingerprint": self.fingerprint, "Server": "gradebook-reward"},
        )
        if status >= 400:
            response.force_close()  # what is left of a refused request is not read
        return response

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app,
            access_log=None,  # thousands of requests a step: the server logs a summary instead
            logger=_QUIET,
            keepalive_timeout=self.limits.read_timeout_s,
            lingering_time=0,
            auto_decompress=False,  # a compressed body is refused as not JSON, never inflated
            shutdown_timeout=1,
        )
        await runner.setup()
        try:
            await web.SockSite(runner, self._sock).start()
            self._ready.set()
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    # -- running ----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve until `close()` (from another thread) or KeyboardInterrupt."""
        reporter = threading.Thread(target=self._report_loop, daemon=True, name="reward-report")
        reporter.start()
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._failed = exc  # for start(), which waits in another thread
            raise
        finally:
            self._stop.set()
            self._ready.set()

    def start(self) -> RewardServer:
        """Serve in a background thread (tests, notebooks); returns self once listening."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="reward-http")
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed
        return self

    def close(self) -> None:
        self._stop.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:
                pass  # the loop ended meanwhile
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()
        self._answerers.shutdown(wait=False, cancel_futures=True)
        self._graders.shutdown(wait=False, cancel_futures=True)

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


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode() + b"\n"
