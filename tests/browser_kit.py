"""Headless Debian chromium for the tests that check what a page DRAWS (the report, the docs).

No browser driver library: chromium's own `--screenshot`, and for measuring the drawn page
(bounding boxes, scroll widths) a script the test hands `measure()`: it is appended to a copy
of the page, runs once the page has drawn, and POSTs its JSON result to the local server that
serves the page. Set GRADEBOOK_SCREENSHOTS=DIR to keep every screenshot there.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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
