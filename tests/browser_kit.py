"""Headless Debian chromium for the tests that check what a page DRAWS (the report, the docs).

No browser driver library: chromium's own `--screenshot`, and for measuring the drawn page
(bounding boxes, scroll widths) a script the test hands `measure()`: it is appended to a copy
of the page, runs once the page has drawn, and POSTs its JSON result to the local server that
serves the page. Set GRADEBOOK_SCREENSHOTS=DIR to keep every screenshot there.

For an app that fetches and draws its data after the page has loaded (`inspect view`),
`browser()` drives chromium over the DevTools protocol instead: `--dump-dom` and
`--screenshot` would catch it before it has drawn, and the protocol lets a test wait on the
condition it cares about.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What works on this machine's closed network (docs: .library machines/python.md): without the
# background-networking flags chromium's own connections are refused, many at a time.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]


def chromium() -> str | None:
    return next(
        (shutil.which(b) for b in ("chromium", "chromium-browser") if shutil.which(b)), None
    )


def need_chromium() -> str:
    from conftest import need

    path = chromium()
    need(path is not None, "chromium not installed: run `bash infra/install_chromium.sh`")
    assert path is not None
    return path


def _run(args: list[str], profile: Path, timeout: float = 180) -> str:
    exe = need_chromium()
    done = subprocess.run(
        [exe, *FLAGS, f"--user-data-dir={profile}", *args],
        check=True,
        capture_output=True,
        timeout=timeout,
        text=True,
    )
    return done.stdout


def screenshot(
    url: str,
    png: Path,
    *,
    width: int,
    height: int,
    profile: Path,
    min_colours: int = 50,
    budget_ms: int = 10_000,
) -> Path:
    """A PNG of `url` in a window of width × height (kept in $GRADEBOOK_SCREENSHOTS too),
    checked to be that size and not blank: a blank or error page has a handful of colours,
    text and charts have hundreds."""
    from PIL import Image

    _run(
        [
            f"--window-size={width},{height}",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={png}",
            url,
        ],
        profile,
    )
    keep = os.environ.get("GRADEBOOK_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
    with Image.open(png) as img:
        assert img.size == (width, height), img.size
        colours = img.convert("RGB").getcolors(maxcolors=1_000_000) or []
    assert len(colours) > min_colours, f"{png.name}: {len(colours)} colours: blank?"
    return png


def measure(
    page: Path,
    script: str,
    *,
    width: int,
    height: int,
    profile: Path,
    timeout_s: float = 420,
) -> Any:
    """Load a copy of `page` with `script` appended and return what the script reported.

    `script` is the body of an async function; it awaits what it needs and returns a JSON-able
    value, which it POSTs back to the server that serves the page's directory on 127.0.0.1
    (so pages in that directory are same-origin: a script may read other pages' DOM in
    frames). The test waits for that report, not for a time; a script that throws fails the
    test with its message.
    """
    copy = page.with_name(f".measured-{page.name}")
    probe = (
        "<script>(async () => {" + script + "})().then("
        "(r) => JSON.stringify({ok: r}), (e) => JSON.stringify({error: String(e && e.stack || e)})"
        ").then((body) => fetch('/__result', {method: 'POST', body}));</script>"
    )
    text = page.read_text(encoding="utf-8")
    at = text.rfind("</body>")
    copy.write_text(text[:at] + probe + text[at:] if at >= 0 else text + probe, encoding="utf-8")
    exe = need_chromium()
    with _serving(page.parent) as (url, reported):
        proc = subprocess.Popen(
            [
                exe,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"{url}/{copy.name}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            got = reported.wait(timeout_s)
        finally:
            _stop(proc)
            copy.unlink(missing_ok=True)
    assert got, f"the measuring script reported nothing in {timeout_s:.0f} s (page: {page})"
    result = json.loads(reported.body)
    assert "error" not in result, result["error"]
    return result["ok"]


class _Report(threading.Event):
    body: bytes = b""


@contextmanager
def _serving(directory: Path) -> Iterator[tuple[str, _Report]]:
    """Serve `directory` on 127.0.0.1 and take one POST to /__result."""
    reported = _Report()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)

        def do_POST(self) -> None:  # noqa: N802 - the http.server protocol
            reported.body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.end_headers()
            reported.set()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", reported
    finally:
        server.shutdown()
        server.server_close()


def _stop(proc: subprocess.Popen) -> None:
    """End the chromium this test started: its own process group, nothing else."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


# For the measuring scripts: wait until a condition holds (virtual time runs fast).
WAIT_FOR = """
const waitFor = async (test, what) => {
  for (let i = 0; i < 400; i++) {
    if (test()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("timed out waiting for " + what);
};
"""


@dataclass
class Page:
    """One tab of a running browser, driven over its DevTools websocket."""

    ws: Any
    _id: int = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # events arrive between the replies: skip them
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def text(self) -> str:
        """What the page shows as text now (`document.body.innerText`)."""
        result = self.call(
            "Runtime.evaluate",
            expression="document.body ? document.body.innerText : ''",
            returnByValue=True,
        )
        return str(result.get("result", {}).get("value") or "")

    def wait_for(self, ready: Callable[[str], bool], timeout_s: float) -> str:
        """Poll the page's text until `ready(text)` holds; the last text either way."""
        deadline = time.monotonic() + timeout_s
        text = self.text()
        while not ready(text) and time.monotonic() < deadline:
            time.sleep(0.2)
            text = self.text()
        return text

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path


@contextmanager
def browser(profile: Path, timeout_s: float = 60.0) -> Iterator[Callable[[str], Page]]:
    """A headless Chromium with its own profile dir; yields `open(url) -> Page`. The browser
    (and every process it started) is stopped when the block ends."""
    from websockets.sync.client import connect

    binary = need_chromium()
    profile.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            binary,
            *FLAGS,
            "--window-size=1400,900",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    sockets: list[Any] = []
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.is_file() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])

        def open_page(url: str) -> Page:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.loads(r.read())
            target = next(t for t in targets if t.get("type") == "page")
            ws = connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout_s)
            sockets.append(ws)
            page = Page(ws)
            page.call("Page.enable")
            page.call("Page.navigate", url=url)
            return page

        yield open_page
    finally:
        for ws in sockets:
            ws.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
