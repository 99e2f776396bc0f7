"""A tiny local OpenAI-compatible chat server: the offline stand-in for a vLLM server.

The demo and the tests run real Inspect generation against it through the same provider code
a real deployment uses (`openai-api/local/<name>` with LOCAL_BASE_URL, or `vllm/<name>` with a
base URL). Answers come from a script: a function of (model name, messages) that returns the
reply text, or an HTTP status code to fail that request with (e.g. 500, to test error handling).

`python -m sweeps.mock_server --port 8765` runs it as a judge a user can start and stop (the
judge-outage walkthrough in docs/how-to/inspect-scorers.md).

A caller that waits on it (a benchmark building a log with `eval()`) wraps the wait in
`watchdog()`: when the server answers nothing for a bound, the wait ends with one line saying
what waited and what the server saw, instead of sitting in Inspect's retry backoff for minutes.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Script",
    "ScriptedServer",
    "Stalled",
    "judge_script",
    "main",
    "scripted_server",
    "watchdog",
]

# (model name, chat messages as sent) -> reply text, an HTTP status code to fail with, or bytes
# to send as the body of a 200 (a server answering garbage)
Script = Callable[[str, list[dict[str, Any]]], "str | int | bytes"]


# stopping, the longest wait for the answers being sent (a script may block on a test's event)
STOP_WAIT_S = 5.0


@dataclass
class ScriptedServer:
    """A running server; `base_url` ends in /v1 like vLLM's.

    Besides the requests it answered, it keeps what a stalled caller needs to know: requests
    being answered now (`in_flight`), connections open (`open_connections`, idle keep-alive
    ones included) and when it last answered (`quiet_for`)."""

    base_url: str
    requests: list[tuple[str, int]] = field(default_factory=list)  # (model, status) per request
    _lock: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _in_flight: int = field(default=0, repr=False)
    _connections: set[socket.socket] = field(default_factory=set, repr=False)
    _answered_at: float = field(default_factory=time.monotonic, repr=False)

    def record(self, model: str, status: int) -> None:
        with self._lock:
            self.requests.append((model, status))

    def count(self, status: int | None = None) -> int:
        with self._lock:
            return sum(1 for _, s in self.requests if status is None or s == status)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def quiet_for(self) -> float:
        """Seconds since the server last answered a request (or started)."""
        with self._lock:
            return time.monotonic() - self._answered_at

    @contextmanager
    def _answering(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._answered_at = time.monotonic()

    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)
            self._lock.notify_all()

    def _close_connections(self) -> None:
        """Close every connection as a stopped server's clients see it: reading stops, so a
        handler waiting for the next request on an idle keep-alive connection gets its end and
        closes it, and one answering a request sends the answer, then closes. Returns when all
        are closed (or after STOP_WAIT_S). Without it the handler threads outlive the server,
        answering every client that kept a connection."""
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass  # its client closed it meanwhile
        with self._lock:
            self._lock.wait_for(lambda: not self._connections, timeout=STOP_WAIT_S)


def _handler(script: Script, server: ScriptedServer, models: list[str]) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # the demo's terminal is not the place for an access log

        def _send(self, status: int, body: dict[str, Any] | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            with server._answering():
                self._get()

        def do_POST(self) -> None:  # noqa: N802
            with server._answering():
                self._post()

        def _get(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                data = [{"id": m, "object": "model", "owned_by": "gradebook"} for m in models]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def _post(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "request body is not JSON"}})
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            model = str(body.get("model", ""))
            messages = body.get("messages") or []
            try:
                reply = script(model, messages)
            except Exception as exc:  # a broken script is a server error, as with a real server
                reply = 500
                detail = f"script raised {exc!r}"
            else:
                detail = f"scripted HTTP {reply}"
            if isinstance(reply, bytes):  # a broken server: this body, as it is, with a 200
                server.record(model, 200)
                self._send(200, reply)
                return
            if isinstance(reply, int):
                server.record(model, reply)
                self._send(reply, {"error": {"message": detail, "type": "server_error"}})
                return
            server.record(model, 200)
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
            completion_tokens = len(reply.split())
            self._send(
                200,
                {
                    "id": f"chatcmpl-{time.monotonic_ns()}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                },
            )

    return Handler


class _Server(ThreadingHTTPServer):
    # a real server's backlog: with the default 5, a burst of 32 connections loses SYNs and
    # the clients' SYN retries (1, 3, 7 s) stall requests
    request_queue_size = 1024
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, state: ScriptedServer) -> None:
        self.state = state
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.state._opened(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.state._closed(request)
        super().shutdown_request(request)


@contextmanager
def scripted_server(
    script: Script, *, models: list[str] | None = None, port: int = 0
) -> Iterator[ScriptedServer]:
    """Serve `script` on 127.0.0.1 for the duration of the block.

    Args:
        script: answers each chat request; return a string to reply, an int to fail with that
            HTTP status.
        models: ids listed by GET /v1/models.
        port: the port (0: a free one); a server stopped and started again on its port is the
            same URL, as a restarted model server is.
    """
    state = ScriptedServer(base_url="")
    httpd = _Server(("127.0.0.1", port), _handler(script, state, models or []), state)
    state.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, name="scripted-llm", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        state._close_connections()


class Stalled(RuntimeError):
    """A wait `watchdog()` ended: the server answered nothing for its bound. The message is
    the line to show."""


@contextmanager
def watchdog(
    server: ScriptedServer, *, waiting: str, quiet_s: float, until: int | None = None
) -> Iterator[None]:
    """Bound a wait on `server` (run in the main thread): when it answers no request for
    `quiet_s` seconds before it has answered `until` of them (None: while the block runs), the
    block is interrupted as Ctrl-C would (an Inspect `eval()` in it is cancelled) and Stalled
    is raised, saying what waited and what the server saw.

    Args:
        server: the server the block's requests should reach.
        waiting: what the block does, for the line ("eval() generating the 100-sample log").
        quiet_s: the longest time without an answer that is not a stall.
        until: requests after which the block has nothing more to ask (an eval writing its
            log afterwards asks nothing and is not stalled).
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("watchdog() interrupts the main thread: use it there")
    started, main = time.monotonic(), threading.get_ident()
    done, lock = threading.Event(), threading.Lock()
    line: list[str] = []

    def watch() -> None:
        while not done.wait(min(1.0, quiet_s / 4)):
            answered = server.count()
            if until is not None and answered >= until:
                return
            if min(server.quiet_for(), time.monotonic() - started) <= quiet_s:
                continue
            with lock:
                if done.is_set():
                    return
                line.append(
                    f"{waiting}: stopped: {server.base_url} answered nothing for {quiet_s:g} s "
                    f"({answered}{f' of {until}' if until else ''} requests answered, "
                    f"{server.in_flight} being answered, {server.open_connections} connections "
                    "open)"
                )
                signal.pthread_kill(main, signal.SIGINT)  # wakes the main thread's wait too
            return

    # A process started in the background by a shell (`cmd &`, nohup) inherits SIGINT
    # ignored, and Python then installs no handler: the interrupt would be lost and the wait
    # would run on. A handler the program installed itself (a stop handler) stays in charge.
    inherited = signal.getsignal(signal.SIGINT)
    ignored = inherited in (signal.SIG_IGN, signal.SIG_DFL, None)
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=watch, name="scripted-llm-watchdog", daemon=True)
    thread.start()
    try:
        try:
            yield
        finally:
            with lock:  # from here on the watchdog interrupts nothing
                done.set()
            if ignored:
                signal.signal(signal.SIGINT, inherited or signal.SIG_DFL)
    except BaseException:
        if not line:
            raise
        raise Stalled(line[0]) from None  # what the interrupt did inside is ours, not news
    if line:  # the block took the interrupt and returned (Inspect's eval() returns no logs)
        raise Stalled(line[0])


