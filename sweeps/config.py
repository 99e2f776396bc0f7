"""The sweep config: one TOML file naming the models, the tasks, the verifiers and the gates.

Validated on load with pydantic. A bad file never gets as far as a model call: every problem is
reported as one line naming the file, the key and what is allowed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from gates.rules import GateRules
from warehouse.inflate import MB, InflateLimits
from warehouse.object_store import UnsupportedLocation, is_url, require_supported

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "IngestConfig",
    "ModelConfig",
    "RoleModel",
    "SweepConfig",
    "TaskConfig",
    "WorkspacesConfig",
    "load_config",
    "parse_config",
    "role_bindings",
]

# Inspect model strings are "<provider>/<name>[/...]"; anything without a provider is a typo.
_MODEL_RE = re.compile(r"^[A-Za-z0-9_.-]+/.+$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ConfigError(ValueError):
    """A sweep config that cannot be used; the message names the file, the key and the fix."""


class _Strict(BaseModel):
    # forbid: a misspelt key must be an error, not a silently ignored setting
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """One model (checkpoint) to generate with.

    Attributes:
        model: an Inspect model string, e.g. "vllm/Qwen/Qwen2.5-7B", "openai-api/local/ckpt-42",
            "mockllm/model".
        name: a short label for tables; defaults to the model string.
        base_url: the server to talk to; for "vllm/" without it Inspect starts `vllm serve`.
        args: model args passed to the provider (Inspect's `model_args`).
        config: generation config (Inspect `GenerateConfig` fields: temperature, max_tokens,
            max_retries, timeout, max_connections, ...).
        work_pool: the Prefect work pool generation runs on when deployed.
        retry_on_error: how many times Inspect re-runs a sample whose generation errored.
        args_from: "module:function" returning more model args (merged under `args`). It is
            called wherever the config is loaded, so in cluster mode it runs on the GPU worker:
            the way to give a model arg that is a Python object (a client, mockllm's
            `custom_outputs`), which cannot travel to a worker as JSON.
    """

    model: str
    name: str | None = None
    base_url: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    work_pool: str = "gpu"
    retry_on_error: Annotated[int, Field(ge=0, le=20)] = 2
    args_from: str | None = None
    _declared_args: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("args_from")
    @classmethod
    def _factory_spec(cls, v: str | None) -> str | None:
        if v is not None and not _FACTORY_RE.match(v):
            raise ValueError("must be 'module:function', e.g. 'my_models:offline_args'")
        return v

    @model_validator(mode="after")
    def _merge_factory_args(self) -> ModelConfig:
        self._declared_args = dict(self.args)
        if self.args_from:
            # frozen model: the merged args are set once, here, while it is being built
            object.__setattr__(self, "args", {**_call_args_factory(self.args_from), **self.args})
        return self

    @field_serializer("args")
    def _dump_declared_args(self, args: dict[str, Any]) -> dict[str, Any]:
        # what was written in the config: the factory runs again wherever it is loaded
        return self._declared_args if self.args_from else args

    @field_validator("model")
    @classmethod
    def _model_string(cls, v: str) -> str:
        if not _MODEL_RE.match(v):
            raise ValueError(
                "must be an Inspect model string '<provider>/<name>', e.g. 'vllm/<name>', "
                "'openai-api/<svc>/<name>' or 'mockllm/model'"
            )
        return v

    @field_validator("config")
    @classmethod
    def _generate_config(cls, v: dict[str, Any]) -> dict[str, Any]:
        from inspect_ai.model import GenerateConfig

        unknown = sorted(set(v) - set(GenerateConfig.model_fields))
        if unknown:
            allowed = ", ".join(sorted(GenerateConfig.model_fields))
            raise ValueError(f"unknown generation setting(s) {unknown}; allowed: {allowed}")
        GenerateConfig(**v)  # type errors surface here with the field name
        return v

    @property
    def label(self) -> str:
        return self.name or self.model


class RoleModel(_Strict):
    """A model bound to a named role (Inspect's model roles): `[model_roles.grader]` is the
    judge that judge-graded scorers grade with (scorers.inspect_scorers.judges).

    Attributes:
        model: an Inspect model string, as for `[[models]]`.
        base_url: the judge's server (else the provider's variable, e.g. `JUDGE_BASE_URL`).
        args: model args (Inspect's `model_args`); never a key (`api_key`): the binding is
            stored with the verifier's spec, so a key stays in the environment variable the
            provider reads. The OpenAI and Anthropic SDKs' own retries are off
            (`max_retries = 0`) unless set here: Inspect's `config.max_retries` retries.
        config: generation config; `max_connections`, `max_retries`, `timeout` and
            `attempt_timeout` are the judge's own limits in the scoring stage (not part of
            the verifier's identity); the rest (temperature, max_tokens, ...) is.
    """

    model: str
    base_url: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)

    _model_string = field_validator("model")(ModelConfig._model_string.__func__)  # type: ignore[attr-defined]
    _generate_config = field_validator("config")(ModelConfig._generate_config.__func__)  # type: ignore[attr-defined]

    @model_validator(mode="before")
    @classmethod
    def _derived_env(cls, data: Any) -> Any:
        # `env` in a binding read back (a stored spec, pasted as --model-role JSON) is derived
        # from the rest (`to_json`), never an input
        if isinstance(data, Mapping) and "env" in data:
            data = {k: v for k, v in data.items() if k != "env"}
        return data

    @model_validator(mode="after")
    def _no_secret(self) -> RoleModel:
        from scorers.inspect_scorers.judge_roles import credential_env, secret_settings

        found = secret_settings({"args": self.args, "config": self.config})
        if found:
            var = credential_env(self.to_json()).get("api_key") or "the provider's variable"
            raise ValueError(
                f"{found[0]} holds a secret, which would be stored with the verifier's spec in "
                f"logs and the warehouse; put the key in {var} in the environment instead"
            )
        return self

    @property
    def label(self) -> str:
        return self.model

    def to_json(self) -> dict[str, Any]:
        """The binding a scorer spec carries (`ScorerSpec.roles`): what the judge is, and the
        names (never the values) of the environment variables it reads a key or URL from."""
        from scorers.inspect_scorers.judge_roles import client_args, credential_env

        out: dict[str, Any] = {"model": self.model, "args": client_args(self.model, self.args),
                               "config": dict(self.config)}  # fmt: skip
        if self.base_url:
            out["base_url"] = self.base_url
        env = credential_env(out)
        if env:
            out["env"] = env
        return out


def role_bindings(roles: Mapping[str, RoleModel] | None) -> dict[str, dict[str, Any]]:
    """role name -> the binding a scorer spec carries (`RoleModel.to_json()`)."""
    return {name: role.to_json() for name, role in (roles or {}).items()}


class TaskConfig(_Strict):
    """One Inspect task and the verifiers that score it.

    Attributes:
        task: an Inspect task spec, "path/to/file.py@task_name", or a registered task name.
        args: task args (Inspect's `task_args`).
        limit: score only the first N samples (None: all).
        epochs: how many times each sample is generated.
        verifiers: what scores it: gradebook verifier names (see `gradebook verifiers`),
            Inspect scorers by registry name (`match`, `inspect_evals/...`), `file.py@scorer`,
            or tables `{scorer = "...", params = {...}, name = "..."}`
            (scorers.inspect_scorers.specs); empty (the default): the task's own scorers.
        workspace_paths: for a task with a sandbox, the paths in it whose files are captured
            at the end of each sample (absolute); empty: the task's own
            `metadata["workspace_paths"]`, else each sandbox's working directory.
        sandbox: the sandbox provider its samples run in instead of the task's own (Inspect's
            `eval(sandbox=...)`); "gradebook" runs a task written for Inspect's
            `("docker", "compose.yaml")` in gradebook's sandbox, with the same compose file.
    """

    task: str
    args: dict[str, Any] = Field(default_factory=dict)
    limit: Annotated[int, Field(ge=1)] | None = None
    epochs: Annotated[int, Field(ge=1, le=1000)] = 1
    verifiers: list[str | dict[str, Any]] = Field(default_factory=list)
    workspace_paths: list[str] = Field(default_factory=list)
    sandbox: str | None = None

    @field_validator("sandbox")
    @classmethod
    def _sandbox(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must name a sandbox provider, e.g. 'gradebook'")
        return v.strip() if v else None

    @field_validator("workspace_paths")
    @classmethod
    def _workspace_paths(cls, v: list[str]) -> list[str]:
        from workspaces.archive import ArchiveError, check_roots

        if not v:
            return v
        try:
            check_roots(v)
        except ArchiveError as exc:
            raise ValueError(f"{exc}; give absolute paths inside the sandbox, e.g. /work") from None
        return v

    @field_validator("task")
    @classmethod
    def _task_spec(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be an Inspect task spec like 'tasks/math.py@math_verified'")
        return v.strip()

    @property
    def label(self) -> str:
        return self.task.rsplit("@", 1)[-1] if "@" in self.task else self.task


class ClusterConfig(_Strict):
    """`[cluster]`: run the sweep on Prefect work pools instead of in this process.

    Present means cluster mode: each model's generation goes to its `work_pool` (a
    `cluster-generate/<pool>` deployment), each score chunk to `score_pool`. Logs, manifests,
    chunks and staged scores go through a bucket (or a shared directory); only this process
    opens the warehouse.

    Attributes:
        staging_dir: where generate manifests, chunk inputs and staged score files pass between
            this host and the workers: a bucket prefix (`s3://bucket/prefix`, nothing shared
            but the bucket) or a directory every worker and this host see (relative: to the
            config).
        score_pool: the work pool that runs score chunks.
        chunk_size: samples per score flow run (each run costs seconds of dispatch overhead,
            so chunks should take much longer than that to grade).
        chunk_retries: how many times a crashed or failed chunk is dispatched again.
        grading_workers: grading processes per chunk on a CPU worker (default: its CPU count).
        stage_timeout_s: give up waiting for a stage after this long.
    """

    staging_dir: Path | str = Path("staging")
    score_pool: str = "cpu"
    chunk_size: Annotated[int, Field(ge=1, le=1_000_000)] = 2000
    chunk_retries: Annotated[int, Field(ge=0, le=20)] = 2
    grading_workers: Annotated[int, Field(ge=1)] | None = None
    stage_timeout_s: Annotated[float, Field(gt=0)] = 24 * 3600.0

    @field_validator("staging_dir", mode="before")
    @classmethod
    def _staging(cls, v: Any) -> Any:
        return _path_or_url(v)


class IngestConfig(_Strict):
    """`[ingest]`: how far a log's zip members may inflate when it is read into the warehouse
    (warehouse.inflate; docs/design/ingest.md says why the defaults). A flag of the same name
    (`--max-member-mb`, ...) or its environment variable wins over these.

    Attributes:
        max_member_mb: most MB one member (a sample, the header; a whole `.json` log) inflates to.
        max_log_mb: most MB the members read from one log inflate to, together.
        max_inflate_ratio: past 16 MB, most times its compressed size a member inflates to.
    """

    max_member_mb: Annotated[float, Field(gt=0)] | None = None
    max_log_mb: Annotated[float, Field(gt=0)] | None = None
    max_inflate_ratio: Annotated[float, Field(ge=1)] | None = None

    def limits(self) -> InflateLimits:
        """These limits, the defaults where unset, then the environment's over them."""
        values = {
            "member_bytes": None if self.max_member_mb is None else int(self.max_member_mb * MB),
            "log_bytes": None if self.max_log_mb is None else int(self.max_log_mb * MB),
            "ratio": self.max_inflate_ratio,
        }
        base = InflateLimits(**{k: v for k, v in values.items() if v is not None})
        return InflateLimits.from_env(base)


class WorkspacesConfig(_Strict):
    """`[workspaces]`: the sandbox workspaces of agentic tasks, captured at generation so that
    sandbox scorers re-score from the log (docs/concepts/workspaces.md).

    Attributes:
        capture: archive each sample's sandbox workspace when its generation ends.
        store: the workspace store: a directory (relative paths: to the config file) or a
            bucket prefix (`s3://bucket/prefix`); default: `workspaces` in the log dir.
        max_mb: cap on one workspace archive, in MiB of uncompressed tar; a bigger workspace
            is a failed capture (its sandbox scorers leave the sample unscored).
        task_images_max_gb: disk cap on the task images gradebook builds (tasks that bring
            their image); past it the least recently used of this user's are removed.
    """

    capture: bool = True
    store: Path | str | None = None
    max_mb: Annotated[int, Field(ge=1, le=1024)] = 64
    task_images_max_gb: Annotated[float, Field(gt=0)] = 50.0

    @field_validator("store", mode="before")
    @classmethod
    def _store(cls, v: Any) -> Any:
        return _path_or_url(v)


def _path_or_url(v: Any) -> Any:
    """A location key's value: an object-store URL stays text (pathlib would make
    `s3://b/x` the local folder `s3:/b/x`), anything else is a path; another scheme is
    refused by name."""
    if isinstance(v, str) and "://" in v:
        try:
            return require_supported(v, "the URL") if is_url(v) else Path(v[len("file://") :])
        except UnsupportedLocation as exc:
            raise ValueError(str(exc)) from None
    return Path(v) if isinstance(v, str) else v


class SweepConfig(_Strict):
    """A whole sweep: every (model, task) pair is generated, scored and gated.

    Attributes:
        name: the sweep's name (also the Prefect deployment name under `gradebook serve`).
        schedule: an optional cron string; `gradebook serve` runs the sweep on it.
        log_dir: where Inspect writes the .eval logs (relative paths: to the config file); an
            `s3://bucket/prefix` URL keeps them in object storage (a `str`, never a Path).
        warehouse: the DuckDB file (relative paths: to the config file).
        verifier_modules: extra Python modules to import so the verifiers they register exist.
        cluster: `[cluster]` settings; absent (the default) runs everything in this process.
        model_roles: models bound to roles by name; `grader` is the judge of judge-graded
            scorers (`[model_roles.grader] model = "..."`).
        ingest: `[ingest]` limits on reading the sweep's logs.
        workspaces: `[workspaces]`: capture of sandbox workspaces and where they are stored.
        scored_logs: write a scored copy of each log the sweep generated, for `inspect view`
            (the original logs are never changed).
        scored_log_dir: where those copies go (default: beside `log_dir`, named
            `<log_dir>-scored`; relative paths: to the config file); an `s3://` URL too.
    """

    name: str
    schedule: str | None = None
    log_dir: Path | str = Path("logs")
    warehouse: Path = Path("gradebook.duckdb")
    verifier_modules: list[str] = Field(default_factory=list)
    models: list[ModelConfig] = Field(min_length=1)
    tasks: list[TaskConfig] = Field(min_length=1)
    gates: GateRules = Field(default_factory=GateRules)
    cluster: ClusterConfig | None = None
    model_roles: dict[str, RoleModel] = Field(default_factory=dict)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    workspaces: WorkspacesConfig = Field(default_factory=WorkspacesConfig)
    scored_logs: bool = True
    scored_log_dir: Path | str | None = None
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("warehouse", mode="before")
    @classmethod
    def _local_path(cls, v: Any) -> Any:
        # pathlib reads "s3://bucket/x" as the local folder "s3:/bucket/x": say so instead
        if isinstance(v, str) and "://" in v:
            raise ValueError(
                f"{v!r} is a URL; the warehouse is a DuckDB file on this machine (one writer, "
                "principle 8): give a local path"
            )
        return v

    @field_validator("log_dir", "scored_log_dir", mode="before")
    @classmethod
    def _log_location(cls, v: Any) -> Any:
        # an object-store URL stays a string (pathlib would read "s3://b/x" as the folder
        # "s3:/b/x"); `file://` is a local path; any other scheme is named, never a folder
        from warehouse.object_store import (
            UnsupportedLocation,
            is_url,
            local_path,
            require_supported,
        )

        if not isinstance(v, str):
            return v
        try:
            require_supported(v, "this key's")
        except UnsupportedLocation as exc:
            raise ValueError(str(exc)) from None
        return v.rstrip("/") if is_url(v) else local_path(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names a deployment)")
        return v

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is None:
            return v
        # Prefect's own validator, so a schedule that loads here is one the server accepts.
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=v)
        except ValidationError:
            raise ValueError(
                f"{v!r} is not a cron string; use five fields, e.g. '0 3 * * *' (03:00 daily)"
            ) from None
        return v

    @model_validator(mode="after")
    def _unique_labels(self) -> SweepConfig:
        for kind, labels in (
            ("models", [m.label for m in self.models]),
            ("tasks", [(t.task, repr(sorted(t.args.items()))) for t in self.tasks]),
        ):
            dupes = sorted({str(x) for x in labels if labels.count(x) > 1})
            if dupes:
                raise ValueError(f"{kind}: duplicate entries {dupes}; give each a distinct name")
        return self

    def pairs(self) -> list[tuple[ModelConfig, TaskConfig]]:
        """Every (model, task) pair, grouped by model so a model server is started once."""
        return [(m, t) for m in self.models for t in self.tasks]


