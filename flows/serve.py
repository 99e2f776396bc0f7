"""`gradebook serve`: sweeps on their cron schedules plus a verifier watcher, until Ctrl-C.

Schedules need a real Prefect server: the one named by PREFECT_API_URL, or gradebook's shared
local one (flows.runtime.background_server). Each sweep becomes a deployment on its cron; each warehouse
gets a `verifier-watcher` deployment on a short interval that re-scores when a fingerprint
changes (and emits `gradebook.verifier.changed`) and grades again the samples an infrastructure
failure left unscored, once the service is back (`flows.rescore.retry_infrastructure`). A
watcher deployment runs one flow run at a time: Prefect's deployment concurrency limit (1,
cancel-new) cancels a scheduled run that comes due while the last one still runs, so two runs
never grade the same warehouse at once. Flow runs execute in subprocesses started by Prefect's
runner, so every run imports the verifier code as it is on disk at that moment.

Processes. `gradebook serve` itself (the supervisor, in the terminal's process group) runs
Prefect's runner (`prefect.serve`, flows/serve_runner.py) in a child process in a session of its
own; the runner's flow runs and their grading workers and zygotes are all in that session. A
Ctrl-C in the terminal therefore reaches only the supervisor, which stops the runner the way
Prefect stops one (SIGTERM: it cancels the runs in flight, which end Cancelled), waits at most
STOP_GRACE_S, kills whatever is left of that session, marks Cancelled any run whose process it
had to kill, and exits: one line each way, no traceback. A second Ctrl-C kills the session and
exits at once. The runner stops in order when the supervisor dies (a parent-death signal), and
each flow run dies with the runner (flows.runtime.run_owner), so even a SIGKILL leaves nothing working
on; a run left Running is marked Crashed by the next gradebook command.

Serving holds a lease on gradebook's local server for its whole life, so no other command stops
it (flows.runtime.server_leases). If it goes away all the same (killed, or `gradebook server stop
--force`), the supervisor sees its process gone, stops the runner and exits 2 with one line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from flows.runtime.console import console, err_console, shown
from sweeps.config import SweepConfig

if TYPE_CHECKING:
    from flows.runtime.background_server import ServerInfo

__all__ = ["STOP_GRACE_S", "build_deployments", "serve_configs"]

# From the first Ctrl-C to killing what is left: Prefect's runner cancels its runs in ~3-5 s.
STOP_GRACE_S = 7.0


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "default"


def build_deployments(cfgs: Sequence[SweepConfig], *, watch_every: int = 60) -> list[Any]:
    """One deployment per sweep (cron if the config has one) and one watcher per warehouse."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    from flows.rescore import watch_verifiers
    from flows.sweep import sweep_flow
    from verifiers.specs import config_modules

    deployments = []
    watched: dict[str, list[str]] = {}
    for cfg in cfgs:
        deployments.append(
            sweep_flow.to_deployment(
                name=cfg.name,
                cron=cfg.schedule,
                # absolute: a scheduled run must find the file whatever directory it runs in
                parameters={"config": str(Path(cfg.source or ".").resolve()), "progress": False},
                description=f"sweep {cfg.name} from {cfg.source}",
                tags=["gradebook", "sweep"],
            )
        )
        mods = watched.setdefault(str(cfg.warehouse), [])
        # the config's scorer files too (`file.py@scorer`): the watcher loads only what it is told
        mods += [m for m in config_modules(cfg) if m not in mods]
    for warehouse, modules in watched.items():
        deployments.append(
            watch_verifiers.to_deployment(
                name=f"watch-{_slug(warehouse.rsplit('/', 1)[-1].removesuffix('.duckdb'))}",
                interval=watch_every,
                parameters={"warehouse": warehouse, "verifier_modules": modules},
                description=f"re-score {warehouse} when a verifier fingerprint changes, "
                "and retry samples an infrastructure failure left unscored",
                tags=["gradebook", "watcher"],
                # one run per warehouse at a time; one that comes due meanwhile is cancelled
                # (queued ones would pile up behind a long re-score, one per interval)
                concurrency_limit=ConcurrencyLimitConfig(
                    limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
                ),
            )
        )
    return deployments


def _ui_url(api_url: str) -> str:
    """Where a browser shows the flow runs: Prefect's own `ui_url` for this API (the API URL
    without its `/api`, unless PREFECT_UI_URL says otherwise)."""
    from prefect.settings import get_current_settings

    return get_current_settings().ui_url or api_url.removesuffix("/api")


