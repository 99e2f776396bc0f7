"""The packages stack in data-flow order, and no import runs up a floor (docs/architecture.md).

Static, from `ast`: every `import` statement of the project's modules counts, those inside
functions and under `if TYPE_CHECKING:` too. Code named by a string and imported when it runs
(a verifier's module, the restore module a sandbox scorer names) is a verifier's spec, not an
import statement, and is not checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# bottom to top; a module imports only from its own floor or the floors below it
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "verifiers' core, the grading engine, pure gate rules",
        ("scorers", "gates.rules", "gates.stats"),
    ),
    ("the warehouse", ("warehouse",)),
    ("agents' workspaces", ("workspaces",)),
    ("the bundled tasks", ("tasks",)),
    ("a sweep as declared", ("sweeps",)),
    ("verifier specs and plans", ("verifiers",)),
    ("gate decisions", ("gates",)),
    ("the flows, their CLI and runtime", ("flows",)),
]
PACKAGES = sorted({p.split(".")[0] for _, units in FLOORS for p in units})


def floor_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, floor)
    for floor, (_, units) in enumerate(FLOORS):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                if best is None or len(unit) > best[0]:
                    best = (len(unit), floor)
    return None if best is None else best[1]


def imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) for every import of a project module."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                found += [(module, node.lineno, n) for n in names if n.split(".")[0] in PACKAGES]
    return found


def test_no_import_runs_up_a_floor() -> None:
    up = []
    for module, line, target in imports():
        here, there = floor_of(module), floor_of(target)
        assert here is not None and there is not None, (module, target)
        if there > here:
            up.append(f"{module}:{line} imports {target} ({FLOORS[there][0]} is above "
                      f"{FLOORS[here][0]})")  # fmt: skip
    assert not up, "\n".join(up)


def test_the_runtime_imports_nothing_of_the_flows_it_runs() -> None:
    """flows.runtime (servers, sessions, signals, terminal) is what the flows run on."""
    wrong = [f"{m}:{line} imports {t}" for m, line, t in imports()
             if m.startswith("flows.runtime") and t.startswith("flows.")
             and not t.startswith("flows.runtime")]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_flows_holds_only_flows_their_cli_and_runtime() -> None:
    """Each top-level module of flows/ defines a Prefect flow or task, or is the re-export
    of a moved path; the rest of flows/ is its subpackages."""
    stray = []
    for path in sorted((ROOT / "flows").glob("*.py")):
        text = path.read_text()
        if path.name == "__init__.py" or "from flows._moved import reexport" in text:
            continue
        if path.name == "_moved.py":
            continue
        flow_like = "@flow" in text or "@task" in text or path.stem in _ALSO_FLOWS
        if not flow_like:
            stray.append(path.name)
    assert not stray, f"flows/ modules that are not flows: {stray}"


# flow modules with no @flow or @task of their own, and why each is a flow's all the same
_ALSO_FLOWS = {
    "score_start": "the score flow's early start, run by the command before Prefect is imported",
    "serve": "the flows' deployments on their schedules, and the supervisor that serves them",
    "serve_runner": "the Prefect runner process `serve` supervises",
}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_a_floor(package: str) -> None:
    assert floor_of(package) is not None
