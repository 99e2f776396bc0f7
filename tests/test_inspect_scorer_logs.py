"""Logs from elsewhere and Inspect scorers (issue 18): the scores real logs hold are kept as
history, re-scoring never overwrites them, a scorer a log names that cannot be resolved is one
line per log (and a file a log names is never imported), and an Inspect scorer's fingerprint
covers its code, its params and the version of the distribution that provides it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cli_kit
import inspect_scorer_kit as kit
import pytest

from warehouse import Warehouse


@pytest.fixture(autouse=True)
def _own_verifier_registry():
    yield from kit.isolated_registry()


def _shared_logs(shared_data: Path) -> list[Path]:
    return sorted(p for p in (shared_data / "logs").iterdir() if p.suffix in (".eval", ".json"))


def _held(logs: list[Path]) -> tuple[dict[tuple[str, str, int, str], Any], dict[tuple, float]]:
    """(run_id, sample_id, epoch, scorer) -> the Score each log holds (a log stored twice, in
    two formats, once), and (run_id, scorer) -> the accuracy its results report. `scorer` is
    the name gradebook stores it under: the log's key, with the scorer's options when it has
    any (`model_graded_fact[instructions=...]`), as gradebook's own re-score of it is named."""
    from inspect_ai.log import read_eval_log

    from warehouse.recorded_scores import inspect_names

    scores: dict[tuple[str, str, int, str], Any] = {}
    accuracy: dict[tuple, float] = {}
    for path in logs:
        log = read_eval_log(str(path))
        stored = {key: name for name, key in inspect_names(log).items()}
        for sample in log.samples or []:
            for key, score in (sample.scores or {}).items():
                name = stored.get(key, key)
                scores[(log.eval.eval_id, str(sample.id), sample.epoch, name)] = (
                    score,
                    log.eval.packages.get("inspect_ai"),
                )
        if log.samples and any(s.scores for s in log.samples):
            for result in log.results.scores:
                name = stored.get(result.name, result.name)
                accuracy[(log.eval.eval_id, name)] = result.metrics["accuracy"].value
    return scores, accuracy


def _recorded_rows(db: Path) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute(
            "SELECT run_id, sample_id, epoch, scorer, fingerprint, status, value, answer, "
            "explanation, scored_at FROM scores WHERE starts_with(fingerprint, 'recorded:') "
            "ORDER BY ALL"
        ).fetchall()


def test_ingesting_the_shared_logs_keeps_the_scores_they_hold(
    shared_data: Path, tmp_path: Path
) -> None:
    from inspect_ai.scorer import value_to_float

    logs = _shared_logs(shared_data)
    held, accuracy = _held(logs)
    assert len(held) >= 8 and accuracy  # the data this test is about
    db = tmp_path / "w.duckdb"
    Warehouse(db).ingest_logs([str(p) for p in logs])
    rows = {(r[0], r[1], r[2], r[3]): r for r in _recorded_rows(db)}
    assert set(rows) == set(held)
    to_float = value_to_float()
    for key, (score, version) in held.items():
        row = rows[key]
        assert row[4].startswith(f"recorded:inspect_ai-{version}:"), row
        assert (row[5], row[6], row[7]) == ("scored", to_float(score.value), score.answer)
    with Warehouse(db).read() as con:
        reported = {
            (run, scorer): acc
            for run, scorer, acc in con.execute(
                "SELECT run_id, scorer, accuracy FROM run_metrics "
                "WHERE starts_with(fingerprint, 'recorded:')"
            ).fetchall()
        }
        # a recorded fingerprint says where it came from, dated at the log
        labels = {
            r[0]
            for r in con.execute(
                "SELECT label FROM verifiers WHERE starts_with(fingerprint, 'recorded:')"
            ).fetchall()
        }
        history = con.execute(
            "SELECT count(*) FROM score_history WHERE starts_with(fingerprint, 'recorded:')"
        ).fetchone()[0]
    # run_metrics reports what each log's own results say
    assert reported == pytest.approx(accuracy)
    assert all(label.startswith("recorded in the log by Inspect ") for label in labels)
    assert history >= len(reported)

    # ingesting them again adds nothing and changes nothing
    before = _recorded_rows(db)
    Warehouse(db).ingest_logs([str(p) for p in logs])
    assert _recorded_rows(db) == before


