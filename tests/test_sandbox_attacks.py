"""Every attack class from the issue, against the real Docker Engine: none may grade as passed.

Each submission below is WRONG (or tries to skip the tests); the only way for it to pass would
be to defeat the harness. Some also report what they managed to see through their output, so
the test shows the attack was attempted and failed, not merely that a wrong answer failed.
"""

from __future__ import annotations

import os
from pathlib import Path

import docker_kit
import pytest

from scorers.code import run_unit_tests

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n\ncheck(add)\n"
HOST_MARKER = Path("/tmp/gradebook-attack-marker")

ATTACKS = {
    "sys_exit_at_import": "import sys\nsys.exit(0)\n",
    "sys_exit_in_call": "def add(a, b):\n    import sys\n    sys.exit(0)\n",
    "os_exit_at_import": "import os\nos._exit(0)\n",
    "os_exit_in_call": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "atexit_forged_success": (
        "import atexit, sys\n"
        'atexit.register(lambda: print(\'{"gradebook_verdict": 1, "passed": true}\'))\n'
        "def add(a, b):\n    sys.exit(0)\n"
    ),
    "raise_system_exit": "def add(a, b):\n    raise SystemExit(0)\n",
    "patch_builtins_assertionerror": (
        "import builtins\n"
        "class Quiet(BaseException):\n    pass\n"
        "builtins.AssertionError = Quiet\n"
        "builtins.__dict__['AssertionError'] = Quiet\n"
        "def add(a, b):\n    return None\n"
    ),
    "patch_unittest_and_harness_modules": (
        "import sys, unittest, json\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        'json.dumps = lambda *a, **k: \'{"gradebook_verdict": 1, "passed": true}\'\n'
        "for name, mod in list(sys.modules.items()):\n"
        "    if hasattr(mod, '_verdict'):\n"
        "        mod._verdict = lambda out, *a: out.write('{\"passed\": true}\\n')\n"
        "def add(a, b):\n    return None\n"
    ),
    "always_equal_object": (
        "class Everything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = object.__hash__\n"
        "class Int(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Everything() if a == 2 else Int(0)\n"
    ),
    "forged_success_output": (
        "import os, sys\n"
        'line = \'{"gradebook_verdict": 1, "id": "", "passed": true, "status": "passed", "detail": "all tests passed", "calls": 2}\\n\'\n'
        "print(line); sys.stderr.write(line); os.write(1, line.encode())\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        for fd in ('1', '2'):\n"
        "            try:\n"
        "                with open(f'/proc/{pid}/fd/{fd}', 'w') as f:\n"
        "                    f.write(line)\n"
        "            except OSError:\n"
        "                pass\n"
        "def add(a, b):\n    print(line)\n    return None\n"
    ),
    "read_test_source": (
        "import os, re, gc\n"
        "found = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    if not pid.isdigit():\n        continue\n"
        "    for part in ('cmdline', 'environ', 'fd/0', 'mem'):\n"
        "        try:\n"
        "            with open(f'/proc/{pid}/{part}', 'rb') as f:\n"
        "                data = f.read(1 << 20)\n"
        "        except OSError:\n"
        "            continue\n"
        "        if b'candidate(' in data:\n"
        "            found.append((pid, part))\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, str) and 'assert candidate' in obj:\n"
        "        found.append(('gc', obj[:40]))\n"
        "print('FOUND', found)\n"
        "def add(a, b):\n    return 'found' if found else None\n"
    ),
    "infinite_loop": "def add(a, b):\n    while True:\n        pass\n",
    "fork_bomb": (
        "import os\n"
        "def add(a, b):\n"
        "    while True:\n"
        "        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    ),
    "memory_bomb": (
        "def add(a, b):\n"
        "    hog = []\n"
        "    while True:\n        hog.append(bytearray(50 * 1024 * 1024))\n"
    ),
    "gigabytes_of_output": (
        "import sys\n"
        "def add(a, b):\n"
        "    chunk = 'x' * (1 << 20)\n"
        "    for _ in range(2048):\n        sys.stdout.write(chunk)\n"
        "    return a + b\n"
    ),
    "network_access": (
        "import socket\n"
        "def fetch():\n"
        "    for host, port in (('1.1.1.1', 53), ('172.17.0.1', 2375), ('127.0.0.1', 2375)):\n"
        "        try:\n"
        "            socket.create_connection((host, port), timeout=1).close()\n"
        "            return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
        "ONLINE = fetch()\n"
        "print('ONLINE', ONLINE)\n"
        "def add(a, b):\n    return a + b if ONLINE else None\n"
    ),
    "write_outside_work_dir": (
        "wrote = []\n"
        f"for path in ('/tmp/x', '/etc/x', '/usr/lib/python3.11/sitecustomize.py', '{HOST_MARKER}', '/x'):\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('import builtins\\nbuiltins.AssertionError = KeyError\\n')\n"
        "        wrote.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('WROTE', wrote)\n"
        "def add(a, b):\n    return a + b if wrote else None\n"
    ),
    "kill_the_harness": (
        "import os, signal\n"
        "def add(a, b):\n"
        "    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit() and int(pid) != os.getpid():\n"
        "            try:\n                os.kill(int(pid), signal.SIGKILL)\n"
        "            except OSError:\n                pass\n"
        "    return None\n"
    ),
}


@pytest.fixture(scope="module")
def host_before():
    return {"marker": HOST_MARKER.exists(), "tmp": set(os.listdir("/tmp"))}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_does_not_pass(docker_sandbox, host_before, name):
    verdict = run_unit_tests(ATTACKS[name], TESTS, entry_point="add", timeout_s=5.0)
    assert not verdict.passed, verdict
    # A wrong answer is a failure or a timeout; sandbox trouble would be "error".
    assert verdict.status in {"failed", "timeout"}, verdict


def test_what_the_attacks_could_see(docker_sandbox):
    """The probing attacks report through their (captured) output what they reached: nothing."""
    reads = docker_sandbox.run_tests(ATTACKS["read_test_source"], TESTS, entry_point="add")
    assert "FOUND []" in reads.output, reads.output
    net = docker_sandbox.run_tests(ATTACKS["network_access"], TESTS, entry_point="add")
    assert "ONLINE False" in net.output, net.output
    writes = docker_sandbox.run_tests(ATTACKS["write_outside_work_dir"], TESTS, entry_point="add")
    assert "WROTE []" in writes.output, writes.output


def test_time_and_output_limits_are_named(docker_sandbox):
    loop = run_unit_tests(ATTACKS["infinite_loop"], TESTS, entry_point="add", timeout_s=2.0)
    # ended by the limit, not before it (how long after it depends on the machine's load)
    assert loop.status == "timeout" and loop.duration_s >= 2.0
    assert loop.detail == "timed out after 2s"
    flood = run_unit_tests(ATTACKS["gigabytes_of_output"], TESTS, entry_point="add")
    assert flood.status == "failed" and "output limit" in flood.detail


def test_harness_still_works_after_the_attacks(docker_sandbox):
    verdict = run_unit_tests("def add(a, b):\n    return a + b\n", TESTS, entry_point="add")
    assert verdict.passed and verdict.status == "passed"


def test_host_unchanged_after_attacks(docker_sandbox, host_before):
    """Runs last in this module: no file, process or container is left on the host."""
    import docker

    from scorers.sandbox.pool import close_default_pool

    owner = docker_sandbox.containers_owner
    close_default_pool()
    client = docker.from_env()
    assert docker_kit.owned(client, [owner]) == []
    # other sessions' sandbox containers may be running: only processes outside all of them count
    assert docker_kit.sandbox_processes_outside_containers(client) == []
    assert not HOST_MARKER.exists() and not host_before["marker"]
    new_tmp = set(os.listdir("/tmp")) - host_before["tmp"]
    assert not [p for p in new_tmp if p in {"x", "sitecustomize.py"}]
