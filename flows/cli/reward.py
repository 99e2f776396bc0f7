"""`gradebook reward ...`: the verifiers as RL rewards, for trainers that call them over HTTP.

Exit codes: 0 stopped by Ctrl-C or SIGTERM; 2 bad input (unknown verifier, bad parameter, an
address that cannot be bound), reported as one line on stderr.
"""

from __future__ import annotations

import errno
import signal
from typing import Annotated

import typer

reward_app = typer.Typer(
    help="RL rewards from the gradebook verifiers (OpenRLHF's remote reward over HTTP).",
    no_args_is_help=True,
)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@reward_app.command("serve")
def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on (no authentication: keep it private).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 5000,
    verifier: Annotated[str, typer.Option(help="Verifier to grade with: math or unit_tests.")] = (
        "math"
    ),
    answer_pattern: Annotated[
        list[str] | None,
        typer.Option(
            help="math: an extraction strategy or regex, in order (repeat; default: the "
            "verifier's own)."
        ),
    ] = None,
    timeout_s: Annotated[
        float | None, typer.Option(help="math: hard limit per answer, seconds.")
    ] = None,
    unscored_reward: Annotated[
        float, typer.Option(help="Reward of a sample the verifier cannot grade (also flagged).")
    ] = 0.0,
    connections: Annotated[
        int,
        typer.Option(
            help="Requests parsed and graded at once (a request being read waits on no thread)."
        ),
    ] = 64,
    read_timeout: Annotated[
        float,
        typer.Option(
            "--read-timeout",
            help="Seconds a client has to send a request's headers after connecting, and again "
            "its body; a stalled client is cut off (408 for a body) and holds no slot meanwhile.",
        ),
    ] = 60.0,
) -> None:
    """Serve OpenRLHF's remote-reward protocol: POST {"query", "prompts", "labels"} batches.

    Point OpenRLHF at it with `--reward.remote_url http://HOST:PORT/` (several URLs split a
    batch). GET /health reports the verifier and its fingerprint.
    """
    from scorers.rewards import openrlhf_reward, warm_up
    from scorers.rewards.server import RewardServer, ServerLimits

    params: dict[str, object] = {}
    if answer_pattern:
        params["answer_patterns"] = list(answer_pattern)
    if timeout_s is not None:
        params["timeout_s"] = timeout_s
    try:
        reward = openrlhf_reward(verifier, unscored_reward=unscored_reward, **params)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if connections < 1:
        raise _fail(f"--connections must be at least 1, not {connections}")
    if not 0 < read_timeout < float("inf"):
        raise _fail(f"--read-timeout must be a number of seconds above 0, not {read_timeout:g}")
    try:
        # bound first: a port in use is one line, before any worker starts (seconds, for math)
        server = RewardServer(
            reward,
            host,
            port,
            limits=ServerLimits(connections=connections, read_timeout_s=read_timeout),
            log=lambda line: typer.echo(line, err=True),
        )
    except OSError as exc:
        # socket.create_server's words repeat the address this line gives already
        why = (exc.strerror or str(exc)).split(" (while attempting to bind", 1)[0]
        # not this machine's address, or no address at all (a name that does not resolve)
        fix = "--host" if (exc.errno or 0) < 0 or exc.errno == errno.EADDRNOTAVAIL else "--port"
        raise _fail(f"cannot listen on {host}:{port}: {why} (pick another {fix})") from None
    if verifier == "unit_tests":
        from scorers.sandbox.pool import sandbox_down

        down = sandbox_down()
        if down:
            typer.echo(f"warning: {down}; code samples are unscored until it is up", err=True)
    typer.echo(f"starting the {verifier} verifier's workers...", err=True)
    warm_up(verifier)
    if host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"warning: listening on {host} without authentication", err=True)
    typer.echo(
        f"serving {verifier} rewards at {server.url} (verifier fingerprint "
        f"{server.fingerprint[:12]}); Ctrl-C stops",
        err=True,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
    finally:
        server.close()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
