"""The documentation site at 1400 and 800 px wide: nothing is cut off behind a scrollbar.

The site is built with mkdocs into a temp dir; headless chromium loads every page (served on
127.0.0.1) in a frame of each width and measures, after layout, every code block, table, image
and diagram of the page's content.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from browser_kit import WAIT_FOR, measure, need_chromium, screenshot

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (1400, 800)

# Per page and width: what of its content is cut off. Never allowed: a page wider than the
# window, an image or drawing past the content's edge, a diagram (```{.text .diagram}) wider
# than its box. A table wider than its box is allowed only at 800 px, inside Material's
# scrolling wrapper. A long line of code scrolls inside its own block (`pre > code` is a
# scroll container): every line stays readable, so it is a problem only when the block cannot
# scroll (its overflow is not auto or scroll).
MEASURE = (
    WAIT_FOR
    + """
const pages = PAGES;
const results = {};
const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
for (const width of WIDTHS) {
  for (const page of pages) {
    const frame = document.createElement("iframe");
    frame.style.cssText = `width:${width}px;height:900px;border:0`;
    document.body.appendChild(frame);
    await new Promise((done) => { frame.onload = done; frame.src = page; });
    const doc = frame.contentDocument;
    await waitFor(() => doc.readyState === "complete", page);
    const content = doc.querySelector("article.md-content__inner") || doc.body;
    const edge = content.getBoundingClientRect().right;
    const cut = [];
    const root = doc.scrollingElement;
    if (root.scrollWidth > root.clientWidth + 1) {
      cut.push({kind: "page", over: root.scrollWidth - root.clientWidth});
    }
    for (const code of content.querySelectorAll("pre > code")) {
      const over = code.scrollWidth - code.clientWidth;
      if (over <= 1) continue;
      const diagram = code.closest(".diagram") !== null;
      if (diagram || !scrolls(code)) {
        const lines = code.textContent.split("\\n");
        cut.push({kind: diagram ? "diagram" : "code", over,
                  cols: Math.max(...lines.map((l) => l.length)), first: lines[0].slice(0, 60)});
      }
    }
    for (const wrap of content.querySelectorAll(".md-typeset__scrollwrap")) {
      const over = wrap.scrollWidth - wrap.clientWidth;
      if (over > 1 && (width >= 1400 || !scrolls(wrap))) {
        cut.push({kind: "table", over, head: wrap.querySelector("tr").textContent.slice(0, 80)});
      }
    }
    for (const el of content.querySelectorAll("img, svg")) {
      if (el.closest("button, .md-icon, .md-clipboard, a.headerlink")) continue;
      const right = el.getBoundingClientRect().right;
      if (right > edge + 1) cut.push({kind: el.tagName.toLowerCase(), over: right - edge});
    }
    results[width + " " + page] = cut;
    frame.remove();
  }
}
return results;
"""
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built (strict) into a temp dir."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    return out


def _pages(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.html")
        if p.name != "404.html" and not p.name.startswith(".")
    )


def test_no_page_hides_content_behind_a_horizontal_scrollbar(site, tmp_path: Path) -> None:
    need_chromium()
    root = site
    pages = _pages(root)
    assert "index.html" in pages and len(pages) > 20
    harness = root / "layout-harness.html"
    harness.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    script = MEASURE.replace("PAGES", json.dumps(pages)).replace("WIDTHS", json.dumps(WIDTHS))
    cut = measure(
        harness,
        script,
        width=1400,
        height=900,
        profile=tmp_path / "profile",
    )
    assert len(cut) == len(pages) * len(WIDTHS)
    problems = {where: found for where, found in cut.items() if found}
    assert not problems, json.dumps(problems, indent=1, ensure_ascii=False)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_home_page_diagram_fits(site, tmp_path: Path, width: int) -> None:
    need_chromium()
    root = site
    screenshot(
        (root / "index.html").as_uri(),
        tmp_path / f"docs-home-{width}.png",
        width=width,
        height=900,
        profile=tmp_path / "profile",
    )
    page = root / "index.html"
    drawn = measure(
        page,
        WAIT_FOR
        + """
const code = document.querySelector("article pre > code");  // the pipeline diagram
return {text: code.textContent.split("\\n")[0], scroll: code.scrollWidth,
        client: code.clientWidth};
""",
        width=width,
        height=900,
        profile=tmp_path / "profile",
    )
    assert drawn["text"].startswith("sweep config")
    assert drawn["scroll"] <= drawn["client"], drawn