def serve_configs(
    cfgs: Sequence[SweepConfig], *, watch_every: int = 60, verbose: bool = False
) -> int:
    """Register the deployments and run them until SIGINT or SIGTERM; returns the exit code."""
    from flows.runtime.background_server import server_at
    from flows.runtime.console import quiet_prefect
    from flows.runtime.procs import parent_death_preexec
    from flows.runtime.session import prefect_session

    quiet_prefect(verbose)
    with prefect_session() as api_url:
        local = server_at(api_url)  # None: a server PREFECT_API_URL names
        console.print(
            f"[bold]gradebook serve[/bold]: Prefect UI {_ui_url(api_url)} (API {api_url})"
        )
        for cfg in cfgs:
            when = f"cron '{cfg.schedule}'" if cfg.schedule else "on demand (no schedule)"
            console.print(f"  sweep {cfg.name}: {when}")
        console.print(f"  verifier watcher: every {watch_every}s; Ctrl-C to stop")
        _remove_stale_tmp()
        # the runner's own temp files (Prefect's runner storage) go here and go away with it
        tmp = tempfile.mkdtemp(prefix=f"gradebook-serve-{os.getpid()}-")
        args = [sys.executable, "-m", "flows.serve_runner", "--watch-every", str(watch_every)]
        args += ["--verbose"] if verbose else []
        args += [str(Path(cfg.source or ".").resolve()) for cfg in cfgs]
        runner = subprocess.Popen(
            args,
            env={**os.environ, "TMPDIR": tmp, "PREFECT_API_URL": api_url},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # SIGUSR1, not SIGTERM: the kernel may send it once per thread of a dead parent, and
            # a second SIGTERM makes Prefect's runner exit mid-shutdown (serve_runner.py)
            preexec_fn=parent_death_preexec(signal.SIGUSR1),
        )
        try:
            return _supervise(runner, api_url, local)
        finally:
            from flows.runtime.procs import kill_group

            kill_group(runner.pid)
            runner.wait()
            shutil.rmtree(tmp, ignore_errors=True)


def _supervise(runner: subprocess.Popen[bytes], api_url: str, local: ServerInfo | None) -> int:
    """Wait for the runner; on the first signal stop it in order, on a second kill it.

    Raises:
        flows.runtime.session.ServerLost: the local server's process went away meanwhile (the
            runner is stopped first).
    """
    from flows.runtime.interrupts import exit_code
    from flows.runtime.procs import kill_group

    first: list[tuple[int, float, set[str]]] = []  # (signal, when, processes then)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if first:
            err_console.print("gradebook serve: interrupted again: exiting now")
            kill_group(runner.pid)
            os._exit(exit_code(signum))
        first.append((signum, time.monotonic(), _processes(runner.pid)))
        err_console.print(
            "gradebook serve: stopping: cancelling the runs in flight (Ctrl-C again to exit "
            "at once)",
            soft_wrap=True,
        )
        try:
            runner.send_signal(signal.SIGTERM)  # Prefect's runner: cancel runs, then exit
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    gone = False
    try:
        while True:
            try:
                code = runner.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                if first and time.monotonic() - first[0][1] > STOP_GRACE_S:
                    break
                # the pid, not a health check: a busy server answering late is still there
                if local is not None and not local.alive():
                    gone = True
                    break
        left = _processes(runner.pid)
        kill_group(runner.pid)  # a run, worker or zygote the runner did not stop in time
        runner.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if gone or (not first and local is not None and not local.alive()):
        from flows.runtime.session import ServerLost, server_lost

        lost = server_lost(api_url, pid=local.pid, ticks=local.ticks)
        raise lost or ServerLost(f"the local Prefect server (pid {local.pid}) went away")
    if not first:
        err_console.print(
            f"[red]error:[/red] the Prefect runner exited (code {code}) before any signal: "
            "what it said is above; run `gradebook serve -v` to see Prefect's own lines too",
            soft_wrap=True,
        )
        return 2
    _settle(first[0][2] | left, api_url, local)
    console.print("gradebook serve: stopped")
    return 0


def _processes(pgid: int) -> set[str]:
    from flows.runtime.procs import ProcessId, group_members, start_ticks, this_process

    host = this_process().host
    return {str(ProcessId(host, pid, start_ticks(pid))) for pid in group_members(pgid)}


def _settle(owners: set[str], api_url: str, local: ServerInfo | None) -> None:
    """Runs whose process was stopped with the runner, and not finished by it: Cancelled."""
    from flows.runtime.run_owner import settle_orphaned_runs
    from flows.runtime.session import server_lost

    try:
        settle_orphaned_runs(owners=owners, message="gradebook serve stopped while it ran")
    except Exception as exc:
        lost = server_lost(
            api_url, exc, pid=local.pid if local else None, ticks=local.ticks if local else None
        )
        why = str(lost) if lost is not None else str(exc)
        err_console.print(
            f"gradebook serve: could not mark the stopped runs Cancelled: {shown(why)}",
            soft_wrap=True,
        )


def _remove_stale_tmp() -> None:
    # a supervisor killed outright leaves its runner's temp dir behind: remove those of
    # supervisors that are gone
    from flows.runtime.procs import alive

    for path in Path(tempfile.gettempdir()).glob("gradebook-serve-*-*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
