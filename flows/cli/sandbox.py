"""`gradebook sandbox ...`: build the sandbox image, check it, reap leftover containers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

sandbox_app = typer.Typer(
    help="The Docker sandbox that runs model-written code.", no_args_is_help=True
)


@sandbox_app.command("build")
def build(
    recipe: Annotated[
        Path | None, typer.Option(help="Recipe directory (default: infra/sandbox/).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even when the recipe's tag exists.")] = False,
) -> None:
    """Build the sandbox image (debootstrap + docker import), tagged by the recipe's hash."""
    from scorers.sandbox.image import RECIPE_DIR, ImageBuildError, build_image

    try:
        tag, built = build_image(recipe or RECIPE_DIR, force=force)
    except ImageBuildError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{'built' if built else 'up to date'}: {tag}")


@sandbox_app.command("check")
def check() -> None:
    """Run one passing and one failing test in the sandbox; exit 1 if either is wrong."""
    from scorers.code import run_unit_tests

    tests = "assert add(2, 3) == 5\n"
    good = run_unit_tests("def add(a, b):\n    return a + b\n", tests, entry_point="add")
    bad = run_unit_tests("def add(a, b):\n    return 0\n", tests, entry_point="add")
    typer.echo(f"correct code: {good.status} ({good.duration_s * 1000:.0f} ms)")
    typer.echo(f"wrong code:   {bad.status} ({bad.duration_s * 1000:.0f} ms)")
    if not (good.passed and bad.status == "failed"):
        typer.echo(
            f"error: sandbox check failed: {good.detail or bad.detail}; start Docker Engine and "
            "build the sandbox image (`make services`, or `gradebook sandbox build` when "
            "Docker runs), then run `gradebook sandbox check` again",
            err=True,
        )
        raise typer.Exit(1)


@sandbox_app.command("reap")
def reap() -> None:
    """Remove sandbox containers left by scorer processes that no longer run."""
    import docker

    from scorers.sandbox.pool import reap_orphans

    typer.echo(f"removed {reap_orphans(docker.from_env())} leftover container(s)")
