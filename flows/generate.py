"""The generation stage: Inspect `eval(..., score=False)` per (model, task); it never scores.

Tasks are grouped by model and share one Inspect `Model` object, so a model server that the
provider starts itself (`vllm/<name>` with no base URL runs `vllm serve`) loads its weights once
per sweep, not once per task. Transient model errors are retried by Inspect (`max_retries` for
API calls, `retry_on_error` for whole samples); samples that still fail are kept in the log as
errored samples and counted here, never dropped.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.runtime.console import err_console, shown, verbose
from flows.runtime.envvars import environ_set
from flows.runtime.interrupts import during_eval, note_stop, stop_on_signals, stop_signal
from flows.runtime.progress import generation_progress, quiet_hook_banner
from flows.runtime.run_names import count, label_run, parameter, tag
from flows.runtime.run_owner import record_owner
from scorers.sandbox.image_cache import CAP_ENV
from sweeps.config import ModelConfig, SweepConfig, TaskConfig, WorkspacesConfig, load_config
from sweeps.model_servers import endpoint, server_problem
from sweeps.tasks import check_tasks, load_task
from verifiers.specs import check_verifiers, task_verifier_entries, task_verifier_names
from warehouse.error_text import one_line

__all__ = [
    "GenerationResult",
    "config_tags",
    "config_title",
    "generate_flow",
    "generate_for_model",
]


@dataclass(frozen=True)
class GenerationResult:
    """What one (model, task) generation produced.

    Attributes:
        model: the model's label from the config.
        task: the task's label from the config.
        log: path of the .eval log written (None if Inspect wrote none).
        run_id: Inspect's eval_id of the log (the warehouse's run_id).
        status: the log's status ("success", "error", "cancelled", ...), or "not started" for
            a pair a stopped sweep never reached.
        samples: samples generated (in the log, less those cancelled in flight).
        errored: samples whose generation failed after retries (kept in the log).
        error: the task-level error, if the whole task failed.
        cancelled: samples in flight when the eval was cancelled: in the log with the
            cancellation as their error, but not generated, not errored, and not stored in the
            warehouse (warehouse.error_text.is_cancellation); a re-run generates them.
    """

    model: str
    task: str
    log: str | None
    run_id: str | None
    status: str
    samples: int
    errored: int
    error: str | None = None
    cancelled: int = 0


def _model(cfg: ModelConfig) -> Any:
    from inspect_ai.model import GenerateConfig, get_model

    point = endpoint(cfg)
    return get_model(
        cfg.model,
        # the URL the server check asked, also when it came from the environment: Inspect
        # then records it in the log (eval.model_base_url), so an error names the server
        base_url=point.url if point else None,
        config=GenerateConfig(**cfg.config),
        memoize=False,
        **cfg.args,
    )


def run_generation(
    model_cfg: ModelConfig,
    tasks: list[TaskConfig],
    log_dir: Path | str,
    *,
    display: str = "none",
    sweep: str | None = None,
    roles: dict[str, Any] | None = None,
    workspaces: WorkspacesConfig | None = None,
) -> list[GenerationResult]:
    """Generate every task with one model, in this process (no Prefect).

    Args:
        model_cfg: the model; one `Model` object serves every task.
        tasks: the tasks to run with it.
        log_dir: where the .eval logs go: a directory, or an `s3://` prefix (Inspect writes
            each log there whole, through fsspec).
        display: Inspect's display ("none" under gradebook's own progress bar).
        sweep: the sweep's name, written into each log's metadata so `gradebook gate --sweep`
            finds its runs.
        roles: the config's `model_roles` (name -> RoleModel), bound to the judge scorers
            recorded in each log's metadata.
        workspaces: capture of sandbox workspaces (default: on, stored in `log_dir/workspaces`).

    SIGINT or SIGTERM stops it (flows.runtime.interrupts): Inspect cancels the eval in flight and
    writes its log as `cancelled`, which is returned with the others; the tasks not reached yet
    are returned as "not started".
    """
    from inspect_ai import eval as inspect_eval

    if isinstance(log_dir, Path):
        log_dir.mkdir(parents=True, exist_ok=True)
    if not verbose():
        quiet_hook_banner()
    problem = server_problem(model_cfg)
    if problem is None:
        try:
            model = _model(model_cfg)
        except Exception as exc:  # e.g. Inspect's PrerequisiteError: a key it cannot find
            problem = f"cannot create model {model_cfg.model}: {_plain(exc)}"
    if problem is not None:
        # this model's pairs fail now, in one line each; the other models still run
        err_console.print(f"[red]error:[/red] {shown(problem)}", soft_wrap=True)
        return [
            GenerationResult(model_cfg.label, t.label, None, None, "error", 0, 0, problem)
            for t in tasks
        ]
    results: list[GenerationResult] = []
    with generation_progress(f"generate {model_cfg.label}") as progress, stop_on_signals():
        for task_cfg in tasks:
            if stop_signal() is not None:
                results.append(not_started(model_cfg, task_cfg))
                continue
            progress.start(task_cfg.label, task_cfg.limit, task_cfg.epochs)
            before = _logs_in(log_dir)
            try:
                # gradebook loads the task, not Inspect: see sweeps.tasks for why
                task = _captured(
                    load_task(task_cfg.task, task_cfg.args), task_cfg, workspaces, log_dir
                )
                # the cap on task images this generation may build (scorers.sandbox.image_cache)
                cap = {CAP_ENV: str((workspaces or WorkspacesConfig()).task_images_max_gb)}
                with during_eval(), environ_set(cap):
                    logs = inspect_eval(
                        task,
                        model=model,
                        limit=task_cfg.limit,
                        epochs=task_cfg.epochs,
                        log_dir=str(log_dir),
                        # None: the task's own; "gradebook": its compose file, in gradebook's
                        sandbox=task_cfg.sandbox,
                        score=False,
                        # keep going past failed samples: they are recorded as errored, not lost
                        fail_on_error=False,
                        retry_on_error=model_cfg.retry_on_error or None,
                        display=display,  # type: ignore[arg-type]
                        tags=["gradebook", model_cfg.label],
                        metadata={
                            "gradebook_model": model_cfg.label,
                            "verifiers": task_verifier_entries(task_cfg, roles),
                            **({"sweep": sweep} if sweep else {}),
                        },
                    )
            except KeyboardInterrupt:  # a Ctrl-C outside the eval's event loop
                if stop_signal() is None:
                    note_stop(signal.SIGINT)
                logs = []
            except Exception as exc:  # a broken task must not stop the other tasks
                results.append(
                    GenerationResult(
                        model_cfg.label, task_cfg.label, None, None, "error", 0, 0, one_line(exc)
                    )
                )
                continue
            if stop_signal() is None and (not logs or any(g.status == "cancelled" for g in logs)):
                note_stop(signal.SIGINT)  # asyncio cancelled the eval on a Ctrl-C
            if not logs and stop_signal() is not None:
                # stopped mid-eval: Inspect wrote the log as cancelled but returned none
                results += _cancelled(model_cfg.label, task_cfg.label, log_dir, before)
                continue
            for log in logs:
                results.append(_result(model_cfg.label, task_cfg.label, log))
    return results


def _captured(
    task: Any, task_cfg: TaskConfig, workspaces: WorkspacesConfig | None, log_dir: Path | str
) -> Any:
    """The task with its samples' sandbox workspaces captured at their end (workspaces.capture;
    a task without a sandbox is left as it is)."""
    from workspaces.capture import CaptureSettings, with_capture
    from workspaces.store import default_store

    ws = workspaces or WorkspacesConfig()
    if not ws.capture:
        return task
    settings = CaptureSettings(
        store=ws.store or default_store(log_dir),
        max_bytes=ws.max_mb * 1024 * 1024,
        paths=tuple(task_cfg.workspace_paths),
    )
    return with_capture(task, settings)


def _plain(exc: BaseException) -> str:
    """An exception as one line of plain text (Inspect words some in rich markup)."""
    from rich.text import Text

    message = getattr(exc, "message", None)
    if message is None:
        return one_line(exc)
    text = Text.from_markup(str(message)).plain.removeprefix("ERROR: ")
    return " ".join(text.replace("\n\n", ". ").split())


def not_started(model_cfg: ModelConfig, task_cfg: TaskConfig) -> GenerationResult:
    """The result of a (model, task) a stopped sweep never reached."""
    return GenerationResult(model_cfg.label, task_cfg.label, None, None, "not started", 0, 0)


def _logs_in(log_dir: Path | str) -> set[str]:
    if isinstance(log_dir, str):  # an object-store prefix: its listing, fresh
        from warehouse.object_store import filesystem

        try:
            fs = filesystem(log_dir)
            fs.invalidate_cache()
            keys = fs.find(log_dir)
        except Exception:  # noqa: BLE001 - nothing listed: a cancelled log is then not named
            return set()
        scheme = log_dir.split("://", 1)[0]
        return {f"{scheme}://{k}" for k in keys if k.endswith((".eval", ".json"))}
    return {str(p) for p in log_dir.iterdir() if p.suffix in (".eval", ".json")}


def _cancelled(
    model: str, task_label: str, log_dir: Path | str, before: set[str]
) -> list[GenerationResult]:
    from inspect_ai.log import read_eval_log, read_eval_log_sample_summaries

    results = []
    for path in sorted(_logs_in(log_dir) - before):
        try:
            header = read_eval_log(path, header_only=True)
            summaries = read_eval_log_sample_summaries(path)
        except Exception:  # noqa: S112 - a log cut short by the stop: nothing to report on
            continue
        generated, errored, cancelled = _counts([s.error for s in summaries])  # messages
        results.append(
            GenerationResult(
                model=model,
                task=task_label,
                log=path,
                run_id=header.eval.eval_id,
                status=header.status,
                samples=generated,
                errored=errored,
                cancelled=cancelled,
            )
        )
    return results


def _counts(errors: list[str | None]) -> tuple[int, int, int]:
    """(generated, errored, cancelled) of samples with these error messages (None: no
    error): one cancelled in flight was not generated."""
    from warehouse.error_text import is_cancellation

    cancelled = sum(1 for e in errors if is_cancellation(e))
    errored = sum(1 for e in errors if e is not None) - cancelled
    return len(errors) - cancelled, errored, cancelled


def _result(model: str, task_label: str, log: Any) -> GenerationResult:
    samples = log.samples or []
    generated, errored, cancelled = _counts([s.error.message if s.error else None for s in samples])
    error = None
    if log.error is not None:
        from warehouse.error_text import readable_error
        from warehouse.logs import server_of

        error = readable_error(log.error.message, log.error.traceback, server_of(log))
    return GenerationResult(
        model=model,
        task=task_label,
        log=log.location or None,
        run_id=log.eval.eval_id,
        status=log.status,
        samples=generated,
        errored=errored,
        error=error,
        cancelled=cancelled,
    )


def config_title(config: SweepConfig | str | Path | None) -> str:
    """`nightly · 2 models × 3 tasks`: a sweep config as a run's name says it; a path is read
    as TOML only (cheap, runs no code), and one that cannot be read is named by its file."""
    if isinstance(config, SweepConfig):
        name, models, tasks = config.name, len(config.models), len(config.tasks)
    else:
        import tomllib

        try:
            raw = tomllib.loads(Path(str(config)).read_text(encoding="utf-8"))
            name = str(raw.get("name") or Path(str(config)).stem)
            models, tasks = len(raw.get("models") or []), len(raw.get("tasks") or [])
        except (OSError, ValueError, TypeError):
            return Path(str(config)).name
    return f"{name} · {count(models, 'model')} × {count(tasks, 'task')}"


def config_tags(cfg: SweepConfig) -> list[str]:
    """The UI's filter tags of a sweep's runs: its name, models, tasks and verifiers."""
    verifiers = {n for t in cfg.tasks for n in task_verifier_names(t, cfg.model_roles)}
    return [
        tag("sweep", cfg.name),
        *(tag("model", m.label) for m in cfg.models),
        *(tag("task", t.label) for t in cfg.tasks),
        *(tag("verifier", v) for v in sorted(verifiers)),
    ]


def _generate_run_name() -> str:
    return f"generate {config_title(parameter('config'))}"


# no cache policy: a generation is never to be served from a cache, and computing the key
# (the task's source, its inputs including the model's scripted outputs) costs every sweep
@task(
    name="generate-model",
    task_run_name=lambda parameters: (
        f"generate {parameters['model_cfg'].label} · {count(len(parameters['tasks']), 'task')}"
    ),
    cache_policy=NO_CACHE,
)
def generate_for_model(
    model_cfg: ModelConfig,
    tasks: list[TaskConfig],
    log_dir: Path | str,
    sweep: str | None = None,
    roles: dict[str, Any] | None = None,
    workspaces: WorkspacesConfig | None = None,
) -> list[GenerationResult]:
    """Prefect task: every task of the sweep with one model (one model server start)."""
    return run_generation(
        model_cfg, tasks, log_dir, sweep=sweep, roles=roles, workspaces=workspaces
    )


@flow(
    name="generate",
    flow_run_name=_generate_run_name,
    log_prints=False,
    on_running=[record_owner],
)
def generate_flow(config: SweepConfig | str) -> list[GenerationResult]:
    """Generate (never score) every (model, task) of a sweep config into its log dir.

    Args:
        config: a SweepConfig or the path of a sweep TOML file.
    """
    cfg = config if isinstance(config, SweepConfig) else load_config(config)
    label_run(tags=config_tags(cfg))
    check_tasks(cfg)
    check_verifiers(cfg)
    return generate_models(cfg)


def generate_models(cfg: SweepConfig) -> list[GenerationResult]:
    """Run the generate-model task for each model in turn (called inside a flow); once a
    signal stopped it, the pairs not reached are "not started"."""
    results: list[GenerationResult] = []
    for model_cfg in cfg.models:
        if stop_signal() is not None:
            results += [not_started(model_cfg, t) for t in cfg.tasks]
            continue
        tags = [tag("model", model_cfg.label), *(tag("task", t.label) for t in cfg.tasks)]
        results += generate_for_model.with_options(tags=tags)(
            model_cfg,
            cfg.tasks,
            cfg.log_dir,
            sweep=cfg.name,
            roles=cfg.model_roles or None,
            workspaces=cfg.workspaces,
        )
    return results
