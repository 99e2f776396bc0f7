"""Workspace archives are hostile input: what `canonical` keeps and refuses, and a store that
hands back only what hashes to its address. Pure, no Docker (the in-container restore of the
same hostile archives is tests/test_workspace_restore.py)."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import posixpath
import random
import tarfile
import tracemalloc

import pytest
import zstandard

from workspaces.archive import (
    ArchiveError,
    ArchiveTooLarge,
    canonical,
    check_roots,
)
from workspaces.store import ObjectMissing, ObjectUnusable, WorkspaceStore

MiB = 1024 * 1024


def tar_of(*members: tuple, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar of (name, kind, data-or-linkname, mode, mtime, uid) members, written as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, kind, payload, *rest in members:
            info = tarfile.TarInfo(name)
            info.mode = rest[0] if rest else 0o644
            info.mtime = rest[1] if len(rest) > 1 else 1_700_000_000
            info.uid = rest[2] if len(rest) > 2 else 1000
            info.type = kind
            data = None
            if kind == tarfile.REGTYPE:
                data = io.BytesIO(payload)
                info.size = len(payload)
            elif kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = payload
            tar.addfile(info, data)
    return buf.getvalue()


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar}


F, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("/work/abs.txt", F, b"x"), "absolute path"),
        (("/etc/cron.d/evil", F, b"x"), "absolute path"),
        (("work/../etc/evil", F, b"x"), "'..' in path"),
        (("work/a/../../../evil", F, b"x"), "'..' in path"),
        (("etc/passwd", F, b"x"), "outside the workspace"),
        (("work/up", S, "../../etc"), "symbolic link pointing outside"),
        (("work/abs", S, "/etc/passwd"), "symbolic link pointing outside"),
        (("work/hard", H, "etc/shadow"), "hard link to a file not in the workspace"),
        (("work/hard2", H, "/etc/shadow"), "hard link to a file not in the workspace"),
        (("work/tty", tarfile.CHRTYPE, b""), "device file"),
        (("work/disk", tarfile.BLKTYPE, b""), "device file"),
        (("work/pipe", tarfile.FIFOTYPE, b""), "FIFO"),
    ],
)
def test_a_hostile_member_is_left_out_and_named(member: tuple, why: str) -> None:
    data = tar_of(("work", D, b"", 0o755), ("work/ok.py", F, b"print(1)\n"), member)
    result = canonical(data, ["/work"])
    kept = members(result.data)
    assert sorted(kept) == ["work", "work/ok.py"]
    assert [(s.path, s.why) for s in result.skipped] == [(member[0], why)]


def test_links_inside_the_workspace_are_kept_and_a_hard_link_becomes_a_copy() -> None:
    data = tar_of(
        ("work/src/a.py", F, b"A = 1\n"),
        ("work/src/b.py", S, "a.py"),
        ("work/up", S, "src/a.py"),
        ("work/copy.py", H, "work/src/a.py"),
    )
    kept = members(canonical(data, ["/work"]).data)
    assert kept["work/src/b.py"].issym() and kept["work/src/b.py"].linkname == "a.py"
    assert kept["work/up"].issym()
    assert kept["work/copy.py"].isreg() and kept["work/copy.py"].size == 6


def test_nothing_is_kept_below_a_symbolic_link() -> None:
    # a link to a directory inside, then a file "through" it: extracting it would write
    # through the link
    data = tar_of(("work/d", D, b""), ("work/l", S, "d"), ("work/l/x", F, b"through"))
    result = canonical(data, ["/work"])
    assert "work/l/x" not in members(result.data)
    assert ("work/l/x", "below a symbolic link") in [(s.path, s.why) for s in result.skipped]


# Links whose target, read as text, stays inside the workspace, but which the kernel follows
# out of it, through the archive's own links (a link is resolved first, then the `..` after it).
OUT = "symbolic link pointing outside"
LOOP = "symbolic link loop (more than 40 links to follow)"
ABC = ("work/repo/a/b/c", D, b"")
U = ("work/repo/a/b/c/U", S, "../../..")  # the workspace root itself: kept

ESCAPES = {
    "through a link to the root": (
        [ABC, U, ("work/repo/K", S, "a/b/c/U/../..")],
        [("work/repo/K", OUT)],
    ),
    "through a chain of links": (
        [
            ("work/repo/d/e/f", D, b""),
            ("work/repo/d/e/f/up", S, "../.."),  # work/repo/d
            ("work/repo/d/up2", S, "e/f/up/.."),  # work/repo
            ("work/repo/K", S, "d/up2/.."),  # work
        ],
        [("work/repo/K", OUT)],
    ),
    "a link to a link that escapes": (
        [ABC, U, ("work/repo/X", S, "a/b/c/U/.."), ("work/repo/Y", S, "X")],
        [("work/repo/X", OUT), ("work/repo/Y", OUT)],
    ),
    "'..' after a link to '.'": (
        [("work/repo/here", S, "."), ("work/repo/N", S, "here/..")],
        [("work/repo/N", OUT)],
    ),
    "out of the root and back in": (
        [("work/repo/src/a.py", F, b"A"), ("work/repo/src/x", S, "../../repo/src/a.py")],
        [("work/repo/src/x", OUT)],
    ),
    "a loop": (
        [("work/repo/l1", S, "l2"), ("work/repo/l2", S, "l1")],
        [("work/repo/l1", LOOP), ("work/repo/l2", LOOP)],
    ),
    "a link to itself": ([("work/repo/me", S, "me/..")], [("work/repo/me", LOOP)]),
    "41 links to follow": (
        [("work/repo/end", D, b"")]
        + [(f"work/repo/l{i:02}", S, f"l{i + 1:02}" if i < 40 else "end") for i in range(41)],
        [("work/repo/l00", LOOP)],  # Linux follows 40 at most: l01 (40 links) still opens
    ),
}


@pytest.mark.parametrize(("tree", "refused"), ESCAPES.values(), ids=ESCAPES.keys())
def test_a_link_the_kernel_follows_out_of_the_workspace_is_left_out_and_named(
    tree: list[tuple], refused: list[tuple[str, str]]
) -> None:
    result = canonical(tar_of(*tree), ["/work/repo"])
    assert [(s.path, s.why) for s in result.skipped] == refused
    # every other member is kept, the links it went through included
    assert sorted(members(result.data)) == sorted({m[0] for m in tree} - {p for p, _ in refused})


def test_only_the_links_that_really_stay_inside_are_kept() -> None:
    data = tar_of(
        ABC,
        U,  # to the root itself
        ("work/repo/K", S, "a/b/c/U/../.."),  # the root's parent
        ("work/repo/src/deep/x.py", F, b"X = 1\n"),
        ("work/repo/lib/y.py", F, b"Y = 2\n"),
        ("work/repo/src/deep/y.py", S, "../../lib/y.py"),  # up and back down, inside
        ("work/repo/alias.py", S, "src/deep/y.py"),  # a link to a link, inside
        ("work/repo/via", S, "a/b/c/U/lib/y.py"),  # through the link to the root, inside
        ("work/repo/gone", S, "missing/file.py"),  # dangling, inside
        ("work/repo/later", S, "not_yet/../lib/y.py"),  # through a directory not there
        ("work/repo/abs", S, "/work/repo/lib/y.py"),  # absolute, though it names a path inside
    )
    result = canonical(data, ["/work/repo"])
    kept = members(result.data)
    links = {p: m.linkname for p, m in kept.items() if m.issym()}
    assert links == {
        "work/repo/a/b/c/U": "../../..",
        "work/repo/src/deep/y.py": "../../lib/y.py",
        "work/repo/alias.py": "src/deep/y.py",
        "work/repo/via": "a/b/c/U/lib/y.py",
        "work/repo/gone": "missing/file.py",
        "work/repo/later": "not_yet/../lib/y.py",
    }
    assert sorted((s.path, s.why) for s in result.skipped) == [
        ("work/repo/K", OUT),
        ("work/repo/abs", OUT),
    ]


def test_every_link_kept_is_followed_by_the_kernel_to_a_path_inside(tmp_path) -> None:
    # random trees of links (fixed seed) restored into a directory: the kernel itself follows
    # each link that was kept, and none leads out
    rng = random.Random(38)
    dirs = ["", "a", "a/b", "a/b/c", "d", "d/e"]
    words = ["..", "..", ".", "a", "b", "c", "d", "e", "f", "zz", *[f"l{i}" for i in range(6)]]
    refused_as_text_inside = kept_links = 0
    for trial in range(300):
        top = tmp_path / str(trial)
        tree = [(f"work/repo/{d}".rstrip("/"), D, b"") for d in dirs] + [("work/repo/a/f", F, b"")]
        links = {}
        for _ in range(8):
            where = rng.choice(dirs)
            path = f"work/repo/{where}/l{rng.randrange(6)}".replace("//", "/")
            links[path] = "/".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
        tree += [(p, S, t) for p, t in links.items()]
        kept = members(canonical(tar_of(*tree), ["/work/repo"]).data)
        for name, member in sorted(kept.items()):  # the restored tree: only what was kept
            (top / name).parent.mkdir(parents=True, exist_ok=True)
            if member.isdir():
                (top / name).mkdir(exist_ok=True)
            elif member.issym():
                (top / name).symlink_to(member.linkname)
            else:
                (top / name).touch()
        root = str(top / "work/repo")
        for path, target in links.items():
            if path not in kept:
                normal = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
                refused_as_text_inside += normal == "work/repo" or normal.startswith("work/repo/")
                continue
            kept_links += 1
            real = kernel_path(str(top / path))
            assert real == root or real.startswith(root + "/"), (path, target, links, real)
    # the trees were hostile enough, and not so hostile that nothing was kept
    assert refused_as_text_inside > 100 and kept_links > 1000


def kernel_path(path: str) -> str:
    """Where the kernel resolves `path`: its own answer when the path exists, else (a dangling
    link) Python's component-by-component emulation."""
    try:
        fd = os.open(path, os.O_PATH)
    except FileNotFoundError:
        return os.path.realpath(path)
    except OSError as exc:
        assert exc.errno != errno.ELOOP, f"{path}: {exc}"
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_a_member_that_came_before_a_link_of_its_parent_is_left_out_and_named() -> None:
    # in the workspace `m/x` would be made through the link `m` (to the root): `x`, `..` from
    # there, is the root's parent
    data = tar_of(("work/repo/m/x", S, ".."), ("work/repo/m/f", F, b"f"), ("work/repo/m", S, "."))
    result = canonical(data, ["/work/repo"])
    assert sorted(members(result.data)) == ["work/repo/m"]
    assert sorted((s.path, s.why) for s in result.skipped) == [
        ("work/repo/m/f", "below a symbolic link"),
        ("work/repo/m/x", "below a symbolic link"),
    ]


