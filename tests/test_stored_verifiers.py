"""Every command rebuilds the verifiers a warehouse has seen from the specs it stores, with no
flags, as far as the trust rule allows (verifiers.stored), and says in one line what to
set or pass where it may not.

The warehouse here is filled as a grading command fills it (`register_verifier` with the
verifier's fingerprint, which carries its stored spec, sealed with this session's key); each
command then runs as the user's next command would, in its own `gradebook` process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import inspect_scorer_kit as kit
import pytest

from warehouse import Warehouse

GRADEBOOK = str(Path(sys.executable).with_name("gradebook"))


@pytest.fixture(autouse=True)
def _own_registry():
    path = list(sys.path)
    yield from kit.isolated_registry()
    sys.path[:] = path


def _cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRADEBOOK_VERIFIER")}
    environ.pop("JUDGE_API_KEY", None)
    environ["COLUMNS"] = "400"  # one table row per line
    environ.update(env)
    return subprocess.run(
        [GRADEBOOK, *args], capture_output=True, text=True, env=environ, cwd=cwd, timeout=600
    )


def _row(listing: subprocess.CompletedProcess, name: str) -> str:
    assert listing.returncode == 0, listing.stdout + listing.stderr
    return next(line for line in listing.stdout.splitlines() if f" {name} " in line)


def _graded_with(db: Path, *entries: object, roles: dict | None = None) -> list[str]:
    """Register the verifiers as a command that graded with them (given by the user) would."""
    from scorers.identity.fingerprint import fingerprint
    from scorers.inspect_scorers.specs import resolve, spec_of, with_roles

    names = []
    for entry in entries:
        spec = spec_of(entry)
        if roles:
            spec = with_roles(spec, roles)
        verifier = resolve(spec, trusted=True)
        Warehouse(db).register_verifier(fingerprint(verifier), current=True)
        names.append(verifier.name)
    return names


def _judge_role(url: str = "http://127.0.0.1:9/v1", model: str = "openai-api/judge/j") -> dict:
    from sweeps.config import RoleModel

    return RoleModel(model=model, base_url=url, config={"max_retries": 1}).to_json()


def test_a_scorer_file_is_rebuilt_while_it_holds_the_bytes_that_graded(tmp_path: Path) -> None:
    scorer_file, _ = kit.write_team_files(tmp_path / "team")
    db = tmp_path / "w.duckdb"
    [name] = _graded_with(db, f"{scorer_file}@last_word")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # a new process, no flag: rebuilt from the stored spec
    row = _row(_cli("verifiers", "--db", str(db), cwd=elsewhere), name)
    assert "yes" in row and "not loaded" not in row

    # another user's key: the warehouse's word alone imports nothing
    other = _cli("verifiers", "--db", str(db), cwd=elsewhere,
                 GRADEBOOK_STATE_DIR=str(tmp_path / "another-user"))  # fmt: skip
    row = _row(other, name)
    assert "not loaded" in row and f"--verifier-module {scorer_file}@last_word" in row

    # edited since it graded: the edit runs only on the user's word
    scorer_file.write_text(scorer_file.read_text().replace("OFFSET = 0", "OFFSET = 1"))
    row = _row(_cli("verifiers", "--db", str(db), cwd=elsewhere), name)
    assert "changed since it graded here" in row
    assert f"--verifier-module {scorer_file}@last_word" in row
    # ... and given with the flag, it is what grades
    given = _cli("verifiers", "--db", str(db), "--verifier-module", f"{scorer_file}@last_word",
                 cwd=elsewhere)  # fmt: skip
    assert "yes" in _row(given, name)


EVIL = """\
from pathlib import Path

Path({marker!r}).write_text("imported")
"""


def test_a_forged_spec_row_imports_nothing(tmp_path: Path) -> None:
    """A warehouse edited to name another file (or a copy from elsewhere): its seal is not this
    user's, so the file is never imported, whatever the row says."""
    scorer_file, _ = kit.write_team_files(tmp_path / "team")
    db = tmp_path / "w.duckdb"
    [name] = _graded_with(db, f"{scorer_file}@last_word")
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(EVIL.format(marker=str(marker)))
    import hashlib

    with Warehouse(db).write() as con:
        spec, seal = con.execute(
            "SELECT spec::VARCHAR, seal FROM wh.verifier_specs WHERE name = ?", [name]
        ).fetchone()
        forged = json.loads(spec) | {
            "file": str(evil), "sha256": hashlib.sha256(evil.read_bytes()).hexdigest(),
        }  # fmt: skip
        con.execute(
            "INSERT INTO wh.verifier_specs VALUES (?, 'f', ?, ?, now() + INTERVAL 1 SECOND)",
            [name, json.dumps(forged), seal],
        )
    for args in (["verifiers", "--db", str(db)], ["rescore", "--db", str(db)]):
        ran = _cli(*args, cwd=tmp_path)
        assert "Traceback" not in ran.stdout + ran.stderr
        assert f"--verifier-module {evil}@last_word" in ran.stdout.replace("\n", " ")
    assert not marker.exists()


