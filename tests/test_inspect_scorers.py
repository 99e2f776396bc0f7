"""Every Inspect scorer is a verifier (issue 18): gradebook's stage grades with Inspect's own
scorers from what the warehouse keeps, and gets what Inspect's eval-time scoring gets.

Each task is run twice with the same scripted answers, once scored by Inspect at eval time and
once not; gradebook scores the unscored log (real flow runs, real worker processes) and every
sample's value and answer must equal Inspect's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import inspect_scorer_kit as kit
import pytest

from warehouse import Warehouse


@pytest.fixture(autouse=True)
def _own_registry():
    """Each test registers its scorers afresh: one CLI process is one user's set of scorers,
    and two tests' copies of the same scorer file must not clash by name in this process."""
    path = list(sys.path)
    yield from kit.isolated_registry()
    # each test writes its own copy of the team's files: the task file's `import team_scorer`
    # must find this test's copy, not the module (or the sys.path entry a loaded scorer file
    # adds) of an earlier test
    for name in ("team_scorer", "team_task"):
        sys.modules.pop(name, None)
    sys.path[:] = path


def _ours(
    db: Path, run_id: str, scorer: str
) -> dict[tuple[str, int], tuple[str, float | None, str | None, str]]:
    with Warehouse(db).read() as con:
        rows = con.execute(
            "SELECT sample_id, epoch, status, value, answer, reason FROM current_scores "
            "WHERE run_id = ? AND scorer = ? AND NOT starts_with(fingerprint, 'recorded:')",
            [run_id, scorer],
        ).fetchall()
    return {(s, e): (st, v, a, r) for s, e, st, v, a, r in rows}


def _as_float(value: object) -> float:
    return {"C": 1.0, "I": 0.0, "P": 0.5, "N": 0.0}.get(value, value)  # type: ignore[arg-type]


def _assert_equal_to_inspect(
    db: Path, scored_log, run_id: str, name: str, stored: str | None = None
) -> None:
    """gradebook's scores of the log (stored under `stored`, default `name`) are Inspect's."""
    reference = kit.inspect_scores(scored_log, name)
    ours = _ours(db, run_id, stored or name)
    assert set(ours) == set(reference)
    for key, (value, answer) in reference.items():
        status, our_value, our_answer, _ = ours[key]
        assert status == "scored", (key, ours[key])
        assert our_value == _as_float(value), (key, value, ours[key])
        assert our_answer == answer, (key, answer, ours[key])


@pytest.mark.slow
def test_choice_match_and_a_file_scorer_grade_as_inspect_does_at_eval_time(
    prefect_api, tmp_path: Path
) -> None:
    from inspect_ai import score as inspect_score
    from inspect_ai.log import read_eval_log
    from inspect_ai.scorer import choice

    from flows.score import score_flow

    scorer_file, task_file = kit.write_team_files(tmp_path / "team")
    sys.path.insert(0, str(task_file.parent))
    try:
        from sweeps.tasks import load_task

        team = load_task(f"{task_file}@team_task", {})
    finally:
        sys.path.remove(str(task_file.parent))
    runs = {
        "choice": kit.twice(kit.choice_task(), kit.MC_ANSWERS, tmp_path / "mc"),
        "match": kit.twice(kit.match_task(), kit.MATCH_ANSWERS, tmp_path / "match"),
        "last_word": kit.twice(team, ["2", "It is 4", "7", "eight", "10", "12."], tmp_path / "tm"),
    }
    db = tmp_path / "w.duckdb"
    out = tmp_path / "scored"
    # choice and match: the logs' own scorers (no --verifier); chunks of 3 so the worker
    # processes grade them, not this one. The log's match(numeric=True) is stored under its
    # variant's name; its scored copy names it `match`, as the log does (below)
    for name, stored in (("choice", "choice"), ("match", "match[numeric=true]")):
        scored, plain = runs[name]
        score_flow([plain.location], str(db), workers=2, chunk_size=3, progress=False,
                   scored_log_dir=str(out))  # fmt: skip
        _assert_equal_to_inspect(db, scored, plain.eval.eval_id, name, stored)
    # the team's scorer from its file (a log never makes gradebook import its task file)
    scored, plain = runs["last_word"]
    score_flow([plain.location], str(db), verifiers=[f"{scorer_file}@last_word"],
               workers=2, chunk_size=2, progress=False, scored_log_dir=str(out))  # fmt: skip
    _assert_equal_to_inspect(db, scored, plain.eval.eval_id, "last_word")

    # the trap this avoids: Inspect's own re-score of the same unscored multiple-choice log
    # grades by choice marks the log does not keep
    rescored = inspect_score(read_eval_log(runs["choice"][1].location), choice(),
                             model="mockllm/model", display="none")  # fmt: skip
    theirs = kit.inspect_scores(rescored, "choice")
    truth = kit.inspect_scores(runs["choice"][0], "choice")
    assert sum(theirs[k] != truth[k] for k in truth) >= 5

    # scored copies open in `inspect view` with their metrics, as `inspect score` writes them
    for name, (scored, plain) in runs.items():
        copy = read_eval_log(str(out / Path(plain.location).name))
        metrics = {s.name: {k: m.value for k, m in s.metrics.items()} for s in copy.results.scores}
        theirs = {s.name: {k: m.value for k, m in s.metrics.items()} for s in scored.results.scores}
        assert metrics[name]["accuracy"] == pytest.approx(theirs[name]["accuracy"])
        assert metrics[name]["stderr"] == pytest.approx(theirs[name]["stderr"])
        assert {s.id: s.scores[name].value for s in copy.samples} == {
            s.id: s.scores[name].value for s in scored.samples
        }


