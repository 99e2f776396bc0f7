"""Before generating: is each model's environment complete, and does its server answer?

Inspect finds a model server's URL and key in the environment (`openai-api/<svc>/<name>` reads
`<SVC>_BASE_URL` and `<SVC>_API_KEY`; `vllm/` reads `VLLM_BASE_URL`), and when a server is down
it retries each request for minutes before a sample errors with an opaque `RetryError`. So a
sweep checks both first: a missing variable is a config error (one line, exit 2, before
Prefect starts), and a server that does not answer one cheap request fails that model's pairs
in seconds with one line naming the URL and the cause, while the other models still run.
"""

from __future__ import annotations

import http.client
import os
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass

from sweeps.config import ConfigError, ModelConfig, RoleModel, SweepConfig

__all__ = [
    "CHECK_TIMEOUT_S",
    "Endpoint",
    "check_model_env",
    "endpoint",
    "env_problem",
    "judge_problem",
    "server_problem",
]

# Long enough for a loaded server to accept a connection and answer a listing, short enough
# that a dead one costs seconds, not the minutes of Inspect's retries.
CHECK_TIMEOUT_S = 5.0

# Providers that talk to a server at a base URL from the environment (when the config gives
# none): the local model servers gradebook generates against.
_BASE_URL_VARS = {"vllm": "VLLM_BASE_URL", "sglang": "SGLANG_BASE_URL"}


@dataclass(frozen=True)
class Endpoint:
    """Where a model's requests go: `url`, and where that came from (`base_url` or a variable)."""

    url: str
    source: str


def _service_env(model: str) -> str | None:
    """`LOCAL` for `openai-api/local/<name>` (Inspect's env-var prefix), else None."""
    provider, _, rest = model.partition("/")
    if provider != "openai-api" or "/" not in rest:
        return None
    return rest.split("/", 1)[0].upper().replace("-", "_")


def endpoint(cfg: ModelConfig | RoleModel) -> Endpoint | None:
    """The server a model's requests go to, as Inspect will resolve it; None when the provider
    starts its own server or is a hosted API with its built-in URL."""
    if cfg.base_url:
        return Endpoint(cfg.base_url, "base_url")
    service = _service_env(cfg.model)
    var = f"{service}_BASE_URL" if service else _BASE_URL_VARS.get(cfg.model.split("/", 1)[0])
    if var and os.environ.get(var):
        return Endpoint(os.environ[var], var)
    return None


def check_model_env(cfg: SweepConfig) -> None:
    """Every variable Inspect needs for an `openai-api/` model is set (or given in the config).

    Raises:
        ConfigError: one line naming the config, the model and the variable to set.
    """
    named = [(f"models[{i}] ({m.label})", m) for i, m in enumerate(cfg.models)]
    named += [(f"model_roles.{name}", m) for name, m in cfg.model_roles.items()]
    for key, m in named:
        problem = env_problem(m)
        if problem is not None:
            raise ConfigError(f"{cfg.source}: {key}: {problem}")


def env_problem(m: ModelConfig | RoleModel) -> str | None:
    """What this process's environment lacks for the model (Inspect reads an `openai-api/`
    model's key and URL from variables), as one line ending in the fix; None: nothing."""
    service = _service_env(m.model)
    if service is None:
        return None
    key_var = str(m.args.get("api_key_var") or f"{service}_API_KEY")
    if not m.args.get("api_key") and not os.environ.get(key_var):
        return (
            f"{m.model} needs {key_var} in the environment (Inspect's openai-api provider "
            f"reads the API key from it; any value for a server without auth): "
            f"export {key_var}=..."
        )
    if endpoint(m) is None:
        return (
            f"{m.model} needs a server URL: set base_url in the config, or "
            f"export {service}_BASE_URL=http://host:port/v1"
        )
    return None


def server_problem(cfg: ModelConfig | RoleModel, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """One line saying why the model's server does not answer, or None when it answers (any
    HTTP response counts: a 401 or 404 still proves a server is there) or has no URL to check.

    The request is one GET of `<url>/models`, the OpenAI-compatible listing vLLM serves.
    """
    point = endpoint(cfg)
    if point is None:
        return None
    url = point.url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):  # noqa: S310 - the config's URL
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        cause = _cause(exc, timeout_s)
    fix = "base_url in the config" if point.source == "base_url" else point.source
    return (
        f"model server {point.url} ({point.source}) for {cfg.label} does not answer: {cause}; "
        f"start it, or fix {fix}"
    )


def judge_problem(verifier_spec: dict | None) -> str | None:
    """Why the judge an Inspect scorer verifier grades with does not answer (its spec's
    `grader` binding), or None: it answers, or has no URL to check, or the verifier has none.
    The watcher's cheap health check before it re-judges `grader_failed` samples."""
    binding = ((verifier_spec or {}).get("roles") or {}).get("grader")
    if not binding:
        return None
    # not validated: a binding an older gradebook stored may hold what a config may no longer
    return server_problem(
        RoleModel.model_construct(model=str(binding.get("model")), base_url=binding.get("base_url"))
    )


def _cause(exc: BaseException, timeout_s: float) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"no answer within {timeout_s:g} s"
    if isinstance(reason, socket.gaierror):
        return f"host not found ({reason.strerror or reason})"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(reason, ValueError):
        return f"not a usable URL ({reason})"
    text = getattr(reason, "strerror", None) or str(reason)
    return " ".join(f"{type(reason).__name__}: {text}".split())
