"""MkDocs hook: the built site must load nothing from the network.

The site is read offline (opened from disk, or on a machine without internet), so every
script, stylesheet, font, image and frame it loads must be a file of the site itself. After
each build this scans the HTML and CSS it wrote and fails the build on any resource fetched
from another host. Links a reader may follow (`<a href="https://...">`) are not loads.

The theme's JavaScript loads two things from a CDN, only on demand: Mermaid, for a page with a
mermaid diagram (so a diagram fails the build too: draw diagrams as text), and a
ResizeObserver polyfill, for browsers that predate ResizeObserver.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

# (tag, attribute) pairs a browser fetches on its own while rendering the page
_LOADS = {
    ("script", "src"),
    ("link", "href"),
    ("img", "src"),
    ("img", "srcset"),
    ("source", "src"),
    ("source", "srcset"),
    ("iframe", "src"),
    ("video", "src"),
    ("video", "poster"),
    ("audio", "src"),
    ("embed", "src"),
    ("object", "data"),
}
_REMOTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
_CSS_REFS = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)


class _Loads(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.remote: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_style = tag == "style"
        for name, value in attrs:
            if value is None:
                continue
            if name == "class" and "mermaid" in value.split():
                self.remote.append(f"<{tag} class={value!r}> (the theme loads Mermaid from a CDN)")
            if (tag, name) in _LOADS and any(_REMOTE.match(v) for v in value.split(",")):
                self.remote.append(f"<{tag} {name}={value!r}>")
            if name == "style":
                self.remote += _css_remote(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.remote += _css_remote(data)


def _css_remote(css: str) -> list[str]:
    return [ref for m in _CSS_REFS.finditer(css) if _REMOTE.match(ref := m.group(1) or m.group(2))]


def remote_loads(site_dir: Path) -> list[str]:
    """Every `file: reference` of the built site that a browser would fetch from the network."""
    found: list[str] = []
    for path in sorted(site_dir.rglob("*")):
        if path.suffix == ".html":
            parser = _Loads()
            parser.feed(path.read_text(encoding="utf-8", errors="replace"))
            refs = parser.remote
        elif path.suffix == ".css":
            refs = _css_remote(path.read_text(encoding="utf-8", errors="replace"))
        else:
            continue
        found += [f"{path.relative_to(site_dir)}: {ref}" for ref in refs]
    return found


def on_post_build(config: Any, **kwargs: Any) -> None:
    remote = remote_loads(Path(config["site_dir"]))
    if remote:
        shown = "\n  ".join(remote[:20])
        raise PluginError(
            f"the site loads {len(remote)} resource(s) from the network (it must work offline):"
            f"\n  {shown}"
        )