@pytest.mark.slow
def test_a_scorer_that_raises_leaves_exactly_those_samples_unscored(
    prefect_api, tmp_path: Path
) -> None:
    from flows.score import score_flow

    scorer_file, task_file = kit.write_team_files(tmp_path / "team")
    source = scorer_file.read_text()
    scorer_file.write_text(
        source.replace("RAISE_ON = set()", "RAISE_ON = {2, 5}").replace(
            "UNSCORED_ON = set()", "UNSCORED_ON = {4}"
        )
    )
    sys.path.insert(0, str(task_file.parent))
    try:
        from sweeps.tasks import load_task

        team = load_task(f"{task_file}@team_task", {"n": 8})
    finally:
        sys.path.remove(str(task_file.parent))
    _, plain = kit.twice(team, [str(2 * i) for i in range(1, 9)], tmp_path / "logs")
    db = tmp_path / "w.duckdb"
    [summary] = score_flow([plain.location], str(db), verifiers=[f"{scorer_file}@last_word"],
                           workers=2, chunk_size=2, progress=False,
                           scored_log_dir=str(tmp_path / "scored"))  # fmt: skip
    ours = _ours(db, plain.eval.eval_id, "last_word")
    unscored = {k[0]: v[3] for k, v in ours.items() if v[0] == "unscored"}
    assert unscored == {"2": "verifier_error", "5": "verifier_error", "4": "refusal"}
    assert {k[0] for k, v in ours.items() if v[0] == "scored" and v[1] == 1.0} == {
        "1", "3", "6", "7", "8"
    }  # fmt: skip
    assert (summary.scored, summary.unscored) == (5, 3)
    with Warehouse(db).read() as con:
        (trace,) = con.execute(
            "SELECT metadata->>'traceback' FROM scores WHERE scorer = 'last_word' "
            "AND sample_id = '2'"
        ).fetchone()
    assert "boom on sample 2" in trace

    # the scored copy: Inspect's ScoreReason, gradebook's finer code in the metadata
    from inspect_ai.log import read_eval_log

    copy = read_eval_log(str(tmp_path / "scored" / Path(plain.location).name))
    written = {str(s.id): s.scores["last_word"] for s in copy.samples}
    assert {k: (v.reason, v.metadata["gradebook_reason"]) for k, v in written.items()
            if k in unscored} == {
        "2": ("scoring_failed", "verifier_error"),
        "5": ("scoring_failed", "verifier_error"),
        "4": ("refusal", "refusal"),
    }  # fmt: skip
    assert all(written[k].value == "C" and written[k].reason is None for k in "13678")
    [result] = [s for s in copy.results.scores if s.name == "last_word"]
    assert result.scored_samples == 5 and result.unscored_samples == 3
    assert result.metrics["accuracy"].value == pytest.approx(1.0)


