"""Driving headless Chromium over the DevTools protocol: load a page, wait until it has drawn
what a test waits for, read its text, take a screenshot.

`--dump-dom` serialises a page once it is loaded, before an app like `inspect view` has
fetched and drawn its data; the protocol lets a test wait on the condition it cares about.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
]


def chromium() -> str | None:
    return next(
        (shutil.which(b) for b in ("chromium", "chromium-browser") if shutil.which(b)), None
    )


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

    binary = chromium()
    if binary is None:
        raise FileNotFoundError("chromium")
    profile.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [binary, *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
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