def _loc(loc: tuple[Any, ...], raw: dict[str, Any]) -> str:
    """Render a pydantic error location the way the user wrote it in TOML."""
    parts: list[str] = []
    node: Any = raw
    for item in loc:
        if isinstance(item, int):
            # [[models]] entries are easier to find by their model string than by index
            label = ""
            if isinstance(node, list) and item < len(node) and isinstance(node[item], dict):
                entry = node[item]
                label = entry.get("name") or entry.get("model") or entry.get("task") or ""
            parts[-1] = f"{parts[-1]}[{item}]" + (f" ({label})" if label else "")
            node = node[item] if isinstance(node, list) and item < len(node) else None
        elif isinstance(node, dict) or not parts:
            parts.append(str(item))
            node = node.get(item) if isinstance(node, dict) else None
        # else: a union branch name pydantic appends past the user's value; not a key
    return ".".join(parts) or "(top level)"


def _message(err: dict[str, Any]) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return _unknown_key(err["loc"])
    if err["type"] == "missing":
        return "required key is missing"
    return msg


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """`unknown key; did you mean 'name'?` with the keys allowed where it was written."""
    import difflib

    allowed = _keys_at(loc[:-1])
    if not allowed:
        return "unknown key; check the spelling (docs/reference/config.md lists every key)"
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]!r}? " if close else ""
    if "config" in allowed and not close:
        setting = _generate_setting(str(loc[-1]))
        if setting:  # a generation setting written beside the model, not in its config
            return (
                f"unknown key; a generation setting ({setting!r}) goes in the model's config: "
                f"config = {{ {setting} = ... }} (keys here: {', '.join(allowed)})"
            )
    return f"unknown key; {guess}keys here: {', '.join(allowed)}"


