"""Where a workspace's symbolic links really lead: followed through the tree being restored.

A link's target read as text says little: `K -> a/b/c/U/../..` looks like a path inside the
workspace, yet when `U` is itself a link to `../../..` the kernel follows `U` first and the
`..` after it climb out of the workspace. So a link is kept only when both readings stay inside
its own workspace root:

- as text: its target is relative and, joined to the link's directory and normalised, lies
  under the root;
- as the kernel follows it: component by component from the link's directory, each component
  that is a link of the same tree followed first (at most MAX_HOPS links in all, the link
  itself included, as Linux counts them), `..` going to the parent of where that leaves it; no
  step may leave the root, not even one that comes back in. A component the tree does not
  hold (a dangling link's target, a directory made later) is taken as a plain directory, so a
  link kept here stays inside also once such a directory exists.

Only links matter for where a path leads: files, directories and missing paths are all plain
components. So the tree is just its links (path -> target), all of the archive's, those refused
too: a link that leads through a refused one is refused with it, and so leaving the refused
ones out changes where no kept link leads. A link below another one is refused (the restore
would make it through that link, elsewhere than its path says).

Each link is walked once (where a link leads is kept for the links that meet it), one name at a
time down a tree of names: the work is linear in the targets' length, also for a hostile
archive of 20,000 links.

Paths and roots are given the way the caller writes them, relative to / (`work/repo/K`, the
archive's form) or absolute (`/work/repo/K`, the extractor's), without a trailing slash.

This file's source is also run as it is inside the restore container, before the extractor's
own lines (`workspaces.archive.EXTRACT`): the standard library only, nothing from gradebook,
and nothing here may assume a Python newer than the sandbox image's.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only, never evaluated: an image's older python3 runs this too
    from collections.abc import Generator, Iterable, Mapping, Sequence

    # where a link leads: (the place, links followed) when it stays inside, else (None, 0, why)
    _Leads = tuple["_Place | None", int, str]

MAX_HOPS = 40  # links followed to reach where a link leads: itself and every nested one
MAX_TARGET = 4096  # characters in a link's target, and in a path it resolves to (PATH_MAX)

OUTSIDE = "symbolic link pointing outside"
BELOW = "below a symbolic link"
LOOP = f"symbolic link loop (more than {MAX_HOPS} links to follow)"
TOO_LONG = "symbolic link resolving to a path too long"


def root_of(path: str, roots: Sequence[str]) -> str | None:
    """The root `path` lies under (or is), if any."""
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return root
    return None


def inside_as_text(path: str, target: str, root: str) -> bool:
    """Whether a link at `path` whose target is `target`, read as text, stays under `root`:
    a relative target, normalised from the link's own directory."""
    if not target or target.startswith("/") or "\x00" in target or len(target) > MAX_TARGET:
        return False
    if not path.startswith(root + "/"):
        return False  # a link at the root itself: the root is a directory the restore makes
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved == root or resolved.startswith(root + "/")


def refused(links: Mapping[str, str], roots: Sequence[str]) -> dict[str, str]:
    """The links of a tree that do not stay inside their root, read either way, and why.

    Args:
        links: the tree's symbolic links, path -> target.
        roots: the workspace roots, written as the paths are.

    Returns:
        path -> why, sorted by path, for each link to leave out (OUTSIDE, LOOP, TOO_LONG, or
        BELOW: a link below another link would be made through it, elsewhere than its path).
    """
    tree = _Node()
    for path in links:
        node = tree
        for name in path.split("/"):
            node = node.below.setdefault(name, _Node())
        node.link = path
    # no walk looks these up: it follows the link above them first
    leads: dict[str, _Leads] = {path: (None, 0, BELOW) for path in _below_a_link(links)}
    for path in sorted(links):
        if path not in leads:
            _resolve(path, _Tree(links, tree, roots), leads)
    return {path: leads[path][2] for path in sorted(links) if leads[path][2]}


class _Node:
    """A path of the tree: the names below it, and the link it is, if one."""

    __slots__ = ("below", "link")

    def __init__(self) -> None:
        self.below: dict[str, _Node] = {}
        self.link: str | None = None


class _Tree:
    """The links by path, the same as nested names (a walk steps down one name at a time)."""

    def __init__(self, links: Mapping[str, str], top: _Node, roots: Sequence[str]) -> None:
        self.links, self.top, self.roots = links, top, roots


class _Place:
    """Where a walk stands: its path's names, the tree's node for each (None past the last
    one the tree holds) and the path's length in characters."""

    __slots__ = ("names", "nodes", "size")

    def __init__(self, names: list[str], nodes: list[_Node | None], size: int) -> None:
        self.names, self.nodes, self.size = names, nodes, size

    @classmethod
    def of(cls, path: str, tree: _Tree) -> _Place:
        names = path.split("/")
        nodes: list[_Node | None] = []
        node: _Node | None = tree.top
        for name in names:
            node = node.below.get(name) if node is not None else None
            nodes.append(node)
        return cls(names, nodes, len(path))

    def copy(self) -> _Place:
        return _Place(list(self.names), list(self.nodes), self.size)

    def down(self, name: str) -> _Node | None:
        above = self.nodes[-1]
        node = above.below.get(name) if above is not None else None
        self.names.append(name)
        self.nodes.append(node)
        self.size += 1 + len(name)
        return node

    def up(self) -> None:
        self.size -= 1 + len(self.names.pop())
        self.nodes.pop()


def _below_a_link(paths: Iterable[str]) -> set[str]:
    """The paths that lie below another of them: sorted by component, those below a path
    follow it at once."""
    below: set[str] = set()
    last = None
    for path in sorted(paths, key=lambda p: p.split("/")):
        if last is not None and path.startswith(last + "/"):
            below.add(path)
        else:
            last = path
    return below


def _resolve(start: str, tree: _Tree, leads: dict[str, _Leads]) -> None:
    """Where `start` leads, and each link it meets on the way, into `leads`. Each link is
    walked once, on an explicit stack (a chain of 20,000 links would overflow Python's)."""
    stack = [(start, _walk(start, tree))]
    pending = {start}
    answer: _Leads | None = None
    while stack:
        name, walk = stack[-1]
        try:
            need = walk.send(answer)  # type: ignore[arg-type]
        except StopIteration as end:
            leads[name] = answer = end.value
            pending.discard(name)
            stack.pop()
            continue
        if need in leads:
            answer = leads[need]
        elif need in pending:
            answer = (None, 0, LOOP)  # a link met again while it is being followed: a cycle
        else:
            pending.add(need)
            stack.append((need, _walk(need, tree)))
            answer = None


def _walk(path: str, tree: _Tree) -> Generator[str, _Leads, _Leads]:
    """Follows the link at `path` component by component; yields each link it meets and is
    sent where that one leads."""
    target = tree.links[path]
    root = root_of(path, tree.roots)
    if root is None or not inside_as_text(path, target, root):
        return None, 0, OUTSIDE
    top = root.count("/") + 1  # names in the root's path: a `..` there leaves it
    here = _Place.of(posixpath.dirname(path), tree)
    hops = 1  # this link: opening it follows it, as a link met on the way is followed
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if len(here.names) == top:
                return None, 0, OUTSIDE
            here.up()
            continue
        node = here.down(part)
        if here.size > MAX_TARGET:
            return None, 0, TOO_LONG
        if node is not None and node.link is not None:
            there, more, why = yield node.link
            if there is None:
                return None, 0, why
            hops += more
            if hops > MAX_HOPS:
                return None, 0, LOOP
            here = there.copy()
    return here, hops, ""
