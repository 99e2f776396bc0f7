"""Inspect's start-up hooks in a process that knows its scorers load only the installed entry
points it needs (scorers.inspect_scorers.startup), and Inspect's behaviour stays the same: every
hook an installed package registers is still found.

Two real installed packages with `inspect_ai` entry points are made in a temp directory: one
registers a hook, one only a task and a scorer (and notes in a file that it was imported).
Each check is a fresh interpreter, as a command is, with its own gradebook cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent(
    """
    import json, sys
    from scorers.inspect_scorers.startup import init_hooks_for
    init_hooks_for(json.loads(sys.argv[1]))
    from inspect_ai._util.registry import registry_info
    from inspect_ai.hooks._hooks import get_all_hooks
    print(json.dumps({
        "hooks": sorted(registry_info(h).name for h in get_all_hooks()),
        "modules": sorted(m for m in ("hookpkg", "taskpkg", "inspect_evals") if m in sys.modules),
    }))
    """
)

HOOK_MODULE = textwrap.dedent(
    """
    from inspect_ai.hooks import Hooks, hooks

    @hooks(name="audit", description="sees every model call")
    class Audit(Hooks):
        pass
    """
)

TASK_MODULE = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.scorer import Score, scorer, accuracy

    @task
    def quiz():
        return Task(dataset=[])

    @scorer(metrics=[accuracy()])
    def exact_quiz():
        async def score(state, target):
            return Score(value=1)
        return score
    """
)


def _package(site: Path, name: str, source: str) -> Path:
    (site / name).mkdir()
    module = site / name / "__init__.py"
    module.write_text(source)
    dist = site / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[inspect_ai]\n{name} = {name}\n")
    return module


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    _package(site, "hookpkg", HOOK_MODULE)
    _package(site, "taskpkg", TASK_MODULE)
    return site


def _start(site: Path, scorers: list[str]) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "GRADEBOOK_CACHE_DIR": str(site.parent / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(scorers)],
        cwd=site.parent, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_judge_of_a_builtin_scorer_loads_only_the_packages_that_register_hooks(site):
    first = _start(site, ["model_graded_qa"])
    # nothing known about this environment yet: every entry point, as Inspect loads them
    assert {"hookpkg", "taskpkg"} <= set(first["modules"])
    assert any(h.endswith("audit") for h in first["hooks"])

    again = _start(site, ["model_graded_qa"])
    assert "taskpkg" not in again["modules"]  # registers only named things nobody names here
    assert "inspect_evals" not in again["modules"]
    assert again["hooks"] == first["hooks"]  # the hooks Inspect runs are the same

    named = _start(site, ["taskpkg/exact_quiz"])
    assert "taskpkg" in named["modules"] and "inspect_evals" not in named["modules"]
    assert named["hooks"] == first["hooks"]


def test_a_scorer_of_unknown_origin_or_a_changed_package_loads_every_entry_point(site):
    _start(site, ["model_graded_qa"])  # what each entry point registers is now known

    unknown = _start(site, ["exact_quiz"])  # unqualified, not an Inspect built-in
    assert {"hookpkg", "taskpkg"} <= set(unknown["modules"])

    # the task package now registers a hook too: its entry point's file changed, so it is
    # loaded again (and known from then on to register a hook)
    module = site / "taskpkg" / "__init__.py"
    module.write_text(TASK_MODULE + HOOK_MODULE.replace("audit", "taskpkg_audit"))
    changed = _start(site, ["model_graded_qa"])
    assert "taskpkg" in changed["modules"]
    assert any(h.endswith("taskpkg_audit") for h in changed["hooks"])
    later = _start(site, ["model_graded_qa"])
    assert "taskpkg" in later["modules"] and "inspect_evals" not in later["modules"]
    assert later["hooks"] == changed["hooks"]
