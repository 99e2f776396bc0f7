"""What a judge's role binding may hold and what it leaves to the environment.

A binding (`[model_roles.grader]`, `--model-role`) is stored with the verifier's spec in logs
and the warehouse, so every later command rebuilds the judge from it (verifiers.stored).
It therefore never holds a secret: a key stays in the environment variable the provider reads,
and the binding keeps that variable's *name* (`credential_env`), so a command on a machine
without it says exactly what to export.

Kept apart from `judges` (what a grading process runs, and so part of every Inspect scorer's
fingerprint): nothing here decides a verdict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["client_args", "credential_env", "missing_credentials", "secret_settings"]

_SECRET_ARG = ("key", "token", "secret", "password", "credential")
_SECRET_HEADER = ("authorization", "cookie", "key", "token", "secret")

# Inspect providers whose client is the OpenAI (or Anthropic) SDK, which retries a failed
# request twice by itself, under each of Inspect's attempts: "failed after 3 attempt(s)" was 9
# requests. A binding gets `args.max_retries = 0` for them unless it sets its own, so there is
# one layer of retries, Inspect's (`config.max_retries`), with its backoff and its evidence.
_SDK_RETRYING = frozenset(
    {"openai", "openai-api", "vllm", "sglang", "together", "fireworks", "openrouter",
     "deepseek", "ollama", "anthropic"}
)  # fmt: skip
# providers that need no key (a local server, an in-process model); the others read
# `<PROVIDER>_API_KEY` unless named in _KEY_VARS
_KEYLESS = frozenset(
    {"vllm", "vllm-completions", "sglang", "ollama", "hf", "llama-cpp-python", "mockllm",
     "none", "transformer_lens", "nnterp", "bedrock", "sagemaker"}
)  # fmt: skip
_KEY_VARS = {"grok": "XAI_API_KEY"}


def _provider(role: Mapping[str, Any]) -> tuple[str, str]:
    provider, _, rest = str(role.get("model") or "").partition("/")
    return provider, rest


def client_args(model: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The role's model args, with the SDK's own retries off where its client has them."""
    out = dict(args)
    if model.split("/", 1)[0] in _SDK_RETRYING:
        out.setdefault("max_retries", 0)
    return out


def credential_env(role: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables a role's provider reads for what the binding leaves out, by
    purpose ("api_key", "base_url"): names only, what a stored spec keeps instead of a key.

    `openai-api/<svc>/<model>` reads `<SVC>_API_KEY` (or the variable its `api_key_var` arg
    names) and, without a base URL, `<SVC>_BASE_URL`, as Inspect's provider does; a hosted
    provider its `<PROVIDER>_API_KEY`; a local one nothing."""
    provider, rest = _provider(role)
    args = role.get("args") or {}
    if provider in ("openai-api", "openai-api-completions") and "/" in rest:
        service = rest.split("/", 1)[0].upper().replace("-", "_")
        out = {"api_key": str(args.get("api_key_var") or f"{service}_API_KEY")}
        if not role.get("base_url"):
            out["base_url"] = f"{service}_BASE_URL"
        return out
    if not provider or provider in _KEYLESS:
        return {}
    return {"api_key": _KEY_VARS.get(provider, f"{provider.upper().replace('-', '_')}_API_KEY")}


def missing_credentials(role: Mapping[str, Any]) -> list[str]:
    """The variables of `role["env"]` (else `credential_env(role)`) that are not set here."""
    env = role.get("env")
    names = env.values() if isinstance(env, Mapping) else credential_env(role).values()
    return [str(var) for var in names if not os.environ.get(str(var))]


def secret_settings(role: Mapping[str, Any]) -> list[str]:
    """Settings of a binding that hold a secret (`args.api_key`, an `Authorization` header),
    as dotted paths: a binding is stored in logs and the warehouse, so none may."""
    found = []
    for key, value in (role.get("args") or {}).items():
        lowered = str(key).lower()
        named = lowered.endswith(("_var", "_env"))  # a variable's name, not its value
        if value and not named and any(s in lowered for s in _SECRET_ARG):
            found.append(f"args.{key}")
    headers = (role.get("config") or {}).get("extra_headers") or {}
    for key, value in headers.items() if isinstance(headers, Mapping) else []:
        if value and any(s in str(key).lower() for s in _SECRET_HEADER):
            found.append(f"config.extra_headers.{key}")
    return found