def _generate_setting(key: str) -> str | None:
    """The Inspect GenerateConfig field `key` is, or is a typo of (None: neither)."""
    import difflib

    from inspect_ai.model import GenerateConfig

    fields = sorted(GenerateConfig.model_fields)
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.8)
    return close[0] if close else None


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys a config allows at a location (the model of the table written there)."""
    import typing

    model: Any = SweepConfig
    is_mapping = False
    for item in loc:
        if isinstance(item, int):
            continue
        if is_mapping:  # `model_roles.grader`: a key of the user's, not a field
            is_mapping = False
            continue
        field = model.model_fields.get(item) if isinstance(model, type) else None
        if field is None:
            return []
        model, is_mapping = None, False
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                model = t
                break
            if typing.get_origin(t) in (dict, Mapping):
                is_mapping = True
            stack.extend(typing.get_args(t))
        if model is None:
            return []
    fields = model.model_fields
    return [name for name, f in fields.items() if not f.exclude]


def parse_config(raw: dict[str, Any], *, source: Path | str = "<config>") -> SweepConfig:
    """Validate an already-parsed TOML mapping.

    Args:
        raw: the TOML document as a dict.
        source: the file it came from; named in errors and used to resolve relative paths.

    Raises:
        ConfigError: naming the file, the key and what is allowed.
    """
    source = Path(source)
    try:
        cfg = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        # one line per key: for a union the first branch's complaint is the useful one
        lines: dict[str, str] = {}
        for e in exc.errors():
            lines.setdefault(_loc(e["loc"], raw), _message(e))
        raise ConfigError("\n".join(f"{source}: {k}: {v}" for k, v in lines.items())) from None
    base = source.parent if source.suffix else Path.cwd()
    _import_verifier_modules(cfg.verifier_modules, source)
    tasks = [
        _resolve_verifiers(_resolve_task(t, base, source, i), base, source, i, cfg.model_roles)
        for i, t in enumerate(cfg.tasks)
    ]
    log_dir = _resolve_log_location(cfg.log_dir, base)
    store = cfg.workspaces.store
    scored = _resolve_log_location(cfg.scored_log_dir, base) if cfg.scored_log_dir else None
    if scored is not None and _inside(scored, log_dir):
        raise ConfigError(
            f"{source}: scored_log_dir: {scored} is inside log_dir ({log_dir}), where the copies "
            "would be taken for logs of their own; put it beside log_dir (or leave it out: "
            f"{_name_of(log_dir)}-scored)"
        )
    return cfg.model_copy(
        update={
            "log_dir": log_dir,
            "warehouse": _resolve(cfg.warehouse, base),
            "tasks": tasks,
            "cluster": _resolve_cluster(cfg.cluster, base),
            "workspaces": cfg.workspaces.model_copy(
                update={"store": _resolve(store, base) if store else _beside(log_dir, "workspaces")}
            ),
            # beside the logs, not among them: a later `score LOG_DIR` must not take the
            # copies for logs of their own
            "scored_log_dir": scored or _sibling(log_dir, f"{_name_of(log_dir)}-scored"),
            "source": source,
        }
    )


def load_config(path: Path | str) -> SweepConfig:
    """Read and validate a sweep TOML file.

    Raises:
        ConfigError: the file is missing, is not TOML, or does not validate.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; pass the path of a sweep TOML file") from None
    except IsADirectoryError:
        found = sorted(p.name for p in path.glob("*.toml"))[:3]
        hint = f" (here: {', '.join(found)})" if found else ""
        raise ConfigError(
            f"{path}: is a directory, not a sweep config; pass the path of its .toml file{hint}"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{path}: no permission to read it; check its owner and mode (`ls -l {path}`)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not text (byte {exc.start} is not UTF-8), so not a sweep config; pass "
            "the sweep's .toml file"
        ) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, source=path)


