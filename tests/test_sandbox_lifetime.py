"""Sandbox containers never outlive the process that owns them, and the per-test wall-clock
limit holds inside the container when the host is not there to enforce it.

A real scorer process runs infinite-loop submissions on the real Docker Engine and is then
SIGKILLed (its containers must end within moments, not at the test's limit), or SIGSTOPped (it
is alive but enforces nothing: the container must end itself once the limit has passed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import docker_kit
import pytest
from process_kit import wait_for

from scorers.sandbox.pool import INSIDE_MARGIN_S

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SCORER = """
import sys, threading, time
from scorers.sandbox.pool import SandboxPool
pool = SandboxPool(concurrency=2)
# both containers warm before either test starts: on a loaded machine the second can take longer
# to start than the first test's limit, and the two would never run at the same time
while pool._idle.qsize() < 2:
    time.sleep(0.1)
print(pool.containers_owner, flush=True)
LOOP = "def f(x):\\n    while True:\\n        pass\\n"
def run():
    print(pool.run_tests(LOOP, "assert f(1) == 1\\n", entry_point="f",
                         timeout_s=float(sys.argv[1])).status, flush=True)
threads = [threading.Thread(target=run) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
"""


def owned(client, owner: str) -> list[str]:
    return docker_kit.owned(client, [owner])


@contextmanager
def scorer(timeout_s: float) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCORER, str(timeout_s)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def both_tests_running(client, owner: str) -> bool:
    mine = owned(client, owner)
    return len(mine) == 2 and all(docker_kit.running_submissions(client, c) >= 1 for c in mine)


def test_a_killed_scorers_containers_end_within_moments(docker_sandbox):
    import docker

    client = docker.from_env()
    limit_s = 300.0  # far beyond the wait below: the containers must not wait for it
    with scorer(limit_s) as (proc, owner):
        wait_for(lambda: both_tests_running(client, owner), 120, "two infinite loops running")
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for(lambda: not owned(client, owner), 30, "the killed scorer's containers gone")
        assert time.monotonic() - killed_at < limit_s


def test_the_test_limit_holds_inside_the_container_without_its_host(docker_sandbox):
    import docker

    client = docker.from_env()
    # long enough for this test to see both loops running on a loaded machine (it polls
    # `docker top`), short enough to wait for the in-container limit
    limit_s = 20.0
    with scorer(limit_s) as (proc, owner):
        wait_for(lambda: both_tests_running(client, owner), 120, "two infinite loops running")
        # alive (its lifeline stays open) but enforcing nothing: the containers end themselves
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: not owned(client, owner),
                limit_s + INSIDE_MARGIN_S + 30,
                "containers gone after the in-container limit",
            )
            assert proc.poll() is None, "the host process was meant to be alive"
        finally:
            os.kill(proc.pid, signal.SIGCONT)


# What a scorer killed between Docker's create and start leaves: it dies before the start call.
CREATED_THEN_KILLED = """
import docker, os
from scorers.sandbox.image import image_tag, sandbox_users
from scorers.sandbox.pool import LABEL, OWNER_LABEL, PIDNS_LABEL, _PID_NAMESPACE, _WATCHDOG
from scorers.sandbox.pool import owner_label
uid = sandbox_users().harness_uid
cid = docker.from_env().api.create_container(
    image_tag(), _WATCHDOG, user=f"{uid}:{uid}", stdin_open=True,
    labels={LABEL: "1", OWNER_LABEL: owner_label(), PIDNS_LABEL: _PID_NAMESPACE},
)["Id"]
print(owner_label(), cid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_container_its_owner_never_started_is_removed_by_the_next_pool(docker_sandbox):
    import docker

    from scorers.sandbox.pool import SandboxPool

    client = docker.from_env()
    killed = subprocess.run(
        [sys.executable, "-c", CREATED_THEN_KILLED], capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    owner, cid = killed.stdout.split()
    try:
        # no lifeline ever reached it: nothing but a reaper ends a container that never started
        assert docker_kit.states(client, [owner]) == {cid: "created"}
        with SandboxPool(concurrency=1):
            pass
        # gone, or going: another session's reaper may be removing it at the same moment
        wait_for(lambda: not owned(client, owner), 60, "the never-started container removed")
    finally:
        try:
            client.api.remove_container(cid, force=True)
        except docker.errors.APIError:
            pass