_SUBMISSION = re.compile(r"\[Submission\]:(.*?)\*{3,}", re.S)
_CRITERION = re.compile(r"\[Criterion\]:(.*?)\*{3,}", re.S)


def judge_script(model: str, messages: list[dict[str, Any]]) -> str:
    """A stand-in judge for Inspect's model-graded scorers (`model_graded_qa`/`_fact`): "GRADE: C"
    when the submission states the criterion (as a whole word), else "GRADE: I"."""
    prompt = "\n".join(str(m.get("content", "")) for m in messages)
    submission, criterion = _SUBMISSION.search(prompt), _CRITERION.search(prompt)
    if submission is None or criterion is None:
        return "I only grade: send a model-graded prompt ([Submission] and [Criterion])."
    wanted = criterion.group(1).strip()
    said = re.search(rf"(?<!\w){re.escape(wanted)}(?!\w)", submission.group(1)) if wanted else None
    return f"The submission {'states' if said else 'does not state'} {wanted!r}.\n" + (
        "GRADE: C" if said else "GRADE: I"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m sweeps.mock_server --port 8765`: a local judge (`judge_script`) on 127.0.0.1,
    for trying judge-graded scorers and a judge outage offline; Ctrl-C stops it."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m sweeps.mock_server", description=main.__doc__)
    parser.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (0: any free)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with scripted_server(judge_script, models=["judge"], port=args.port) as server:
        print(f"judge listening on {server.base_url} (Ctrl-C stops it)", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