def _resolve(p: Any, base: Path) -> Any:
    """A path relative to the config's directory made absolute; a URL as it is."""
    if isinstance(p, str) and is_url(p):
        return p  # a bucket prefix: nothing to resolve
    return p if p.is_absolute() else (base / p).resolve()


def _resolve_log_location(p: Path | str, base: Path) -> Path | str:
    """A local directory resolved against the config's folder; an object-store URL as given."""
    return p if isinstance(p, str) else _resolve(p, base)


def _name_of(location: Path | str) -> str:
    return location.rstrip("/").rsplit("/", 1)[-1] if isinstance(location, str) else location.name


def _sibling(location: Path | str, name: str) -> Path | str:
    if isinstance(location, str):
        return f"{location.rstrip('/').rsplit('/', 1)[0]}/{name}"
    return location.with_name(name)


def _beside(location: Path | str, name: str) -> Any:
    # the workspace store under an s3:// log_dir is a URL too (workspaces.store reads it)
    return f"{location.rstrip('/')}/{name}" if isinstance(location, str) else location / name


def _inside(inner: Path | str, outer: Path | str) -> bool:
    if isinstance(inner, str) or isinstance(outer, str):
        a, b = str(inner).rstrip("/"), str(outer).rstrip("/")
        return a == b or a.startswith(b + "/")
    return inner == outer or outer in inner.parents


