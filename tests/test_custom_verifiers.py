"""A verifier from a sweep config's `verifier_modules` works outside the sweep: `score`,
`rescore`, `verifiers` and `gate` rebuild it from the spec the warehouse stores (its module and
file, sealed as this user's: verifiers.stored), or load it with `--verifier-module` (or
GRADEBOOK_VERIFIER_MODULES); where they may not (the file changed since it graded, a warehouse
another user wrote) they say, in one line, exactly which flag to pass. A module name that a
warehouse or a log holds on its own word is never imported. Each command runs as its own
`gradebook` process, as a user's next command would; real Prefect flow runs, grading workers
and DuckDB."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import flows_kit
import pytest
from gate_world import run_eval

from flows.sweep import sweep_flow
from sweeps.config import parse_config
from warehouse import Warehouse

pytestmark = pytest.mark.slow

GRADEBOOK = str(Path(sys.executable).with_name("gradebook"))
ROOT = Path(__file__).resolve().parents[1]


def _cli(args: list[str], *, pythonpath: Path, env: dict[str, str] | None = None):
    """`gradebook ARGS` in a new process of this checkout, with `pythonpath` importable (what
    a user's PYTHONPATH would hold) and a wide terminal (one table row per line)."""
    environ = {k: v for k, v in os.environ.items() if k != "GRADEBOOK_VERIFIER_MODULES"}
    environ["PYTHONPATH"] = os.pathsep.join([str(pythonpath), str(ROOT)])
    environ["COLUMNS"] = "300"
    environ.update(env or {})
    return subprocess.run(
        [GRADEBOOK, *args], capture_output=True, text=True, env=environ, timeout=300
    )


def _one_line_error(res, *needles: str) -> None:
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def swept(prefect_api, tmp_path, monkeypatch):
    """A sweep whose task is graded by a custom verifier from `verifier_modules`."""
    module = f"letters_{uuid.uuid4().hex[:8]}"
    name = f"letter_{uuid.uuid4().hex[:8]}"
    lib = tmp_path / "lib"
    lib.mkdir()
    path = flows_kit.write_verifier(lib, module, name)
    monkeypatch.syspath_prepend(str(lib))
    raw = {
        "name": "custom",
        "log_dir": "logs",
        "warehouse": "gb.duckdb",
        "verifier_modules": [module],
        "models": [
            {
                "name": "m",
                "model": "mockllm/model",
                "args": {"custom_outputs": flows_kit.mock_outputs({2})},
            }
        ],
        "tasks": [{"task": flows_kit.TASK_SPEC, "args": {"n": 6}, "verifiers": [name]}],
        "gates": {"max_regression": None, "min_accuracy": 0.5},
    }
    cfg = parse_config(raw, source=tmp_path / "sweep.toml")
    result = sweep_flow(cfg, workers=1, progress=False)
    assert result.rows[0].scored == 6 and result.exit_code == 0
    (gen,) = result.generations
    return {
        "module": module,
        "name": name,
        "path": path,
        "lib": lib,
        "db": str(cfg.warehouse),
        "log": gen.log,
        "run": gen.run_id,
    }


def test_without_the_module_every_command_rebuilds_it_from_the_warehouse(swept, tmp_path):
    s = swept
    elsewhere = tmp_path / "cwd-without-the-lib"  # not on PYTHONPATH: found by its stored file
    elsewhere.mkdir()
    listing = _cli(["verifiers", "--db", s["db"]], pythonpath=elsewhere)
    assert listing.returncode == 0, listing.stderr
    line = next(x for x in listing.stdout.splitlines() if s["name"] in x)
    assert "yes" in line and "not loaded" not in line and " 6 " in f" {line} "
    gate = _cli(["gate", "--db", s["db"], "--run", s["run"]], pythonpath=elsewhere)
    assert gate.returncode == 0 and "gate: PASS" in gate.stdout, gate.stdout + gate.stderr
    rescore = _cli(["rescore", "--db", s["db"]], pythonpath=elsewhere)
    assert rescore.returncode == 0 and "not checked" not in rescore.stdout, rescore.stdout

    # edited since it graded: its new code runs only on the user's word
    s["path"].write_text(s["path"].read_text().replace("OFFSET = 0", "OFFSET = 1"))
    gate = _cli(["gate", "--db", s["db"], "--run", s["run"]], pythonpath=elsewhere)
    assert gate.returncode == 2, gate.stdout
    text = gate.stdout.replace("\n", " ")
    assert "changed since it graded here" in text and f"--verifier-module {s['module']}" in text


def test_a_warehouse_another_user_wrote_names_the_flag_to_pass(swept, tmp_path):
    # another user's key: the stored spec is not sealed by them, so nothing is imported
    s, lib = swept, swept["lib"]
    other = {"GRADEBOOK_STATE_DIR": str(tmp_path / "another-user")}
    flag = f"--verifier-module {s['module']}"
    score = _cli(["score", s["log"], "--db", s["db"], "--verifier", s["name"]], pythonpath=lib,
                 env=other)  # fmt: skip
    _one_line_error(score, repr(s["name"]), flag)
    # the log names the verifier too: that alone never imports anything
    score = _cli(["score", s["log"], "--db", s["db"]], pythonpath=lib, env=other)
    _one_line_error(score, repr(s["name"]), flag)
    rescore = _cli(["rescore", "--db", s["db"], "--scorer", s["name"]], pythonpath=lib, env=other)
    _one_line_error(rescore, repr(s["name"]), flag)

    listing = _cli(["verifiers", "--db", s["db"]], pythonpath=lib, env=other)
    assert listing.returncode == 0, listing.stderr
    line = next(x for x in listing.stdout.splitlines() if s["name"] in x)
    assert "not loaded" in line and flag in listing.stdout.replace("\n", " ")

    rescore_all = _cli(["rescore", "--db", s["db"]], pythonpath=lib, env=other)
    assert rescore_all.returncode == 2, rescore_all.stdout + rescore_all.stderr  # not checked
    assert f"not checked: verifier {s['name']!r}" in rescore_all.stdout
    assert "fingerprint is current" not in rescore_all.stdout
    # a module another user's warehouse names is left to the user: no command offered to paste
    assert not any(
        " rescore " in line and "--verifier-module" in line
        for line in rescore_all.stdout.splitlines()
    ), rescore_all.stdout

    gate = _cli(["gate", "--db", s["db"], "--run", s["run"]], pythonpath=lib, env=other)
    assert gate.returncode == 2, gate.stdout
    assert f"scored by verifier {s['name']!r}, which is not loaded here" in gate.stdout
    assert flag in gate.stdout.replace("\n", " ")


def test_with_the_module_every_command_uses_the_verifier(swept):
    s, lib = swept, swept["lib"]
    mod = ["--verifier-module", s["module"]]
    with Warehouse(s["db"]).read() as con:
        (stored,) = con.execute(
            "SELECT DISTINCT fingerprint FROM scores WHERE scorer = ?", [s["name"]]
        ).fetchone()

    listing = _cli(["verifiers", "--db", s["db"], *mod], pythonpath=lib)
    assert listing.returncode == 0, listing.stderr
    line = next(x for x in listing.stdout.splitlines() if s["name"] in x)
    assert stored[:12] in line and " 6 " in f" {line} " and "yes" in line

    gate = _cli(["gate", "--db", s["db"], "--run", s["run"], *mod], pythonpath=lib)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "gate: PASS" in gate.stdout

    score = _cli(
        ["score", s["log"], "--db", s["db"], "--verifier", s["name"], *mod], pythonpath=lib
    )
    assert score.returncode == 0, score.stderr  # everything is scored already: nothing written

    # a behaviour change: `rescore` re-grades it (in this process and its workers alike)
    s["path"].write_text(s["path"].read_text().replace("OFFSET = 0", "OFFSET = 1"))
    rescore = _cli(["rescore", "--db", s["db"], "--scorer", s["name"], *mod], pythonpath=lib)
    assert rescore.returncode == 0, rescore.stderr
    assert rescore.stdout.count(f"flip {s['name']}") == 6
    with Warehouse(s["db"]).read() as con:
        fps = con.execute(
            "SELECT count(DISTINCT fingerprint) FROM scores WHERE scorer = ?", [s["name"]]
        ).fetchone()
    assert fps == (2,)

    # the environment variable does what the flag does
    env = {"GRADEBOOK_VERIFIER_MODULES": s["module"]}
    listing = _cli(["verifiers", "--db", s["db"]], pythonpath=lib, env=env)
    line = next(x for x in listing.stdout.splitlines() if s["name"] in x)
    assert "yes" in line and "not loaded" not in line


def test_a_module_that_does_not_import_is_one_line(swept):
    s, lib = swept, swept["lib"]
    res = _cli(
        ["verifiers", "--db", s["db"], "--verifier-module", "no_such_mod_xyz"], pythonpath=lib
    )
    _one_line_error(res, "--verifier-module no_such_mod_xyz", "cannot import", "PYTHONPATH")


RAISES = """\
from scorers.registry import Verifier, register

THRESHOLD = compute_threshold()  # line 3: a NameError on import
"""


def test_a_module_that_raises_on_import_names_its_file_and_line(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    module = f"raises_{uuid.uuid4().hex[:8]}"
    (lib / f"{module}.py").write_text(RAISES)
    res = _cli(["verifiers", "--verifier-module", module], pythonpath=lib)
    _one_line_error(res, f"--verifier-module {module}", "NameError", f"{module}.py:3")
    # a scorer file named as FILE.py@scorer: the same
    scorer = lib / "bad_scorer.py"
    scorer.write_text("import math\n\nRATIO = math.sqrt(-1)  # line 3\n")
    res = _cli(["verifiers", "--verifier-module", f"{scorer}@judge"], pythonpath=lib)
    _one_line_error(res, "ValueError", f"{scorer}:3")


EVIL = """
from pathlib import Path

Path({marker!r}).write_text("imported")
"""


def test_a_module_named_by_a_warehouse_or_a_log_is_never_imported(prefect_api, tmp_path):
    from scorers.identity.fingerprint import VerifierFingerprint

    module = f"evil_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{module}.py").write_text(EVIL.format(marker=str(marker)))
    wh = Warehouse(tmp_path / "elsewhere.duckdb")
    log = run_eval(tmp_path / "logs", ["0", "1"], metadata={"verifiers": ["evil"]})
    [res] = wh.ingest_logs([log])
    wh.register_verifier(VerifierFingerprint("evil", "f" * 64, "x", "", {}, module=module))
    import pyarrow as pa

    from warehouse import SCORE_SCHEMA

    rows = [
        {"run_id": res.run_id, "sample_id": s, "epoch": 1, "scorer": "evil",
         "fingerprint": "f" * 64, "status": "scored", "value": 1.0, "attempt": 1}
        for s in ("q000", "q001")
    ]  # fmt: skip
    wh.write_scores(pa.Table.from_pylist(rows, SCORE_SCHEMA))

    db = str(wh.path)
    flag = f"--verifier-module {module}"
    outputs = []
    for args in (
        ["verifiers", "--db", db],
        ["rescore", "--db", db],
        ["rescore", "--db", db, "--scorer", "evil"],
        ["gate", "--db", db, "--run", res.run_id],
        ["score", str(log), "--db", db],  # the log names "evil" as its verifier
    ):
        out = _cli(args, pythonpath=lib)
        assert "Traceback" not in out.stdout + out.stderr
        outputs.append((out.stdout + out.stderr).replace("\n", " "))
    assert not marker.exists()  # nothing ran the module the warehouse names
    assert all(flag in o for o in outputs), outputs
