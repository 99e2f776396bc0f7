"""A tiny local OpenAI-compatible chat server: the offline stand-in for a vLLM server.

The demo and the tests run real Inspect generation against it through the same provider code
a real deployment uses (`openai-api/local/<name>` with LOCAL_BASE_URL, or `vllm/<name>` with a
base URL). Answers come from a script: a function of (model name, messages) that returns the
reply text, or an HTTP status code to fail that request with (e.g. 500, to test error handling).

`python -m sweeps.mock_server --port 8765` runs it as a judge a user can start and stop (the
judge-outage walkthrough in docs/how-to/inspect-scorers.md).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Script", "ScriptedServer", "judge_script", "main", "scripted_server"]

# (model name, chat messages as sent) -> reply text, an HTTP status code to fail with, or bytes
# to send as the body of a 200 (a server answering garbage)
Script = Callable[[str, list[dict[str, Any]]], "str | int | bytes"]


@dataclass
class ScriptedServer:
    """A running server; `base_url` ends in /v1 like vLLM's."""

    base_url: str
    requests: list[tuple[str, int]] = field(default_factory=list)  # (model, status) per request
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, model: str, status: int) -> None:
        with self._lock:
            self.requests.append((model, status))

    def count(self, status: int | None = None) -> int:
        with self._lock:
            return sum(1 for _, s in self.requests if status is None or s == status)


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
            if self.path.rstrip("/").endswith("/models"):
                data = [{"id": m, "object": "model", "owned_by": "gradebook"} for m in models]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
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
    httpd = _Server(("127.0.0.1", port), _handler(script, state, models or []))
    httpd.daemon_threads = True
    state.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, name="scripted-llm", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


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
