"""A sandbox scorer's fingerprint covers its sandbox spec (the image its samples are restored
into and the container limits) and the restore code; other scorers' fingerprints do not move.
No Docker needed: fingerprints are computed from code and spec."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scorers.inspect_scorers.sandboxed import RESTORE_MODULE, sandbox_spec, uses_sandbox

SANDBOX_SCORER = textwrap.dedent(
    """
    from inspect_ai.scorer import CORRECT, Score, scorer, accuracy
    from inspect_ai.util import sandbox


    @scorer(metrics=[accuracy()])
    def runs_tests():
        async def score(state, target):
            await sandbox().exec(["true"])
            return Score(value=CORRECT)

        return score
    """
)


def test_which_scorers_use_a_sandbox_is_read_from_their_source(tmp_path, monkeypatch) -> None:
    assert uses_sandbox("inspect_evals.class_eval.class_eval")
    assert not uses_sandbox("inspect_ai.scorer._match")
    # a scorer whose sandbox call is in a helper module of its own package
    pkg = tmp_path / "teamscorers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(
        "from inspect_ai import util\n\nasync def run(cmd):\n    return await util.sandbox().exec(cmd)\n"
    )
    (pkg / "scorer.py").write_text("from .helpers import run\n")
    (pkg / "plain.py").write_text("import json\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert uses_sandbox("teamscorers.scorer")
    assert not uses_sandbox("teamscorers.plain")


def test_a_sandbox_scorer_carries_its_sandbox_spec_and_the_restore_code(tmp_path) -> None:
    from scorers.registry import get_verifier
    from verifiers.specs import names_for_entries

    path = tmp_path / "team.py"
    path.write_text(SANDBOX_SCORER)
    (name,) = names_for_entries([f"{path}@runs_tests"], trusted=True)
    verifier = get_verifier(name)
    assert verifier.params["sandbox"] == sandbox_spec()
    assert verifier.params["sandbox"]["limits"]["memory_mb"] == 512
    assert RESTORE_MODULE in verifier.code
    (plain,) = names_for_entries(["match"], trusted=True)
    assert "sandbox" not in get_verifier(plain).params
    assert RESTORE_MODULE not in get_verifier(plain).code


FINGERPRINTS = textwrap.dedent(
    """
    import json, sys
    import flows  # records the loaded code, as every command does
    from verifiers.specs import names_for_entries
    from scorers.identity.fingerprint import fingerprint
    from scorers.registry import get_verifier

    out = {}
    for entry in sys.argv[1:]:
        (name,) = names_for_entries([entry], trusted=True)
        out[entry] = fingerprint(get_verifier(name)).digest
    print(json.dumps(out))
    """
)


def _fingerprints(entries: list[str], cache: Path, **env: str) -> dict[str, str]:
    import os

    environ = {k: v for k, v in os.environ.items() if k != "GRADEBOOK_SANDBOX_IMAGE"}
    environ.update(GRADEBOOK_CACHE_DIR=str(cache), **env)
    done = subprocess.run(
        [sys.executable, "-c", FINGERPRINTS, *entries],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_changed_image_re_scores_sandbox_scorers_and_only_them(tmp_path) -> None:
    path = tmp_path / "team.py"
    path.write_text(SANDBOX_SCORER)
    entries = [f"{path}@runs_tests", "match"]
    cache = tmp_path / "cache"
    default = _fingerprints(entries, cache)
    rebuilt = _fingerprints(entries, cache, GRADEBOOK_SANDBOX_IMAGE="gradebook-sandbox:rebuilt")
    again = _fingerprints(entries, cache)
    assert default == again  # deterministic
    assert rebuilt[entries[0]] != default[entries[0]]  # a new image: a new verifier version
    assert rebuilt["match"] == default["match"]  # a scorer with no sandbox does not move
