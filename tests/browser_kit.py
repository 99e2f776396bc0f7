"""Headless Debian chromium for the tests that check what a page DRAWS (the report, the docs).

No browser driver library: chromium's own `--screenshot` and `--dump-dom`. To measure the
drawn page (bounding boxes, scroll widths), a test hands `measure()` a script; it is appended
to a copy of the page, runs once the page has drawn, and writes its JSON result into the DOM,
which `--dump-dom` returns. Set GRADEBOOK_SCREENSHOTS=DIR to keep every screenshot there.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
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

_RESULT = "gradebook-measure"


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
    url: str, png: Path, *, width: int, height: int, profile: Path, budget_ms: int = 10_000
) -> Path:
    """A PNG of `url` in a window of width × height (kept in $GRADEBOOK_SCREENSHOTS too)."""
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
    return png


def measure(
    page: Path,
    script: str,
    *,
    width: int,
    height: int,
    profile: Path,
    budget_ms: int = 20_000,
) -> Any:
    """Load a copy of `page` with `script` appended and return what the script reported.

    `script` is the body of an async function; it awaits what it needs and returns a JSON-able
    value. A script that throws fails the test with its message.
    """
    copy = page.with_name(f".measured-{page.name}")
    probe = (
        "<script>(async () => {" + script + "})().then("
        f"(r) => {{ const el = document.createElement('pre'); el.id = '{_RESULT}'; "
        "el.textContent = JSON.stringify({ok: r}); document.body.appendChild(el); },"
        f"(e) => {{ const el = document.createElement('pre'); el.id = '{_RESULT}'; "
        "el.textContent = JSON.stringify({error: String(e && e.stack || e)}); "
        "document.body.appendChild(el); });</script>"
    )
    text = page.read_text(encoding="utf-8")
    at = text.rfind("</body>")
    copy.write_text(text[:at] + probe + text[at:] if at >= 0 else text + probe, encoding="utf-8")
    try:
        dom = _run(
            [
                f"--window-size={width},{height}",
                f"--virtual-time-budget={budget_ms}",
                "--dump-dom",
                copy.as_uri(),
            ],
            profile,
        )
    finally:
        copy.unlink(missing_ok=True)
    found = re.search(rf'<pre id="{_RESULT}">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script reported nothing (page: {page})"
    result = json.loads(html.unescape(found.group(1)))
    assert "error" not in result, result["error"]
    return result["ok"]


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