@pytest.mark.slow
def test_rescoring_real_logs_agrees_with_their_scores_and_keeps_them(
    prefect_api, shared_data: Path, tmp_path: Path
) -> None:
    from flows.score import score_flow

    # MMLU with choice() (marks rebuilt from the saved output as multiple_choice parses it)
    # and a match() log, each scored by the scorers the log names
    logs = [
        shared_data / "logs" / "mmlu-summary-choices.eval",
        shared_data / "logs" / "2025-05-12T20-28-13-04-00_popularity.json",
    ]
    held, _ = _held(logs)
    db = tmp_path / "w.duckdb"
    Warehouse(db).ingest_logs([str(p) for p in logs])
    recorded = _recorded_rows(db)
    score_flow([str(p) for p in logs], str(db), workers=1, progress=False)
    assert _recorded_rows(db) == recorded  # never overwritten
    with Warehouse(db).read() as con:
        ours = {
            (r[0], r[1], r[2], r[3]): (r[4], r[5])
            for r in con.execute(
                "SELECT run_id, sample_id, epoch, scorer, status, value FROM latest_scores "
                "WHERE NOT starts_with(fingerprint, 'recorded:')"
            ).fetchall()
        }
        flips = con.execute("SELECT count(*) FROM grade_flips").fetchone()[0]
    from inspect_ai.scorer import value_to_float

    assert set(ours) == set(held)
    assert {k: ("scored", value_to_float()(v[0].value)) for k, v in held.items()} == ours
    assert flips == 0  # today's scorers agree with what was recorded then

    # `gradebook verifiers` lists the Inspect scorers and the recorded fingerprints
    ran = cli_kit.gradebook(
        "verifiers", "--db", str(db), env=cli_kit.shell_env(tmp_path / "home"), cwd=tmp_path
    )
    assert ran.code == 0, ran
    lines = [line for line in ran.stdout.splitlines() if "│" in line]
    choice_row = next(line for line in lines if line.startswith("│ choice "))
    assert "Inspect scorer" in choice_row and "yes" in choice_row
    assert any("recorded:0.3.154.dev44:" in line for line in lines)
    assert "inspect_evals/NAME" in ran.stdout


def _plain_match_log(tmp_path: Path) -> Any:
    from inspect_ai import eval as inspect_eval

    return inspect_eval(kit.match_task(), model=kit.scripted(kit.MATCH_ANSWERS), limit=3,
                        log_dir=str(tmp_path / "logs"), score=False, display="none")[0]  # fmt: skip