def _resolve_cluster(cluster: ClusterConfig | None, base: Path) -> ClusterConfig | None:
    if cluster is None:
        return None
    return cluster.model_copy(update={"staging_dir": _resolve(cluster.staging_dir, base)})


def _find(relative: Path, base: Path, *, dirs: bool = False) -> Path | None:
    """The file (or, with `dirs`, directory) next to the config, else in the current directory.

    The config's directory comes first so a config can be run from anywhere; the current
    directory second so a path written for the directory one runs from still works.
    """
    for root in (base, Path.cwd()):
        path = root / relative
        if path.is_file() or (dirs and path.is_dir()):
            return path.resolve()
    return None


def _resolve_verifiers(
    task: TaskConfig, base: Path, source: Path, index: int, roles: dict[str, RoleModel]
) -> TaskConfig:
    """Each `verifiers` entry resolved now (a bad one is one line naming the entry), kept as
    the user wrote it but with a scorer file's path made absolute and a judge scorer's grader
    bound (`[model_roles.grader]`)."""
    if not task.verifiers:
        return task  # the task's own scorers, read when the task is loaded (verifiers.specs)
    from scorers.inspect_scorers.specs import SpecError, resolve, spec_of, with_roles

    bindings = role_bindings(roles)

    entries: list[str | dict[str, Any]] = []
    for entry in task.verifiers:
        try:
            spec = with_roles(spec_of(entry, base=base), bindings)
            verifier = resolve(spec, trusted=True)
        except SpecError as exc:
            where = f"{source}: tasks[{index}] ({task.task}).verifiers"
            plain_name = isinstance(entry, str) and "/" not in entry and not entry.endswith(".py")
            if plain_name and str(exc).startswith("unknown verifier"):
                from scorers.inspect_scorers.specs import did_you_mean
                from scorers.registry import all_verifiers

                known = sorted(n for n, v in all_verifiers().items() if v.spec is None)
                raise ConfigError(
                    f"{where}: unknown verifier(s) [{entry!r}]{did_you_mean(entry)}; "
                    f"registered: {', '.join(known)}; "
                    "or an Inspect scorer: a registry name (match, choice, ...), "
                    "inspect_evals/NAME, or FILE.py@NAME"
                ) from None
            raise ConfigError(f"{where}: {exc}") from None
        entries.append(entry if isinstance(spec, str) else dict(verifier.spec or {}))
    return task.model_copy(update={"verifiers": entries})


