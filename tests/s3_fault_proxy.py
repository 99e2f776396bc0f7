"""A fault-injecting HTTP proxy in front of the test S3 server, on a free 127.0.0.1 port.

Clients point AWS_ENDPOINT_URL at it; it forwards each request to the real server (moto's) and,
when told, answers 500 or 503 SlowDown instead, cuts a response body short, runs a hook before
forwarding (replace an object, delete a bucket), or stops listening (connection refused). Real
HTTP on the wire, so what is tested is what botocore and s3fs do with it, not a patched client.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


@dataclass
class Faults:
    """What the proxy does to the next requests. `match` picks the requests a fault applies to
    (method, path); every field is read under the proxy's lock."""

    error_status: int = 0  # 500 or 503: answer this instead of forwarding
    errors_left: int = 0  # ... for this many matching requests (-1: every one)
    cut_left: int = 0  # cut this many matching GET bodies to half (-1: every one)
    match: Callable[[str, str], bool] = lambda method, path: True
    hook: Callable[[str, str], None] | None = None  # runs before forwarding a matching request
    seen: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status)


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.faults = Faults()
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, **changes: object) -> None:
        with self.lock:
            for k, v in changes.items():
                setattr(self.faults, k, v)

    def seen(self) -> list[tuple[str, str, int]]:
        with self.lock:
            return list(self.faults.seen)

    def stop(self) -> None:
        """Stop listening: the next connection is refused."""
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = _read_chunked(h)
        with self.lock:
            f = self.faults
            matches = f.match(h.command, h.path)
            error = matches and f.errors_left != 0 and f.error_status
            if error:
                f.errors_left -= 1 if f.errors_left > 0 else 0
            cut = matches and h.command == "GET" and f.cut_left != 0 and "/?" not in h.path
            if cut:
                f.cut_left -= 1 if f.cut_left > 0 else 0
            hook = f.hook if matches else None
        if error:
            payload = _SLOW_DOWN if error == 503 else _INTERNAL
            self._record(h, error)
            h.send_response(error)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        if hook is not None:
            hook(h.command, h.path)
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() != "transfer-encoding"}
            headers["Content-Length"] = str(len(body))
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self._record(h, resp.status)
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        if h.command == "HEAD":
            h.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            h.end_headers()
            return
        h.send_header("Content-Length", str(len(data)))
        if cut and len(data) > 1:
            # the full length announced, half of it sent, then the connection dropped
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        h.end_headers()
        h.wfile.write(data)

    def _record(self, h: BaseHTTPRequestHandler, status: int) -> None:
        with self.lock:
            self.faults.seen.append((h.command, h.path, status))


def _read_chunked(h: BaseHTTPRequestHandler) -> bytes:
    out = b""
    while True:
        size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            h.rfile.readline()
            return out
        out += h.rfile.read(size)
        h.rfile.readline()
