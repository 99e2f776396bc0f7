"""The process behind `gradebook serve` that runs Prefect's runner (see flows/serve.py).

    python -m flows.serve_runner [--watch-every S] [--verbose] CONFIG...

Started by `gradebook serve` in a session of its own, after it checked the configs and tasks.
It registers the deployments and serves them (`prefect.serve`) until SIGTERM, which Prefect's
runner handles: it cancels the runs in flight and exits. The flow runs it starts are its
subprocesses (multiprocessing's spawn, which imports this module again as `__mp_main__`: keep
its top level light).
"""

from __future__ import annotations

import argparse
import os
import signal
from types import FrameType


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flows.serve_runner")
    ap.add_argument("--watch-every", type=int, default=60)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("configs", nargs="+")
    args = ap.parse_args(argv)
    # SIGINT is the supervisor's to handle (it sends SIGTERM); ignored here, and so in the flow
    # runs, which inherit it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, _supervisor_gone)

    from flows.runtime.console import quiet_prefect

    quiet_prefect(args.verbose)
    from prefect import serve

    from flows.runtime.run_owner import RUNNER_PID_ENV
    from flows.serve import build_deployments
    from sweeps.config import load_config

    os.environ[RUNNER_PID_ENV] = str(os.getpid())  # the flow runs die with this process
    cfgs = [load_config(path) for path in args.configs]
    serve(*build_deployments(cfgs, watch_every=args.watch_every), print_starting_message=False)


def _supervisor_gone(signum: int, frame: FrameType | None) -> None:
    # The parent-death signal `gradebook serve` asked for: it may come once per thread of the
    # dead supervisor, so act on the first only, with the one SIGTERM Prefect's runner stops on
    # in order (it cancels the runs in flight); a second SIGTERM would make it exit half-way.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main()
