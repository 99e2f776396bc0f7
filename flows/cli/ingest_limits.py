"""The `--max-member-mb`, `--max-log-mb` and `--max-inflate-ratio` options of the commands that
ingest logs (`ingest`, `score`, `sweep`, `serve`): how far a log's zip members may inflate.

Each is also its environment variable (GRADEBOOK_MAX_MEMBER_MB, ...), which is how it reaches
every read of a log: the header checks before a flow, the flow's ingest, the processes `serve`
starts. A flag (or its variable) wins over a sweep config's `[ingest]` table; docs/design/ingest.md
says what the defaults are and why.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from warehouse.inflate import (
    DEFAULT_LOG_MB,
    DEFAULT_MEMBER_MB,
    DEFAULT_RATIO,
    ENV_LOG_MB,
    ENV_MEMBER_MB,
    ENV_RATIO,
    MB,
    RATIO_FLOOR,
)

__all__ = ["MaxLogOption", "MaxMemberOption", "MaxRatioOption", "set_limits"]

MaxMemberOption = Annotated[
    float | None,
    typer.Option(
        "--max-member-mb",
        envvar=ENV_MEMBER_MB,
        help=f"Most MB one member of a .eval log (a sample, its header), or a .json log, may "
        f"inflate to; a sample over it is refused, the rest kept (default {DEFAULT_MEMBER_MB}).",
    ),
]
MaxLogOption = Annotated[
    float | None,
    typer.Option(
        "--max-log-mb",
        envvar=ENV_LOG_MB,
        help=f"Most MB the members read from one log may inflate to in all (default "
        f"{DEFAULT_LOG_MB}).",
    ),
]
MaxRatioOption = Annotated[
    float | None,
    typer.Option(
        "--max-inflate-ratio",
        envvar=ENV_RATIO,
        help=f"Most times its compressed size a member may inflate to past {RATIO_FLOOR // MB} "
        f"MB: the zip-bomb guard (default {DEFAULT_RATIO:g}).",
    ),
]


def set_limits(member_mb: float | None, log_mb: float | None, ratio: float | None) -> None:
    """Put the limits given into this process's environment, for every read of a log it (and
    what it starts) makes; None leaves a limit as it is. A value that is not a number above 0
    (a ratio: at least 1) is one line on stderr, exit 2."""
    given = (
        ("--max-member-mb", ENV_MEMBER_MB, member_mb, 0.0),
        ("--max-log-mb", ENV_LOG_MB, log_mb, 0.0),
        ("--max-inflate-ratio", ENV_RATIO, ratio, 1.0),
    )
    for flag, name, value, low in given:
        if value is None:
            continue
        ok = value >= low if low else value > 0  # False for NaN too
        if not ok or value == float("inf"):
            above = f"at least {low:g}" if low else "above 0"
            typer.echo(f"error: {flag} (env {name}) must be a number {above}, not {value:g}",
                       err=True)  # fmt: skip
            raise typer.Exit(2)
        os.environ[name] = repr(value)
