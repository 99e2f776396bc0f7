"""Nothing one submission leaves behind reaches the next, containers are labelled and reaped,
and without Docker nothing runs (never a fallback to the host)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import docker_kit
import pytest
from process_kit import wait_for

from scorers.code import run_unit_tests
from scorers.sandbox.pool import SandboxLimits, SandboxPool, reap_orphans

TESTS = "assert probe(1) == 1\n"

LEAVE_STATE = textwrap.dedent(
    """
    import os, socket, time
    with open('/work/planted', 'w') as f:
        f.write('x')
    if os.fork() == 0:
        os.setsid()
        # a daemon that would serve answers to the next submission's harness
        srv = socket.socket(socket.AF_UNIX)
        srv.bind('\\0gradebook-daemon')
        srv.listen(5)
        while True:
            time.sleep(1)
    def probe(x):
        return x
    """
)

LOOK_FOR_STATE = textwrap.dedent(
    """
    import os, socket
    def others():
        mine = os.getpid()
        found = []
        for pid in os.listdir('/proc'):
            if pid.isdigit() and int(pid) != mine:
                try:
                    with open(f'/proc/{pid}/status') as f:
                        uid = [l for l in f if l.startswith('Uid:')][0].split()[1]
                except OSError:
                    continue
                if int(uid) == os.getuid() and os.getppid() != int(pid):
                    found.append(pid)
        return found
    daemon = True
    try:
        socket.socket(socket.AF_UNIX).connect('\\0gradebook-daemon')
    except OSError:
        daemon = False
    print('HOST', socket.gethostname(), 'FILES', sorted(os.listdir('/work')), 'DAEMON', daemon)
    def probe(x):
        return x
    """
)


@pytest.mark.docker
def test_no_file_or_process_survives_into_the_next_run(docker_sandbox):
    with SandboxPool(concurrency=1) as pool:
        first = pool.run_tests(LEAVE_STATE, TESTS, entry_point="probe")
        assert first.passed, first
        second = pool.run_tests(LOOK_FOR_STATE, TESTS, entry_point="probe")
        assert second.passed, second
        third = pool.run_tests(LOOK_FOR_STATE, TESTS, entry_point="probe")
    # Same warm container each time (so the check is meaningful), yet a clean slate.
    host_2 = second.output.split()[1]
    assert third.output.split()[1] == host_2
    assert "FILES ['.gradebook-output'] DAEMON False" in second.output, second.output


@pytest.mark.docker
def test_containers_are_hardened_and_labelled(docker_sandbox):
    import docker

    with SandboxPool(concurrency=1) as pool:
        pool.run_tests("def probe(x):\n    return x\n", TESTS, entry_point="probe")
        client = docker.from_env()
        ids = docker_kit.owned(client, [pool.containers_owner])
        assert ids
        container = client.containers.get(ids[0])
        host = container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["Memory"] == host["MemorySwap"] > 0
        assert host["PidsLimit"] > 0 and host["NanoCpus"] > 0
        assert "size=" in host["Tmpfs"]["/work"]
        assert container.attrs["Config"]["User"] not in ("", "0", "root")


@pytest.mark.docker
def test_leftovers_of_a_dead_owner_are_reaped(docker_sandbox):
    # A container whose owner label names a process that no longer runs (its lifeline is held
    # here, so only the reaper can end it: the backstop for containers of older versions).
    import docker

    from scorers.sandbox.image import image_tag, sandbox_users
    from scorers.sandbox.pool import create_container

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    owner = f"{socket.gethostname()}:{gone.pid}:1"
    uid = sandbox_users().harness_uid
    client = docker.from_env()
    live = create_container(client, image_tag(), SandboxLimits(), user=f"{uid}:{uid}", owner=owner)
    try:
        assert docker_kit.owned(client, [owner]), "no container was started"
        reap_orphans(client)
        # gone, or going: another session's reaper may be removing it at the same moment (its
        # lifeline is held here, so nothing but a reaper ends it)
        wait_for(lambda: docker_kit.owned(client, [owner]) == [], 60, "the orphan removed")
    finally:
        live.remove()


def test_no_docker_means_unscored_never_host(monkeypatch, tmp_path):
    """With the Engine unreachable the verdict is sandbox_unavailable and nothing ran."""
    import scorers.sandbox.pool as sandbox
    from scorers.code import grade_unit_tests
    from scorers.grade import SampleView

    marker = tmp_path / "ran-on-host"
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(sandbox, "_default_pool", None)
    code = f"open({str(marker)!r}, 'w').write('x')\ndef probe(x):\n    return x\n"
    verdict = run_unit_tests(code, TESTS, entry_point="probe")
    assert verdict.status == "sandbox_unavailable" and not verdict.passed
    assert "Docker Engine not reachable" in verdict.detail
    grade = grade_unit_tests(
        SampleView(f"```python\n{code}```", "", {"test": TESTS, "entry_point": "probe"})
    )
    assert (grade.status, grade.reason) == ("unscored", "sandbox_unavailable")
    assert not marker.exists()