def test_setuid_setgid_and_sticky_bits_are_dropped() -> None:
    data = tar_of(
        ("work/suid", F, b"#!/bin/sh\n", 0o4755),
        ("work/sgid", F, b"x", 0o2644),
        ("work/dir", D, b"", 0o1777),
        ("work/plain", F, b"x", 0o600),
    )
    result = canonical(data, ["/work"])
    modes = {n: m.mode for n, m in members(result.data).items()}
    assert modes == {"work/dir": 0o755, "work/plain": 0o644, "work/sgid": 0o644, "work/suid": 0o755}
    assert any("set-uid" in s.why for s in result.skipped)


def test_only_the_declared_paths_are_kept() -> None:
    data = tar_of(("work/repo/a.py", F, b"a"), ("work/notes.txt", F, b"n"), ("tmp/x", F, b"x"))
    assert sorted(members(canonical(data, ["/work/repo"]).data)) == ["work/repo/a.py"]


def test_the_same_workspace_gives_the_same_digest_whatever_order_times_and_owners() -> None:
    one = tar_of(
        ("work/b.py", F, b"B", 0o644, 1_600_000_000, 10002),
        ("work/a.py", F, b"A", 0o755, 1_700_000_000, 10002),
    )
    other = tar_of(
        ("work/a.py", F, b"A", 0o775, 1_000, 0),
        ("work/b.py", F, b"B", 0o600, 2_000, 4242),
        fmt=tarfile.PAX_FORMAT,
    )
    first, second = canonical(one, ["/work"]), canonical(other, ["/work"])
    assert first.digest == second.digest == hashlib.sha256(first.data).hexdigest()
    # and a canonical archive is its own canonical form (restore checks it again)
    assert canonical(first.data, ["/work"]).data == first.data
    assert canonical(tar_of(("work/a.py", F, b"A2")), ["/work"]).digest != first.digest


