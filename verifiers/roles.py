"""`--model-role grader=MODEL` on `score` and `rescore`: the judge for commands without a config.

As Inspect's own `--model-role`: `grader=openai-api/judge/llama` (the provider finds its URL
and key in the environment), or `grader={"model": "...", "base_url": "...", "config": {...}}`
(JSON, the keys of `[model_roles.grader]`). The binding goes to every judge scorer the command
grades with: the `--verifier`s, the scorers a log names, or (rescore) the judge scorers the
warehouse records. Because the user gave it, it is called; a binding only a log or warehouse
names never is (scorers.inspect_scorers.specs). It reaches the grading code as the scorer's
spec (JSON), the form `--verifier-module` loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["ModelRoleOption", "bindings", "judge_specs", "log_entries"]

ModelRoleOption = Annotated[
    list[str] | None,
    typer.Option(
        "--model-role",
        help="Bind a model role for judge-graded scorers, as Inspect's --model-role: "
        "grader=MODEL, or grader=JSON with model, base_url, args, config (repeatable).",
    ),
]


def bindings(values: Iterable[str] | None) -> dict[str, dict[str, Any]]:
    """role name -> binding JSON (as `RoleModel.to_json()`).

    Raises:
        ValueError: one line naming the value and the form it takes.
    """
    from pydantic import ValidationError

    from sweeps.config import RoleModel

    out: dict[str, dict[str, Any]] = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        name, rest = name.strip(), rest.strip()
        form = 'give ROLE=MODEL or ROLE={"model": "...", "base_url": "..."}'
        if not sep or not name or not rest:
            raise ValueError(f"--model-role {value!r}: {form}")
        try:
            raw = json.loads(rest) if rest.startswith("{") else {"model": rest}
            role = RoleModel(**raw)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"--model-role {value!r}: not JSON ({exc}); {form}") from None
        except ValidationError as exc:
            # the value is not echoed: it may hold the very secret the error is about
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            msg = str(first["msg"]).removeprefix("Value error, ")
            raise ValueError(
                f"--model-role {name}=...: {where + ': ' if where else ''}{msg}"
            ) from None
        out[name] = role.to_json()
    return out


def judge_specs(entries: Iterable[Any], roles: Mapping[str, Any]) -> list[str]:
    """The JSON specs of the judge scorers among `entries` (verifier names or specs, given by
    the user or read from a log), with `roles` bound in place of any they name. A file spec a
    log names is skipped: it is never imported to find out (`--verifier-module FILE.py@scorer`
    names it)."""
    from scorers.inspect_scorers.specs import SpecError, spec_of, with_roles

    out: list[str] = []
    for entry in entries:
        try:
            spec = spec_of(entry)
            if isinstance(spec, str) or spec.file:
                continue
            bound = with_roles(spec, roles, rebind=True)
        except (SpecError, ValueError):
            continue
        if bound is not spec:
            out.append(json.dumps(bound.to_json(), sort_keys=True))
    return list(dict.fromkeys(out))


def log_entries(paths: Iterable[Path]) -> list[Any]:
    """Every verifier entry the logs name (gradebook's metadata, else their own scorers)."""
    from verifiers.specs import entries_for_log
    from warehouse.logs import read_header

    out: list[Any] = []
    for path in paths:
        try:
            out += entries_for_log(read_header(str(path)))
        except Exception:  # noqa: BLE001, S112 - unreadable: ingest names it
            continue
    return out