def _resolve_task(task: TaskConfig, base: Path, source: Path, index: int) -> TaskConfig:
    # A registered task name (no ".py") is left for Inspect to look up.
    args = _resolve_args(task.args, base)
    file, sep, name = task.task.partition("@")
    if not file.endswith(".py"):
        return task.model_copy(update={"args": args})
    candidate = Path(file)
    if not candidate.is_absolute():
        candidate = _find(candidate, base) or candidate
    if not candidate.is_file():
        raise ConfigError(
            f"{source}: tasks[{index}].task: file {file!r} not found (looked next to the config and in the "
            "current directory); give a path to a .py file with an @task, or a task name"
        )
    return task.model_copy(update={"task": f"{candidate}{sep}{name}", "args": args})


def _resolve_args(value: Any, base: Path) -> Any:
    """Task args with each relative path made absolute the way a task file's path is.

    Without this a relative data path meant the current directory for a task name but the task
    file's directory for a file spec (the file loads there). Only a string that looks like a
    path (a "/" or an extension) and names an existing file or directory is changed: a word
    ("train"), a dataset id ("openai/gsm8k") or a URL reaches the task as written.
    """
    if isinstance(value, dict):
        return {k: _resolve_args(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_args(v, base) for v in value]
    if not isinstance(value, str) or not ("/" in value or Path(value).suffix):
        return value
    path = Path(value)
    found = None if path.is_absolute() else _find(path, base, dirs=True)
    return str(found) if found else value


def _call_args_factory(spec: str) -> dict[str, Any]:
    import importlib

    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"args_from: cannot load {spec!r} ({exc}); install the module or put it on PYTHONPATH"
        ) from None
    args = factory()
    if not isinstance(args, dict):
        raise ValueError(f"args_from: {spec} returned {type(args).__name__}, not a dict of args")
    return args


def _import_verifier_modules(modules: list[str], source: Path) -> None:
    import importlib

    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise ConfigError(
                f"{source}: verifier_modules: cannot import {mod!r} ({exc}); install it or "
                "put its directory on PYTHONPATH"
            ) from None
        # the module's own code failed (sys.exit() at import included): a bad config
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            from warehouse.error_text import import_error

            raise ConfigError(
                f"{source}: verifier_modules: importing {mod!r} raised {import_error(exc)}; "
                "fix the module, or remove it from verifier_modules"
            ) from None