def test_a_judge_is_rebuilt_with_its_key_from_the_environment_never_from_the_warehouse(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    [name] = _graded_with(db, "model_graded_qa", roles={"grader": _judge_role()})
    assert name == "model_graded_qa"
    with Warehouse(db).read() as con:
        spec = json.loads(
            con.execute("SELECT spec FROM verifier_specs WHERE name = ? AND latest", [name])
            .fetchone()[0]
        )  # fmt: skip
    grader = spec["roles"]["grader"]
    assert grader["env"] == {"api_key": "JUDGE_API_KEY"}  # the name, never a value
    assert grader["args"] == {"max_retries": 0}  # the SDK's own retries off: Inspect's retry

    # the key in the environment: rebuilt, no flag
    row = _row(_cli("verifiers", "--db", str(db), cwd=tmp_path, JUDGE_API_KEY="k"), name)
    assert "yes" in row
    # no key: one line saying what to export
    row = _row(_cli("verifiers", "--db", str(db), cwd=tmp_path), name)
    assert "not loaded" in row and "export JUDGE_API_KEY=..." in row
    gate = _cli("gate", "--db", str(db), "--run", "nosuchrun", cwd=tmp_path)
    assert "Traceback" not in gate.stderr
    # another user's warehouse: the judge it names is never called on its word
    other = _cli("verifiers", "--db", str(db), cwd=tmp_path, JUDGE_API_KEY="k",
                 GRADEBOOK_STATE_DIR=str(tmp_path / "another-user"))  # fmt: skip
    row = _row(other, name)
    assert "not loaded" in row and "--model-role grader=MODEL" in row

    # a flag given here wins over the stored spec, and says so
    mine = json.dumps(
        {"kind": "registry", "scorer": "model_graded_qa", "params": {},
         "roles": {"grader": _judge_role(model="openai-api/judge/j2")}}
    )  # fmt: skip
    given = _cli("verifiers", "--db", str(db), "--verifier-module", mine, cwd=tmp_path,
                 JUDGE_API_KEY="k")  # fmt: skip
    assert given.returncode == 0, given.stderr
    note = next(line for line in given.stdout.splitlines() if line.startswith("note:"))
    assert "'model_graded_qa'" in note and "using the spec given here" in note
    assert "openai-api/judge/j2" in note and "openai-api/judge/j)" in note


@pytest.mark.parametrize(
    "role",
    [
        {"model": "openai-api/judge/j", "args": {"api_key": "sk-live-123"}},
        {"model": "openai-api/judge/j", "config": {"extra_headers": {"Authorization": "Bearer x"}}},
    ],
)
def test_a_secret_in_a_judge_binding_is_refused_in_one_line(tmp_path: Path, role: dict) -> None:
    from sweeps.config import ConfigError, parse_config

    raw = {
        "name": "s", "warehouse": "w.duckdb",
        "models": [{"model": "mockllm/model"}],
        "tasks": [{"task": "math_verified", "verifiers": ["model_graded_qa"]}],
        "model_roles": {"grader": role},
    }  # fmt: skip
    with pytest.raises(ConfigError) as info:
        parse_config(raw, source=tmp_path / "s.toml")
    assert "\n" not in str(info.value)
    assert "JUDGE_API_KEY" in str(info.value) and "secret" in str(info.value)
    flag = _cli("score", str(tmp_path), "--db", str(tmp_path / "w.duckdb"), "--verifier",
                "model_graded_qa", "--model-role",
                f"grader={json.dumps(role)}", cwd=tmp_path)  # fmt: skip
    assert flag.returncode == 2 and len(flag.stderr.strip().splitlines()) == 1, flag.stderr
    assert "JUDGE_API_KEY" in flag.stderr and "sk-live" not in flag.stderr


def test_variants_of_one_scorer_get_stable_names_of_their_own() -> None:
    from scorers.inspect_scorers.specs import ScorerSpec, resolve

    plain = resolve(ScorerSpec("match"), trusted=False)
    numeric = resolve(ScorerSpec("match", {"numeric": True}), trusted=False)
    long = resolve(ScorerSpec("model_graded_qa", {"instructions": "Grade it. " * 20},
                              roles={"grader": _judge_role()}), trusted=True)  # fmt: skip
    assert (plain.name, numeric.name) == ("match", "match[numeric=true]")
    assert long.name.startswith("model_graded_qa[instructions=") and len(long.name) < 40
    # the same spec, resolved again (another command), is the same name
    again = resolve(ScorerSpec("match", {"numeric": True}), trusted=False)
    assert again is numeric


def test_an_installed_packages_scorer_resolves_by_its_unqualified_name() -> None:
    from scorers.inspect_scorers.specs import ScorerSpec, resolve

    verifier = resolve(ScorerSpec("class_eval_scorer"), trusted=False)
    assert verifier.name == "class_eval_scorer"
    assert verifier.spec["scorer"] == "inspect_evals/class_eval_scorer"
