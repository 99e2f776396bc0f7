"""Restoring a workspace into a real container: hostile archives write nothing outside the
workspace, samples cannot see each other's workspaces, and what cannot be restored leaves the
sample unscored with its reason. Real Docker Engine, gradebook's sandbox image."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tarfile
from pathlib import Path

import pytest
import zstandard
from inspect_ai.util import sandbox
from test_workspace_archive import D, F, H, S, tar_of

from workspaces.archive import EXTRACT
from workspaces.record import STORE_KEY, SandboxRecord, WorkspaceRecord
from workspaces.restore import RESTORE_LABEL, STORES_ENV, Sandboxes
from workspaces.store import WorkspaceStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROW = ("scored", 1.0, "C", "scorer's verdict", "", "{}", 0.1)  # what a scorer returned

HOSTILE = [
    ("work/ws", D, b"", 0o755),
    ("work/ws/ok.txt", F, b"ok"),
    ("/work/abs.txt", F, b"absolute"),
    ("work/ws/../dotdot.txt", F, b"dotdot"),
    ("work/outside.txt", F, b"outside the workspace root"),
    ("work/ws/up", S, "../../etc"),
    ("work/ws/up2", S, "/work"),
    ("work/ws/hard", H, "work/outside.txt"),
    ("work/ws/hard2", H, "etc/passwd"),
    ("work/ws/tty", tarfile.CHRTYPE, b""),
    ("work/ws/pipe", tarfile.FIFOTYPE, b""),
    ("work/ws/suid", F, b"#!/bin/sh\necho root\n", 0o4755),
]
# what a container holds under /work afterwards: only the workspace's benign files
CLEAN = ["/work/ws d 755", "/work/ws/ok.txt f 644", "/work/ws/suid f 755"]


def state_of(store: Path, raw: bytes, *, paths=("/work/ws",), name="default", **extra) -> str:
    """A sample's state (as the scoring stage hands it over) whose record names `raw`, stored
    as it is: no capture made it canonical, as if someone had replaced the object."""
    digest = hashlib.sha256(raw).hexdigest()
    WorkspaceStore(store).put(raw, digest)
    box = {"name": name, "status": "captured", "paths": list(paths), "workdir": "/work",
           "digest": digest, "bytes": len(raw), **extra}  # fmt: skip
    record = WorkspaceRecord(store=str(store), sandboxes=[SandboxRecord(**box)])
    return json.dumps({"store": {STORE_KEY: record.model_dump(mode="json")}})


async def run_in(boxes: Sandboxes, *commands: list[str], name: str | None = None) -> list:
    """Each command's result in the sample's sandbox, then the sample is closed."""
    try:
        with boxes.provided():
            return [await sandbox(name).exec(c) for c in commands]
    finally:
        await boxes.aclose()


def listing(result) -> list[str]:
    return sorted(result.stdout.split("\n")[:-1])


FIND = ["find", "/work", "-mindepth", "1", "-printf", "%p %y %m\\n"]


def test_a_hostile_archive_writes_nothing_outside_the_workspace(docker_sandbox, tmp_path):
    boxes = Sandboxes(state_of(tmp_path / "store", tar_of(*HOSTILE)))
    (found,) = asyncio.run(run_in(boxes, FIND))
    assert listing(found) == CLEAN
    skipped = {line.split(" (")[0] for line in boxes.evidence.restored["default"]["skipped"]}
    # all but the dir, ok.txt and suid, whose set-uid bit went ("*")
    assert skipped == {m[0] for m in HOSTILE[2:-1]} | {"*"}
    assert boxes.settle(ROW)[:5] == ROW[:5]  # the scorer's verdict stands


def test_the_extractor_in_the_container_refuses_the_same_archive_on_its_own(
    docker_sandbox, tmp_path
):
    # the host's canonical form is the first line; the extractor inside checks again
    boxes = Sandboxes(None)  # a fresh container (nothing captured)
    setup = ["sh", "-c", "mkdir -p /work/ws"]
    extract = ["python3", "-I", "-S", "-c", EXTRACT, "/work/ws"]

    async def go():
        try:
            with boxes.provided():
                await sandbox().exec(setup)
                done = await sandbox().exec(extract, input=tar_of(*HOSTILE), cwd="/")
                return done, await sandbox().exec(FIND)
        finally:
            await boxes.aclose()

    done, found = asyncio.run(go())
    assert done.success, done.stderr
    # the device file and FIFO are skipped, links pointing outside too; the set-uid bit goes
    assert listing(found) == CLEAN


# links whose targets read as text stay inside /work/repo, but that the kernel follows out
CHAIN = [
    ("work/repo/a/b/c", D, b""),
    ("work/repo/a/b/c/U", S, "../../.."),  # /work/repo itself: kept
    ("work/repo/K", S, "a/b/c/U/../.."),  # U, then up twice: /
    ("work/repo/lib/y.py", F, b"Y = 2\n"),
    ("work/repo/via", S, "a/b/c/U/lib/y.py"),  # through U, inside: kept
    ("work/repo/gone", S, "missing/file.py"),  # dangling, inside: kept
    ("work/repo/here", S, "."),
    ("work/repo/N", S, "here/../.."),  # here, then up: /work
    ("work/repo/l1", S, "l2"),
    ("work/repo/l2", S, "l1"),  # a loop
    ("work/repo/m/x", S, ".."),  # made through `m` when `m` came first: the root's parent
    ("work/repo/m", S, "."),
]
# every link left in /work/repo, and where the kernel in the container resolves it
LINKS = ["find", "/work/repo", "-type", "l", "-printf", "%p ", "-exec", "readlink", "-m", "{}", ";"]
KEPT_LINKS = [
    "/work/repo/a/b/c/U /work/repo",
    "/work/repo/gone /work/repo/missing/file.py",
    "/work/repo/here /work/repo",
    "/work/repo/m /work/repo",
    "/work/repo/via /work/repo/lib/y.py",
]


def test_a_link_the_kernel_follows_out_of_the_workspace_is_not_restored_and_is_named(
    docker_sandbox, tmp_path
):
    boxes = Sandboxes(state_of(tmp_path / "store", tar_of(*CHAIN), paths=("/work/repo",)))
    found, chain, via = asyncio.run(
        run_in(boxes, LINKS, ["readlink", "-f", "/work/repo/K"], ["cat", "/work/repo/via"])
    )
    assert listing(found) == KEPT_LINKS
    assert chain.stdout == "/work/repo/K\n"  # not there: `/` when it was made
    assert via.stdout == "Y = 2\n"
    assert sorted(boxes.evidence.restored["default"]["skipped"]) == [
        "work/repo/K (symbolic link pointing outside)",
        "work/repo/N (symbolic link pointing outside)",
        "work/repo/l1 (symbolic link loop (more than 40 links to follow))",
        "work/repo/l2 (symbolic link loop (more than 40 links to follow))",
        "work/repo/m/x (below a symbolic link)",
    ]


def test_the_extractor_in_the_container_follows_links_through_the_archive_on_its_own(
    docker_sandbox, tmp_path
):
    boxes = Sandboxes(None)  # a fresh container, the raw archive: no host check before
    setup = ["sh", "-c", "mkdir -p /work/repo"]
    extract = ["python3", "-I", "-S", "-c", EXTRACT, "/work/repo"]

    async def go():
        try:
            with boxes.provided():
                await sandbox().exec(setup)
                done = await sandbox().exec(extract, input=tar_of(*CHAIN), cwd="/")
                return done, await sandbox().exec(LINKS)
        finally:
            await boxes.aclose()

    done, found = asyncio.run(go())
    assert done.success, done.stderr
    assert listing(found) == KEPT_LINKS


def test_no_sample_can_read_another_samples_workspace(docker_sandbox, tmp_path):
    store = tmp_path / "store"
    a = Sandboxes(state_of(store, tar_of(("work/ws/marker", F, b"MARKER-A-7f3e"))))
    b = Sandboxes(state_of(store, tar_of(("work/ws/marker", F, b"MARKER-B-91c2"))))
    look = [
        "sh",
        "-c",
        "cat /work/ws/marker; echo; grep -rlsE 'MARKER-(A|B)' /work /tmp /var/tmp /run /home; "
        f"test -e {store} && echo STORE-VISIBLE; test -e /var/run/docker.sock && echo DOCKER; "
        "true",
    ]

    async def both():
        return await asyncio.gather(run_in(a, look), run_in(b, look))

    (seen_a,), (seen_b,) = asyncio.run(both())
    assert seen_a.stdout.split() == ["MARKER-A-7f3e", "/work/ws/marker"]
    assert seen_b.stdout.split() == ["MARKER-B-91c2", "/work/ws/marker"]


def test_an_archive_inflating_past_its_cap_is_refused_and_the_sample_unscored(
    docker_sandbox, tmp_path
):
    store = WorkspaceStore(tmp_path / "store")
    digest = "cd" * 32
    path = store.path(digest)
    path.parent.mkdir(parents=True)
    with path.open("wb") as f, zstandard.ZstdCompressor().stream_writer(f) as writer:
        for _ in range(200):  # 200 MiB of zeros, past the 64 MiB cap
            writer.write(b"\0" * (1 << 20))
    record = WorkspaceRecord(
        store=str(store.root),
        sandboxes=[
            SandboxRecord(name="default", status="captured", paths=["/work"], digest=digest)
        ],  # fmt: skip
    )
    boxes = Sandboxes(json.dumps({"store": {STORE_KEY: record.model_dump(mode="json")}}))
    with pytest.raises(Exception, match="inflates past its cap"):
        asyncio.run(run_in(boxes, ["true"]))
    status, value, _, explanation, reason, meta, _ = boxes.settle(ROW)
    assert (status, value, reason) == ("unscored", None, "workspace_unusable")
    assert "inflates past its cap" in explanation
    assert json.loads(meta)["sandbox"]["calls"][0]["error"]


def test_a_replaced_object_is_refused(docker_sandbox, tmp_path):
    state = state_of(tmp_path / "store", tar_of(("work/ws/a", F, b"a")))
    record = json.loads(state)["store"][STORE_KEY]
    # the object under that digest now holds something else
    WorkspaceStore(tmp_path / "store").path(record["sandboxes"][0]["digest"]).write_bytes(
        zstandard.ZstdCompressor().compress(tar_of(("work/ws/a", F, b"evil")))
    )
    boxes = Sandboxes(state)
    with pytest.raises(Exception, match="does not match its digest"):
        asyncio.run(run_in(boxes, ["true"]))
    assert boxes.settle(ROW)[4] == "workspace_unusable"


def test_a_store_that_moved_is_missing_until_named(docker_sandbox, tmp_path, monkeypatch):
    state = state_of(tmp_path / "store", tar_of(("work/ws/a", F, b"here")))
    (tmp_path / "store").rename(tmp_path / "moved")
    boxes = Sandboxes(state)
    with pytest.raises(Exception, match="is in none of the stores"):
        asyncio.run(run_in(boxes, ["true"]))
    unscored = boxes.settle(ROW)
    assert unscored[4] == "workspace_missing"
    assert STORES_ENV in unscored[3]
    monkeypatch.setenv(STORES_ENV, str(tmp_path / "moved"))
    (found,) = asyncio.run(run_in(Sandboxes(state), ["cat", "/work/ws/a"]))
    assert found.stdout == "here"


def test_a_failed_capture_leaves_the_sample_unscored_with_its_reason(tmp_path):
    record = WorkspaceRecord(
        store=str(tmp_path),
        sandboxes=[SandboxRecord(name="default", status="failed", paths=["/work"],
                                 error="the workspace is larger than its cap of 1048576 bytes")],
    )  # fmt: skip
    boxes = Sandboxes(json.dumps({"store": {STORE_KEY: record.model_dump(mode="json")}}))

    async def scorer_that_swallows_errors():
        # a scorer that catches everything and grades INCORRECT: the result is still unscored
        try:
            with boxes.provided():
                await sandbox().exec(["true"])
        except Exception:  # noqa: BLE001
            return ("scored", 0.0, "I", "tests failed", "", "{}", 0.1)
        finally:
            await boxes.aclose()

    row = boxes.settle(asyncio.run(scorer_that_swallows_errors()))
    assert row[0] == "unscored" and row[4] == "workspace_not_captured"
    assert "larger than its cap" in row[3]


def test_a_container_is_removed_also_when_the_scorer_is_cancelled_while_it_starts(
    docker_sandbox, tmp_path
):
    import docker

    from scorers.sandbox.pool import OWNER_LABEL, owner_label

    boxes = Sandboxes(state_of(tmp_path / "store", tar_of(("work/ws/a", F, b"a"))))

    async def cancelled():
        try:
            with boxes.provided():
                await asyncio.wait_for(sandbox().exec(["sleep", "60"]), timeout=0.05)
        except TimeoutError:
            pass
        finally:
            await boxes.aclose()

    asyncio.run(cancelled())
    left = docker.from_env().api.containers(  # labels in the listing: no inspect to 404
        all=True, filters={"label": [f"{RESTORE_LABEL}=restore", f"{OWNER_LABEL}={owner_label()}"]}
    )
    assert left == []