def test_scorers_a_log_names_that_cannot_be_resolved_are_one_line_per_log(
    tmp_path: Path,
) -> None:
    from inspect_ai.log import write_eval_log
    from inspect_ai.log._log import EvalScorer

    plain = _plain_match_log(tmp_path)
    # a scorer of a package that is not installed, as a log from elsewhere names it
    missing = plain.model_copy(deep=True)
    missing.eval.scorers = [EvalScorer(name="nosuchpkg/grader", options={})]
    missing_path = tmp_path / "missing_pkg.eval"
    write_eval_log(missing, str(missing_path))
    # a log that names a scorer file: importing it would run code the log chose
    marker = tmp_path / "imported"
    evil = tmp_path / "evil_scorer.py"
    evil.write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from inspect_ai.scorer import scorer, Score\n"
        "@scorer(metrics=[])\n"
        "def evil():\n"
        "    async def score(state, target):\n"
        "        return Score(value=1)\n"
        "    return score\n"
    )
    named = plain.model_copy(deep=True)
    named.eval.metadata = {
        "verifiers": [{"kind": "file", "scorer": "evil", "file": str(evil), "params": {}}]
    }
    named_path = tmp_path / "names_a_file.eval"
    write_eval_log(named, str(named_path))
    good = tmp_path / "good.eval"
    write_eval_log(plain, str(good))

    db = tmp_path / "w.duckdb"
    env = cli_kit.shell_env(tmp_path / "home")
    ran = cli_kit.gradebook(
        "score", str(missing_path), str(named_path), str(good), "--db", str(db),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.code == 2, ran
    lines = ran.stderr_lines
    assert len(lines) == 2, lines
    assert (
        str(missing_path) in lines[0]
        and "'nosuchpkg' that defines it is not installed" in (lines[0])
    )
    assert str(named_path) in lines[1] and "--verifier-module" in lines[1]
    assert not marker.exists()  # the file the log names was never imported
    if db.exists():  # nothing written, not even the good log's samples
        with Warehouse(db).read() as con:
            assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 0


def test_an_inspect_scorers_fingerprint_covers_its_code_params_and_distribution_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import inspect_ai

    from scorers.identity import fingerprint as fp_mod
    from scorers.inspect_scorers.specs import ScorerSpec, resolve

    plain = resolve(ScorerSpec("match"), trusted=False)
    numeric = resolve(ScorerSpec("match", {"numeric": True}, name="match_numeric"), trusted=False)
    aime = resolve(ScorerSpec("inspect_evals/aime_scorer"), trusted=False)
    fp_plain, fp_numeric, fp_aime = (fp_mod.fingerprint(v) for v in (plain, numeric, aime))
    assert fp_plain.digest != fp_numeric.digest  # params
    # the scorer's own code (Inspect's match), gradebook's rebuild and conversion, versions
    assert "# ---- module inspect_ai.scorer._match" in fp_plain.source
    assert "# ---- module scorers.inspect_scorers.task_state" in fp_plain.source
    versions = json.loads(
        next(line for line in fp_plain.source.splitlines() if line.startswith("# versions "))[11:]
    )
    assert versions["inspect_ai"] == inspect_ai.__version__
    assert '"inspect_evals"' in fp_aime.source and "aime_common" in fp_aime.source

    # upgrading Inspect (0.3.221 changed match(numeric=True)) is a new fingerprint
    real = fp_mod._installed()
    upgraded = {**real, "versions": {**real["versions"], "inspect_ai": "0.3.999"}}
    monkeypatch.setattr(fp_mod, "_installed", lambda: upgraded)
    assert fp_mod.fingerprint(plain).digest != fp_plain.digest
    assert fp_mod.fingerprint(numeric).digest != fp_numeric.digest


def _variant_logs(log_dir: Path) -> list[Any]:
    """Logs of one task scored by variants of one scorer, as teams write them: match() and
    match(numeric=True), model_graded_qa() with and without instructions; .eval and .json."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match, model_graded_qa
    from inspect_ai.solver import generate

    dataset = MemoryDataset(
        [Sample(id=i, input=f"Question {i}?", target=t) for i, t in enumerate(["4", "7", "9"], 1)]
    )
    variants = [
        (match(), "eval"),
        (match(numeric=True), "json"),
        (model_graded_qa(), "eval"),
        (model_graded_qa(instructions="Grade strictly. End with GRADE: C or GRADE: I."), "json"),
    ]
    logs = []
    for scorer, fmt in variants:
        task = Task(dataset=dataset, solver=generate(), scorer=scorer, name="variants")
        [log] = inspect_eval(task, model=kit.scripted(["4", "7.0", "nine"]), score=False,
                             log_dir=str(log_dir), log_format=fmt, display="none")  # fmt: skip
        logs.append(log)
    return logs


@pytest.mark.slow
def test_one_score_call_grades_a_directory_of_mixed_variants_and_formats(
    prefect_api, shared_data: Path, tmp_path: Path
) -> None:
    """`gradebook score` over the shared real logs (.eval and .json, one of them renamed by
    hand) and logs whose scorers are variants of one another: every log is graded in one call,
    each variant under a name of its own, and what is not a log is named, not silently
    skipped."""
    from sweeps.mock_server import scripted_server

    mine = _variant_logs(tmp_path / "mine")
    with scripted_server(lambda model, messages: "GRADE: C", models=["j"]) as judge:
        role = json.dumps({"model": "openai-api/judge/j", "base_url": judge.base_url})
        env = cli_kit.shell_env(tmp_path / "home", api_url=prefect_api, JUDGE_API_KEY="test")
        ran = cli_kit.gradebook(
            "score", str(shared_data / "logs"), str(tmp_path / "mine"), "--db", "w.duckdb",
            "--model-role", f"grader={role}", env=env, cwd=tmp_path,
        )  # fmt: skip
    assert ran.code == 0, ran.stdout + ran.stderr
    assert "LICENSE.inspect_ai" in ran.stderr and "not Inspect logs" in ran.stderr
    with Warehouse(tmp_path / "w.duckdb").read() as con:
        graded = dict(
            con.execute(
                "SELECT r.log_path, list(DISTINCT s.scorer ORDER BY s.scorer) FROM runs r "
                "JOIN scores s USING (run_id) WHERE NOT starts_with(s.fingerprint, 'recorded:') "
                "GROUP BY ALL"
            ).fetchall()
        )
        runs = {p for (p,) in con.execute("SELECT log_path FROM runs").fetchall()}
    by_name = {Path(p).name: scorers for p, scorers in graded.items()}
    # every log that has samples was graded by gradebook, the .json ones too
    with_samples = {Path(p).name for p in runs} - {"2025-05-12T20-28-13-04-00_no-samples.json"}
    assert with_samples <= set(by_name), sorted(with_samples - set(by_name))
    assert {"log_formats.json", "log_tool_call_error.json"} <= set(by_name)
    assert by_name["log_tool_call_error.json"] == ["includes"]
    # the variants, each under its own stable name
    names = [by_name[Path(log.location).name] for log in mine]
    assert names[0] == ["match"] and names[1] == ["match[numeric=true]"]
    assert names[2] == ["model_graded_qa"]
    assert len(names[3]) == 1 and names[3][0].startswith("model_graded_qa[instructions=")
    fact = by_name["2024-11-05T13-32-37-05-00_input-task_hxs4q9azL3ySGkjJirypKZ.eval"]
    assert len(fact) == 1 and fact[0].startswith("model_graded_fact[instructions=")
