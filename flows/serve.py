"""`gradebook serve`: sweeps on their cron schedules plus a verifier watcher, until Ctrl-C.

Schedules need a real Prefect server: the one named by PREFECT_API_URL, or a local one started
here and stopped on exit. Each sweep becomes a deployment on its cron; each warehouse gets a
`verifier-watcher` deployment on a short interval that re-scores when a fingerprint changes
(and emits `gradebook.verifier.changed`) and grades again the samples an infrastructure
failure left unscored, once the service is back (`flows.rescore.retry_infrastructure`). Flow runs execute in subprocesses started by Prefect's
runner, so every run imports the verifier code as it is on disk at that moment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flows.config import SweepConfig
from flows.console import console

__all__ = ["build_deployments", "serve_configs"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "default"


def build_deployments(cfgs: Sequence[SweepConfig], *, watch_every: int = 60) -> list[Any]:
    """One deployment per sweep (cron if the config has one) and one watcher per warehouse."""
    from flows.rescore import watch_verifiers
    from flows.sweep import sweep_flow
    from flows.verifier_specs import scorer_files

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
        mods += [m for m in [*cfg.verifier_modules, *scorer_files(cfg)] if m not in mods]
    for warehouse, modules in watched.items():
        deployments.append(
            watch_verifiers.to_deployment(
                name=f"watch-{_slug(warehouse.rsplit('/', 1)[-1].removesuffix('.duckdb'))}",
                interval=watch_every,
                parameters={"warehouse": warehouse, "verifier_modules": modules},
                description=f"re-score {warehouse} when a verifier fingerprint changes, "
                "and retry samples an infrastructure failure left unscored",
                tags=["gradebook", "watcher"],
            )
        )
    return deployments


def _ui_url(api_url: str) -> str:
    """Where a browser shows the flow runs: Prefect's own `ui_url` for this API (the API URL
    without its `/api`, unless PREFECT_UI_URL says otherwise)."""
    from prefect.settings import get_current_settings

    return get_current_settings().ui_url or api_url.removesuffix("/api")


def serve_configs(cfgs: Sequence[SweepConfig], *, watch_every: int = 60) -> None:
    """Register the deployments and run them until interrupted (Ctrl-C exits cleanly)."""
    from prefect import serve

    from flows.session import prefect_session

    try:
        with prefect_session(ui=True) as api_url:
            deployments = build_deployments(cfgs, watch_every=watch_every)
            console.print(
                f"[bold]gradebook serve[/bold]: Prefect UI {_ui_url(api_url)} (API {api_url})"
            )
            for cfg in cfgs:
                when = f"cron '{cfg.schedule}'" if cfg.schedule else "on demand (no schedule)"
                console.print(f"  sweep {cfg.name}: {when}")
            console.print(f"  verifier watcher: every {watch_every}s; Ctrl-C to stop")
            serve(*deployments, print_starting_message=False)
    except KeyboardInterrupt:
        pass
    console.print("gradebook serve: stopped")
