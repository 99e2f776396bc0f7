""" "Newest" means the fingerprint of the verifier's code as it is now, in every view, the
report, the scored log copies and the gate: after an edit, after a revert, and after an edit
back to an older version. Real Inspect logs, Prefect flow runs, grading workers, DuckDB."""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import flows_kit
import pytest
from gate_world import run_eval
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.report.summary import collect_report
from flows.rescore import rescore_flow, watch_verifiers
from flows.score import score_flow
from gates.evaluate import current_fingerprints, evaluate_gates
from warehouse import Warehouse

pytestmark = pytest.mark.slow

STRICT = "ok = answer == want"
LENIENT = "ok = answer in (want, str(int(want) + 1))"  # off-by-one answers count too


class World:
    """One log (samples 4 and 5 answered off by one) scored by a verifier at A (strict), then
    edited to B (lenient) and re-scored: B flips samples 4 and 5 to right."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.name = f"exact_{uuid.uuid4().hex[:8]}"
        self.path = flows_kit.write_verifier(tmp_path, self.name, self.name)
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.import_module(self.name)
        self.db = tmp_path / "gb.duckdb"
        self.copies = tmp_path / "scored"
        answers = ["0", "1", "2", "3", "5", "6"]  # sample i's target is i
        self.log = run_eval(tmp_path / "logs", answers)
        score_flow([str(self.log)], str(self.db), verifiers=[self.name], progress=False)
        self.a = self.current()
        self.set(LENIENT)
        self.b = self.current()
        assert self.a != self.b
        rescore_flow(str(self.db), [self.name], progress=False)

    def set(self, code: str) -> None:
        text = self.path.read_text()
        self.path.write_text(text.replace(STRICT, code).replace(LENIENT, code))

    def current(self) -> str:
        return current_fingerprints([self.name])[self.name]

    def sql(self, query: str) -> list[tuple]:
        with Warehouse(self.db).read() as con:
            return con.execute(query, [self.name]).fetchall()

    def assert_newest(self, fp: str, values: list[float]) -> None:
        """Every view and output takes `fp` as the newest fingerprint; `values` are its
        verdicts on samples 0-5."""
        other = self.b if fp == self.a else self.a
        latest = self.sql(
            "SELECT DISTINCT fingerprint, sample_id, value FROM latest_scores WHERE scorer = ? "
            "ORDER BY sample_id"
        )
        assert [f for f, _, _ in latest] == [fp] * 6
        assert [v for _, _, v in latest] == values
        # grade flips read older -> newer: to the current code's verdict
        flips = self.sql(
            "SELECT old_fingerprint, new_fingerprint, sample_id, new_value FROM grade_flips "
            "WHERE scorer = ? ORDER BY sample_id"
        )
        assert flips == [(other, fp, s, values[int(s[1:])]) for s in ("q004", "q005")]
        # the report: the flips of the last change read to the newest fingerprint, coverage
        # under it
        with Warehouse(self.db).read() as con:
            data = collect_report(con)
        last = [c for c in data.fingerprint_changes if c.scorer == self.name][-1]
        assert last.fingerprint == fp and {f.new_fingerprint for f in last.flips} == {fp}
        assert {f.sample_id for f in last.flips} == {"q004", "q005"}
        assert {c.fingerprint for c in data.coverage if c.scorer == self.name} == {fp}
        # the scored copies for `inspect view`
        score_flow(
            [str(self.log)],
            str(self.db),
            verifiers=[self.name],
            progress=False,
            scored_log_dir=str(self.copies),
        )
        from inspect_ai.log import read_eval_log

        copy = read_eval_log(str(self.copies / self.log.name))
        by_id = {s.id: s.scores[self.name].value for s in copy.samples}
        assert [by_id[f"q{i:03d}"] for i in range(6)] == values
        # and the gate, which fingerprints the code itself
        (result,) = evaluate_gates(self.db, None, record=False)
        assert result.metrics[self.name]["fingerprint"] == fp
        # what the views know the current fingerprint by
        assert self.sql("SELECT fingerprint FROM current_verifiers WHERE scorer = ?") == [(fp,)]
        assert self.sql(
            "SELECT fingerprint FROM fingerprint_order WHERE scorer = ? AND newest"
        ) == [(fp,)]


STRICT_VALUES = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
LENIENT_VALUES = [1.0] * 6


@pytest.fixture
def world(prefect_api, tmp_path, monkeypatch) -> World:
    return World(tmp_path, monkeypatch)


def _rescore(world: World) -> None:
    rescore_flow(str(world.db), [world.name], progress=False)


def _watch(world: World) -> None:
    watch_verifiers(str(world.db))


def _gate(world: World) -> None:
    res = CliRunner().invoke(app, ["gate", "--db", str(world.db), "--run", _run_id(world)])
    assert res.exit_code in (0, 1), res.output


def _verifiers(world: World) -> None:
    res = CliRunner().invoke(app, ["verifiers", "--db", str(world.db)])
    assert res.exit_code == 0, res.output


def _report(world: World) -> None:
    out = world.db.parent / "report.html"
    res = CliRunner().invoke(app, ["report", "--db", str(world.db), "--out", str(out)])
    assert res.exit_code == 0, res.output


def _run_id(world: World) -> str:
    return world.sql("SELECT DISTINCT run_id FROM scores WHERE scorer = ?")[0][0]


def test_after_an_edit_the_edited_code_is_newest(world):
    world.assert_newest(world.b, LENIENT_VALUES)


@pytest.mark.parametrize(
    "command", [_rescore, _watch, _gate, _verifiers, _report], ids=lambda c: c.__name__[1:]
)
def test_after_a_revert_the_reverted_to_code_is_newest_everywhere(world, command):
    world.set(STRICT)
    assert world.current() == world.a
    command(world)  # any command that fingerprints the verifier tells the warehouse
    world.assert_newest(world.a, STRICT_VALUES)


def test_an_edit_back_to_an_older_version_makes_that_version_newest_again(world):
    world.set(STRICT)
    _rescore(world)
    world.assert_newest(world.a, STRICT_VALUES)
    world.set(LENIENT)  # back to B, which was reverted away
    assert world.current() == world.b
    _rescore(world)  # nothing to re-score: B graded every sample already
    world.assert_newest(world.b, LENIENT_VALUES)
    changes = world.sql(
        "SELECT fingerprint FROM fingerprint_changes WHERE scorer = ? ORDER BY since"
    )
    assert changes == [(world.a,), (world.b,), (world.a,), (world.b,)]  # append-only history
    with Warehouse(world.db).read() as con:
        changed = collect_report(con).fingerprint_changes
    drawn = [c.fingerprint for c in changed if c.scorer == world.name]
    assert drawn == [world.b, world.a, world.b]  # the report marks each change, reverts too
