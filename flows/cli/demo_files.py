"""What both demos write and print: their sweep config as TOML, and commands to run next."""

from __future__ import annotations

from typing import Any

from flows.runtime.console import console

__all__ = ["print_commands", "toml_text"]


def toml_text(cfg: dict[str, Any]) -> str:
    """A demo's sweep config (models, tasks, gates and top-level keys) as TOML text."""

    def val(v: Any) -> str:
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        return repr(v)

    lines = [f"{k} = {val(v)}" for k, v in cfg.items() if not isinstance(v, list | dict)]
    for section in ("models", "tasks"):
        for entry in cfg[section]:
            lines += ["", f"[[{section}]]"] + [f"{k} = {val(v)}" for k, v in entry.items()]
    lines += ["", "[gates]"]
    lines += [f"{k} = {val(v)}" for k, v in cfg["gates"].items() if v is not None]
    return "\n".join(lines) + "\n"


def print_commands(*lines: str) -> None:
    # soft_wrap: a command folded by rich would carry a newline into the user's copy-paste
    for line in lines:
        console.print(f"  {line}", soft_wrap=True, markup=False)
