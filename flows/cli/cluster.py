"""`gradebook cluster setup|worker`: join Prefect's server, work pools and workers.

The server itself is `prefect server start` (infra/cluster/start_server.sh); these commands talk
to the one named by PREFECT_API_URL.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from flows.runtime.console import console, err_console

__all__ = ["cluster_app"]

cluster_app = typer.Typer(
    help="Run sweeps on Prefect work pools: 'gpu' generates, 'cpu' scores (config section 'cluster').",
    no_args_is_help=True,
)


def _need_api() -> str:
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        err_console.print(
            "[red]error:[/red] PREFECT_API_URL is not set; export "
            "PREFECT_API_URL=http://<server>:4200/api (start it with infra/cluster/start_server.sh)"
        )
        raise typer.Exit(2)
    from flows.runtime.server import server_healthy

    if not server_healthy(url, timeout=5.0):
        err_console.print(
            f"[red]error:[/red] PREFECT_API_URL={url} does not answer; start the server there "
            "(infra/cluster/start_server.sh) or fix the URL"
        )
        raise typer.Exit(2)
    return url


@cluster_app.command("setup")
def setup(
    gpu_pool: Annotated[
        list[str] | None, typer.Option("--gpu-pool", help="Generation pool (repeatable).")
    ] = None,
    cpu_pool: Annotated[
        list[str] | None, typer.Option("--cpu-pool", help="Scoring pool (repeatable).")
    ] = None,
) -> None:
    """Create the work pools, the cluster deployments and the crash automation (idempotent)."""
    from flows.cluster.setup import setup_cluster

    _need_api()
    try:
        done = setup_cluster(generate_pools=gpu_pool, score_pools=cpu_pool)
    except RuntimeError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(f"Prefect API {done.api_url}")
    console.print(f"  work pools: {', '.join(done.pools)}")
    console.print(f"  deployments: {', '.join(done.deployments)}")
    console.print("  automation: crash cluster flow runs whose heartbeats stopped")
    console.print(
        "next: `gradebook cluster worker gpu` on each GPU host, `... cpu` on each CPU host"
    )


@cluster_app.command("worker")
def worker(
    pool: Annotated[str, typer.Argument(help="The work pool to serve: gpu or cpu.")],
    name: Annotated[str | None, typer.Option("--name", help="Worker name in the UI.")] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Flow runs at once on this host.")
    ] = None,
    poll: Annotated[
        float, typer.Option("--poll", min=0.5, help="Seconds between polls (Prefect's: 10).")
    ] = 2.0,
) -> None:
    """Become a Prefect process worker for POOL (replaces this process; Ctrl-C stops it)."""
    from flows.cluster.setup import worker_command, worker_env

    url = _need_api()
    cmd = worker_command(pool, name=name, limit=limit)
    os.execve(cmd[0], cmd, {**os.environ, **worker_env(url, poll_s=poll)})