def test_an_archive_past_its_cap_is_refused() -> None:
    big = tar_of(("work/big.bin", F, b"\0" * (2 * MiB)))
    with pytest.raises(ArchiveTooLarge):
        canonical(big, ["/work"], max_bytes=MiB)
    many = tar_of(*[(f"work/f{i}", F, b"") for i in range(50)])
    with pytest.raises(ArchiveTooLarge):
        canonical(many, ["/work"], max_members=20)


def test_a_header_claiming_gigabytes_is_refused_without_reading_them() -> None:
    # a PAX header whose size field claims 8 GiB, followed by a few bytes: tarfile would try to
    # read (and allocate) it; the bounded reader refuses before
    header = tarfile.TarInfo("work/x")
    header.size = 8 * 1024 * MiB
    forged = header.tobuf(tarfile.GNU_FORMAT) + b"\0" * 4096
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError):
            canonical(forged, ["/work"], max_bytes=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * MiB


def test_not_a_tar_archive_is_one_clear_error() -> None:
    with pytest.raises(ArchiveError, match="not a readable tar archive"):
        canonical(b"PK\x03\x04 this is a zip" * 100, ["/work"])


@pytest.mark.parametrize(
    ("roots", "match"),
    [
        (["work"], "not an absolute path"),
        (["/"], "the root or a system directory"),
        (["/etc"], "the root or a system directory"),
        (["/usr/lib/x"], "the root or a system directory"),
        (["/work", "/work/repo"], "overlap"),
        ([], "no workspace path"),
    ],
)
def test_workspace_paths_must_be_usable(roots: list[str], match: str) -> None:
    with pytest.raises(ArchiveError, match=match):
        check_roots(roots)


def test_the_store_keeps_each_archive_once_and_hands_back_only_what_hashes_to_its_address(
    tmp_path,
) -> None:
    store = WorkspaceStore(tmp_path / "store")
    archive = canonical(tar_of(("work/a.py", F, b"A" * 10_000)), ["/work"])
    size = store.put(archive.data, archive.digest)
    assert size < len(archive.data)  # compressed
    assert store.put(archive.data, archive.digest) == size  # deduplicated
    assert len(list((tmp_path / "store").rglob("*.tar.zst"))) == 1
    assert store.get(archive.digest, 64 * MiB) == archive.data

    # a replaced object: valid zstd, other content
    store.path(archive.digest).write_bytes(zstandard.ZstdCompressor().compress(b"other"))
    with pytest.raises(ObjectUnusable, match="does not match its digest"):
        store.get(archive.digest, 64 * MiB)
    store.path(archive.digest).write_bytes(b"not zstd at all")
    with pytest.raises(ObjectUnusable, match="not a zstd object"):
        store.get(archive.digest, 64 * MiB)
    with pytest.raises(ObjectMissing):
        store.get("0" * 64, 64 * MiB)
    with pytest.raises(ObjectUnusable, match="not a sha256"):
        store.get("../../etc/passwd", 64 * MiB)


def test_an_object_inflating_past_its_cap_is_refused_in_bounded_memory(tmp_path) -> None:
    store = WorkspaceStore(tmp_path / "store")
    digest = "ab" * 32
    path = store.path(digest)
    path.parent.mkdir(parents=True)
    # 256 MiB of zeros in a few kilobytes: a decompression bomb
    with path.open("wb") as f, zstandard.ZstdCompressor().stream_writer(f) as writer:
        chunk = b"\0" * MiB
        for _ in range(256):
            writer.write(chunk)
    assert path.stat().st_size < MiB
    tracemalloc.start()
    try:
        with pytest.raises(ObjectUnusable, match="inflates past its cap"):
            store.get(digest, 4 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * MiB