@pytest.mark.slow
def test_choice_with_no_multiple_choice_solver_is_unscored_not_graded_wrong(
    prefect_api, tmp_path: Path
) -> None:
    # choice() reads the marks multiple_choice puts on the choices; with a plain generate()
    # solver the log has nothing to rebuild them from (Inspect grades every sample I here)
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import choice
    from inspect_ai.solver import generate

    from flows.score import score_flow

    task = Task(
        dataset=MemoryDataset([Sample(input=f"Question {i}", choices=["a", "b"], target="A",
                                      id=i) for i in (1, 2, 3)]),
        solver=generate(), scorer=choice(), name="no_mc_solver",
    )  # fmt: skip
    _, plain = kit.twice(task, ["ANSWER: A"], tmp_path / "logs")
    db = tmp_path / "w.duckdb"
    score_flow([plain.location], str(db), workers=1, progress=False)
    ours = _ours(db, plain.eval.eval_id, "choice")
    assert {v[0] for v in ours.values()} == {"unscored"} and len(ours) == 3
    assert {v[3] for v in ours.values()} == {"choice_marks_unknown"}


@pytest.mark.slow
def test_a_sweep_without_verifiers_uses_the_tasks_scorers_and_the_watcher_rescores_an_edit(
    prefect_api, tmp_path: Path
) -> None:
    from flows.rescore import watch_verifiers
    from flows.sweep import sweep_flow
    from sweeps.config import parse_config

    scorer_file, task_file = kit.write_team_files(tmp_path / "team")
    answers = ["2", "It is 4", "7", "eight", "10", "12."]
    raw = {
        "name": "own-scorers",
        "log_dir": "logs",
        "warehouse": "w.duckdb",
        "models": [{"name": "m", "model": "mockllm/model",
                    "args": {"custom_outputs": kit.scripted_outputs(answers)}}],
        "tasks": [{"task": f"{task_file}@team_task"}],  # no verifiers key
        "gates": {"max_regression": None},
    }  # fmt: skip
    cfg = parse_config(raw, source=tmp_path / "sweep.toml")
    result = sweep_flow(cfg, workers=2, progress=False)
    rows = {r.scorer: r for r in result.rows}
    assert set(rows) == {"match", "last_word"}  # the task's own scorers
    # targets 2, 4, .., 12: "7" and "eight" are wrong for both
    assert rows["last_word"].accuracy == pytest.approx(4 / 6)
    assert rows["match"].accuracy == pytest.approx(4 / 6)
    run_id = result.generations[0].run_id
    log = json.loads(json.dumps(result.generations[0].log))
    from inspect_ai.log import read_eval_log

    recorded = read_eval_log(log, header_only=True).eval.metadata["verifiers"]
    assert [e["scorer"] for e in recorded] == ["inspect_ai/match", "last_word"]

    # the team edits its scorer: only its samples are graded again, and the flips shown
    scorer_file.write_text(scorer_file.read_text().replace("OFFSET = 0", "OFFSET = 1"))
    before = _ours(cfg.warehouse, run_id, "match")
    watched = watch_verifiers(str(cfg.warehouse), [f"{scorer_file}@last_word"], workers=2)
    assert [p.scorer for p in watched.rescored] == ["last_word"]
    [plan] = watched.rescored
    flipped = {(f["sample_id"], f["old_value"], f["new_value"]) for f in plan.flips}
    # now the target + 1 is wanted: "7" (question 3, target 6) becomes right, "eight" stays wrong
    assert flipped == {
        ("1", 1.0, 0.0), ("2", 1.0, 0.0), ("3", 0.0, 1.0), ("5", 1.0, 0.0), ("6", 1.0, 0.0)
    }  # fmt: skip
    assert _ours(cfg.warehouse, run_id, "match") == before
    with Warehouse(cfg.warehouse).read() as con:
        n = con.execute(
            "SELECT count(DISTINCT fingerprint) FROM scores WHERE scorer = 'match'"
        ).fetchone()[0]
    assert n == 1
    # nothing changed since: the next watcher run re-scores nothing
    again = watch_verifiers(str(cfg.warehouse), [f"{scorer_file}@last_word"], workers=2)
    assert again.rescored == []


