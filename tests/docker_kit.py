"""Test material for tests that look at sandbox containers on the real Docker Engine.

The Engine is shared: another checkout's scorer, another test run or CI job, and their reapers
create and remove labelled sandbox containers while a test looks. So a test only ever looks at
the containers its own process (or a child it started) owns, found by the exact owner label, and
lists them with one Engine call that carries the labels: `containers.list()` inspects every
container it lists, and one that another process removed meanwhile fails it with a 404.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from process_kit import wait_for

from scorers.sandbox.image import sandbox_users
from scorers.sandbox.pool import LABEL, OWNER_LABEL, owner_label, reap_orphans


def owned(client: Any, owners: Iterable[str]) -> list[str]:
    """Ids of the sandbox containers (running or not) whose owner label is one of `owners`."""
    return list(states(client, owners))


def states(client: Any, owners: Iterable[str]) -> dict[str, str]:
    """Each sandbox container of these owners, by id: its state ("created", "running", ...)."""
    wanted = set(owners)
    return {
        c["Id"]: c.get("State", "")
        for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
        if (c.get("Labels") or {}).get(OWNER_LABEL) in wanted
    }


def wait_gone_after_kill(client: Any, owners: Iterable[str], timeout: float) -> None:
    """Wait until the containers of killed owners are gone, as a user's machine sees them go.

    Every container that started ends by itself: its lifeline closed with its owner. One that
    the owner created in the instant it was killed never started (no process, no memory: a
    record) and is left for the next pool's reaper, `reap_orphans`. It runs here only once the
    started ones are gone, so it cannot hide a lifeline that failed."""
    owners = set(owners)
    wait_for(
        lambda: all(s == "created" for s in states(client, owners).values()),
        timeout,
        "the killed owners' started containers gone by themselves",
    )
    reap_orphans(client)
    wait_for(lambda: not owned(client, owners), timeout, "the never-started ones reaped")


def running_submissions(client: Any, container_id: str) -> int:
    """Processes of the submission uid in the container beyond its zygote: running tests."""
    import docker.errors

    try:
        top = client.api.top(container_id, ps_args="-o pid,uid,pcpu,args")
    except docker.errors.APIError:  # the container went away meanwhile
        return 0
    uid_col = top["Titles"].index("UID")
    uid = str(sandbox_users().sandbox_uid)
    return max(0, sum(p[uid_col] == uid for p in top["Processes"] or []) - 1)


def owners_of(pids: Iterable[int]) -> set[str]:
    """The owner labels of the containers these live processes (in this pid namespace) start."""
    return {owner_label(pid) for pid in pids}


def sandbox_processes_outside_containers(client: Any) -> list[str]:
    """Host processes running as a sandbox uid that are in no container the Engine knows.

    Other sessions may have sandbox containers starting and ending meanwhile: the processes are
    listed first and the containers after, so a container started in between cannot make its
    processes look escaped, and a process that has exited by the time its cgroup is read is gone,
    not left over."""
    users = sandbox_users()
    uids = {str(users.harness_uid), str(users.sandbox_uid)}
    out = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True).stdout
    candidates = [line for line in out.splitlines() if line.split()[:1] and line.split()[0] in uids]
    if not candidates:
        return []
    live = {c["Id"] for c in client.api.containers(all=True)}
    leftovers = []
    for line in candidates:
        try:
            cgroup = Path(f"/proc/{line.split()[1]}/cgroup").read_text()
        except OSError:
            continue  # exited meanwhile
        if not any(cid in cgroup for cid in live):
            leftovers.append(line)
    return leftovers
