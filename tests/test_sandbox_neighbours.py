"""Another gradebook on the same Docker Engine: a checkout's scorer, another test run, a CI job.

Its sandbox pool starts and removes labelled containers all the time. Nothing here may trip
over that (a container listed and gone a moment later is not an error), and nothing here may
remove its containers while their owner runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import docker_kit
import pytest
from process_kit import wait_for

from scorers.sandbox.image import image_tag, sandbox_users
from scorers.sandbox.pool import (
    SandboxLimits,
    SandboxPool,
    _pid_namespace,
    create_container,
    owner_label,
    reap_orphans,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# What another checkout's scorer does: a pool per command (each new pool reaps orphans first),
# submissions that time out (their container is destroyed and replaced), the pool closed.
NEIGHBOUR = """
import sys
from scorers.sandbox.pool import SandboxPool
LOOP = "def f(x):\\n    while True:\\n        pass\\n"
cycle = 0
while True:
    with SandboxPool(concurrency=2) as pool:
        print("owner", pool.containers_owner, flush=True)
        for _ in range(2):
            outcome = pool.run_tests(LOOP, "assert f(1) == 1\\n", entry_point="f", timeout_s=0.5)
            print("status", outcome.status, outcome.detail[:200], flush=True)
    cycle += 1
    print("cycle", cycle, flush=True)
"""


class Neighbour:
    """The other gradebook, as a process of its own; what it printed, line by line."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def cycles(self) -> int:
        assert self.proc.poll() is None, f"the neighbour died: {self.lines[-5:]}"
        return sum(line.startswith("cycle ") for line in self.lines)

    def owners(self) -> set[str]:
        return {line.split(" ", 1)[1] for line in self.lines if line.startswith("owner ")}

    def statuses(self) -> list[str]:
        return [line.split(" ", 1)[1] for line in self.lines if line.startswith("status ")]


@pytest.fixture
def neighbour(docker_sandbox) -> Iterator[Neighbour]:
    import docker

    other = Neighbour()
    try:
        wait_for(lambda: other.cycles() >= 1, 300, "the neighbour's first pool cycle")
        yield other
    finally:
        other.proc.kill()  # its lifelines close with it: its containers end by themselves
        other.proc.wait()
        docker_kit.wait_gone_after_kill(docker.from_env(), other.owners(), 60)


def test_pools_start_reap_and_isolate_while_a_neighbour_churns_containers(neighbour):
    import docker

    client = docker.from_env()
    # Reap all the while the neighbour starts and removes containers: each listing sees some
    # that are gone by the time they are looked at.
    until = neighbour.cycles() + 3
    reaps = 0
    while neighbour.cycles() < until:
        reap_orphans(client)
        reaps += 1
    assert reaps > 0
    # and a new pool (which reaps too) does its work: nothing of one run reaches the next
    with SandboxPool(concurrency=1) as pool:
        first = pool.run_tests(
            "open('/work/planted', 'w').write('x')\ndef probe(x):\n    return x\n",
            "assert probe(1) == 1\n",
            entry_point="probe",
        )
        second = pool.run_tests(
            "import os\nprint('FILES', sorted(os.listdir('/work')))\ndef probe(x):\n    return x\n",
            "assert probe(1) == 1\n",
            entry_point="probe",
        )
    assert first.passed and second.passed, (first, second)
    assert "FILES ['.gradebook-output']" in second.output, second.output
    # none of the neighbour's live containers was taken from it: every one of its runs was
    # ended by its own time limit, none by a sandbox error
    statuses = neighbour.statuses()
    assert statuses and all(s.startswith("timeout") for s in statuses), statuses


def test_the_suites_host_check_holds_while_a_neighbour_churns_containers(neighbour):
    import docker

    client = docker.from_env()
    until = neighbour.cycles() + 2
    while neighbour.cycles() < until:
        assert docker_kit.sandbox_processes_outside_containers(client) == []


def _owners() -> dict[str, tuple[str, str]]:
    """(owner label, its pid namespace) of each kind of owner a reaper may meet."""
    host, pid, ns = socket.gethostname(), os.getpid(), _pid_namespace()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return {
        "this process": (owner_label(), ns),
        # the pid runs, but it is not the process that started the container: that one is gone
        "a recycled pid": (f"{host}:{pid}:1", ns),
        "a process that is gone": (f"{host}:{gone.pid}:1", ns),
        # numbered in another pid namespace (a CI job in a container sharing the Engine and
        # the hostname): its pid says nothing about a process here
        "another pid namespace": (f"{host}:{gone.pid}:1", f"{ns}0"),
        "another host": (f"not-{host}:{gone.pid}:1", ns),
    }


REAPED = {
    "this process": False,
    "a recycled pid": True,
    "a process that is gone": True,
    "another pid namespace": False,
    "another host": False,
}


@pytest.mark.parametrize("owner", sorted(REAPED))
def test_which_owners_containers_a_reaper_removes(docker_sandbox, owner):
    import docker

    client = docker.from_env()
    label, ns = _owners()[owner]
    uid = sandbox_users().harness_uid
    live = create_container(
        client, image_tag(), SandboxLimits(), user=f"{uid}:{uid}", owner=label, pid_namespace=ns
    )
    try:
        assert live.id in docker_kit.owned(client, [label])
        reap_orphans(client)
        if REAPED[owner]:
            # gone, or going: another session's reaper may be removing it at the same moment
            # (then this one's removal is refused with a conflict); nothing else would end it
            wait_for(lambda: live.id not in docker_kit.owned(client, [label]), 60, "removal")
        else:
            assert live.id in docker_kit.owned(client, [label])
    finally:
        live.remove()