@pytest.mark.slow
def test_an_inspect_evals_scorer_scores_through_the_stage(prefect_api, tmp_path: Path) -> None:
    # inspect_evals' datasets cannot be downloaded here: its AIME scorer on a local dataset
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate
    from inspect_evals.utils.aime_common import aime_scorer

    from flows.score import score_flow

    targets = ["204", "25", "116", "809", "33"]
    answers = ["So the answer is\n\\boxed{204}", "25", "Thus 117", "", "ANSWER: 33"]
    task = Task(
        dataset=MemoryDataset([Sample(input=f"AIME {i}", target=t, id=i)
                               for i, t in enumerate(targets, 1)]),
        solver=generate(), scorer=aime_scorer(), name="aime_local",
    )  # fmt: skip
    scored, plain = kit.twice(task, answers, tmp_path / "logs")
    db = tmp_path / "w.duckdb"
    score_flow([plain.location], str(db), verifiers=["inspect_evals/aime_scorer"], workers=2,
               chunk_size=2, progress=False)  # fmt: skip
    _assert_equal_to_inspect(db, scored, plain.eval.eval_id, "aime_scorer")
    with Warehouse(db).read() as con:
        (module, spec) = con.execute(
            "SELECT module, spec::VARCHAR FROM verifiers WHERE name = 'aime_scorer'"
        ).fetchone()
    assert module == "inspect_evals.utils.aime_common"
    assert json.loads(spec)["scorer"] == "inspect_evals/aime_scorer"


def test_values_convert_as_inspects_value_to_float_and_unreadable_ones_are_unscored() -> None:
    from inspect_ai.scorer import Score, value_to_float

    from warehouse.score_values import score_fields

    to_float = value_to_float()
    for value in ("C", "I", "P", "N", True, False, 1, 0, 0.25, "0.5", "yes", "no", "true"):
        [row] = score_fields(Score(value=value))
        assert (row.status, row.value) == ("scored", to_float(value)), value
        assert row.metadata["inspect_value"] == value  # the raw value is kept
    # where Inspect would warn and count 0, gradebook does not call it wrong
    for value in ("maybe", [1, 0]):
        [row] = score_fields(Score(value=value))
        assert (row.status, row.value, row.reason) == ("unscored", None, "unconvertible_value")
    [row] = score_fields(Score.unscored(reason="refusal", explanation="refused"))
    assert (row.status, row.reason, row.explanation) == ("unscored", "refusal", "refused")
    assert [(r.key, r.status, r.value) for r in score_fields(Score(value={"a": "C", "b": 0.5}))] == [
        (None, "scored", None), ("a", "scored", 1.0), ("b", "scored", 0.5)
    ]  # fmt: skip


DICT_SCORER = """
from inspect_ai.scorer import Score, Target, mean, scorer
from inspect_ai.solver import TaskState


@scorer(metrics={"exact": [mean()], "length": [mean()]})
def two_numbers():
    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion.strip()
        return Score(value={"exact": "C" if text == target.text else "I",
                            "length": float(len(text))}, answer=text)

    return score
"""


@pytest.mark.slow
def test_a_dict_valued_scorer_is_a_row_per_key_and_its_scored_copy_keeps_the_dict(
    prefect_api, tmp_path: Path
) -> None:
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.log import read_eval_log
    from inspect_ai.solver import generate

    from flows.score import score_flow
    from scorers.inspect_scorers.factories import load_scorer_file

    path = tmp_path / "dict_scorer.py"
    path.write_text(DICT_SCORER)
    scorer = load_scorer_file(str(path)).two_numbers()
    task = Task(
        dataset=MemoryDataset([Sample(input=f"Question {i}", target=str(i), id=i)
                               for i in (1, 2, 3)]),
        solver=generate(), scorer=scorer, name="dict_task",
    )  # fmt: skip
    scored, plain = kit.twice(task, ["1", "twenty", "333"], tmp_path / "logs")
    db = tmp_path / "w.duckdb"
    score_flow([plain.location], str(db), verifiers=[f"{path}@two_numbers"], workers=1,
               progress=False, scored_log_dir=str(tmp_path / "out"))  # fmt: skip
    run = plain.eval.eval_id
    exact = {k[0]: v[1] for k, v in _ours(db, run, "two_numbers:exact").items()}
    length = {k[0]: v[1] for k, v in _ours(db, run, "two_numbers:length").items()}
    assert exact == {"1": 1.0, "2": 0.0, "3": 0.0}
    assert length == {"1": 1.0, "2": 6.0, "3": 3.0}
    parent = _ours(db, run, "two_numbers")
    assert {v[0] for v in parent.values()} == {"scored"} and len(parent) == 3
    copy = read_eval_log(str(tmp_path / "out" / Path(plain.location).name))
    assert {s.id: s.scores["two_numbers"].value for s in copy.samples} == {
        s.id: s.scores["two_numbers"].value for s in scored.samples
    }
    ours = {s.name: s.metrics["mean"].value for s in copy.results.scores}
    theirs = {s.name: s.metrics["mean"].value for s in scored.results.scores}
    assert ours == pytest.approx(theirs)
