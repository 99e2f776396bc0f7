"""Judge-graded scorers against a real local judge server: outages, re-judging, identity.

The case gradebook is designed against: 6 samples, 2 answered wrong; the judge fails on 3
samples holding both wrong answers (HTTP 500, 429, and a call that hangs past its timeout).
Accuracy over the scored samples then reads 1.000, the truth is 0.667: the gate must fail on
the unscored samples, and once the judge is back the watcher re-judges exactly those 3 from the
saved transcripts, with the model under test never called again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cli_kit
import inspect_scorer_kit as kit
import judge_kit as jk
import pytest

from sweeps.mock_server import scripted_server
from warehouse import Warehouse

QUESTIONS, TARGETS, ANSWERS = jk.QUESTIONS, jk.TARGETS, jk.ANSWERS
Judge, _generator, _config = jk.Judge, jk.generator, jk.config


@pytest.fixture(autouse=True)
def _own_registry():
    path = list(sys.path)
    yield from kit.isolated_registry()
    sys.path[:] = path


def _latest(db: Path, run_id: str) -> dict[str, tuple[str, float | None, str | None]]:
    with Warehouse(db).read() as con:
        rows = con.execute(
            "SELECT sample_id, status, value, reason FROM latest_scores "
            "WHERE run_id = ? AND scorer = 'model_graded_qa'",
            [run_id],
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GEN_API_KEY", "test")
    monkeypatch.setenv("JUDGE_API_KEY", "test")
    judge = Judge()
    with (
        scripted_server(_generator, models=["m"]) as gen,
        scripted_server(judge, models=["j", "j2"]) as judge_server,
    ):
        yield gen, judge, judge_server
        judge.recover()  # no handler left waiting


@pytest.mark.slow
def test_a_judge_outage_is_unscored_gated_and_rejudged_when_the_judge_is_back(
    prefect_api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.rescore import watch_verifiers
    from flows.sweep import sweep_flow
    from sweeps.config import parse_config
    from verifiers.specs import scorer_files

    monkeypatch.setenv("GEN_API_KEY", "test")
    monkeypatch.setenv("JUDGE_API_KEY", "test")
    judge = Judge()
    with scripted_server(_generator, models=["m"]) as gen:
        with scripted_server(judge, models=["j"]) as judge_server:
            try:
                cfg = parse_config(
                    _config(tmp_path, gen.base_url, judge_server.base_url),
                    source=tmp_path / "sweep.toml",
                )
                result = sweep_flow(cfg, workers=2, progress=False)
                _check_the_outage(cfg, result, gen, judge)
            finally:
                judge.recover()  # no handler left waiting
        # the judge's server is down: its health check fails, the watcher waits, calls nobody
        before = judge.count()
        waiting = watch_verifiers(str(cfg.warehouse), scorer_files(cfg), workers=2)
        assert waiting.retry.retried == 0 and waiting.retry.waiting_for_judge == 3
        assert "connection refused" in waiting.retry.judge_down["model_graded_qa"]
        assert judge.count() == before
        port = int(judge_server.base_url.rsplit(":", 1)[1].split("/")[0])
        with scripted_server(judge, models=["j"], port=port):  # back, at the same URL
            _check_the_rejudging(cfg, result.rows[0].run_id, judge)
        assert gen.count() == 6  # the model under test was never called again


def _check_the_outage(cfg, result, gen, judge) -> None:
    from gates.evaluate import evaluate_gates

    generated = gen.count()
    assert generated == 6  # one generation per sample, nothing else ever reaches it
    [row] = result.rows
    run_id = row.run_id
    # the outage: both wrong answers sit among the unscored samples
    assert (row.scored, row.unscored, row.correct) == (3, 3, 3)
    assert row.accuracy == pytest.approx(1.0)
    assert row.accuracy_strict == pytest.approx(0.5)
    assert row.unscored_reasons == {"grader_failed": 3}
    assert row.gate == "fail"
    latest = _latest(cfg.warehouse, run_id)
    assert {s for s, (st, _, why) in latest.items() if why == "grader_failed"} == {"1", "2", "3"}
    with Warehouse(cfg.warehouse).read() as con:
        # the sweep's own retry pass tried once more while the judge was still down
        attempts = dict(
            con.execute(
                "SELECT sample_id, max(attempt) FROM scores WHERE run_id = ? GROUP BY 1", [run_id]
            ).fetchall()
        )
        why = con.execute(
            "SELECT explanation, metadata FROM latest_scores WHERE run_id = ? AND sample_id = '1'",
            [run_id],
        ).fetchone()
    assert attempts == {"1": 2, "2": 2, "3": 2, "4": 1, "5": 1, "6": 1}
    assert "500" in why[0]
    evidence = json.loads(why[1])["judge"]
    assert evidence and evidence[-1]["error"] and evidence[-1]["model"] == "openai-api/judge/j"
    [gate] = evaluate_gates(cfg.warehouse, [run_id], rules=cfg.gates)
    assert gate.verdict == "fail"
    assert [r.rule for r in gate.results if r.passed is False] == ["max_unscored_rate"]


def _check_the_rejudging(cfg, run_id: str, judge: Judge) -> None:
    from flows.rescore import watch_verifiers
    from gates.evaluate import evaluate_gates
    from verifiers.specs import scorer_files

    # the judge is back: the watcher's health check passes and it re-judges
    before = judge.count()
    watched = watch_verifiers(str(cfg.warehouse), scorer_files(cfg), workers=2)
    assert sorted(judge.arrived[before:]) == [1, 2, 3]  # exactly those 3 re-judged
    assert watched.retry.retried == 3
    latest = _latest(cfg.warehouse, run_id)
    assert all(st == "scored" for st, _, _ in latest.values())
    assert sum(v for _, v, _ in latest.values()) == 4  # 0.667 of 6
    [gate] = evaluate_gates(cfg.warehouse, [run_id], rules=cfg.gates)
    assert gate.verdict == "pass"
    with Warehouse(cfg.warehouse).read() as con:
        kept = con.execute(
            "SELECT sample_id, attempt, status, reason FROM scores WHERE run_id = ? "
            "AND sample_id IN ('1', '2', '3') ORDER BY 1, 2",
            [run_id],
        ).fetchall()
        metrics = con.execute(
            "SELECT accuracy, accuracy_strict FROM run_metrics WHERE run_id = ?", [run_id]
        ).fetchone()
        usage = con.execute(
            "SELECT calls, failed_calls, input_tokens, output_tokens FROM judge_usage "
            "WHERE run_id = ?",
            [run_id],
        ).fetchone()
    # every attempt kept: two grader_failed rows, then the verdict
    assert [(s, a, st, r) for s, a, st, r in kept if a < 3] == [
        (s, a, "unscored", "grader_failed") for s in ("1", "2", "3") for a in (1, 2)
    ]
    assert [(s, st) for s, a, st, _ in kept if a == 3] == [(s, "scored") for s in "123"]
    assert metrics[0] == pytest.approx(4 / 6) and metrics[1] == pytest.approx(4 / 6)
    calls, failed, tokens_in, tokens_out = usage
    assert calls >= 6 + 6 and failed >= 6 and tokens_in > 0 and tokens_out > 0
    # nothing left to re-judge: the next tick calls nobody
    before = judge.count()
    again = watch_verifiers(str(cfg.warehouse), scorer_files(cfg), workers=2)
    assert again.retry.retried == 0 and judge.count() == before


@pytest.mark.slow
def test_a_reply_with_no_verdict_is_unscored_and_not_retried(
    prefect_api, tmp_path: Path, servers
) -> None:
    from flows.rescore import watch_verifiers
    from flows.sweep import sweep_flow
    from sweeps.config import parse_config
    from verifiers.specs import scorer_files

    gen, judge, judge_server = servers
    judge.recover()
    judge.verdict = "none"
    cfg = parse_config(
        _config(tmp_path, gen.base_url, judge_server.base_url), source=tmp_path / "sweep.toml"
    )
    [row] = sweep_flow(cfg, workers=1, progress=False).rows
    assert row.unscored_reasons == {"verdict_unparseable": 6}
    assert judge.count() == 6  # the sweep's retry pass left them alone
    watched = watch_verifiers(str(cfg.warehouse), scorer_files(cfg), workers=1)
    assert watched.retry.retried == 0 and judge.count() == 6
    with Warehouse(cfg.warehouse).read() as con:
        explanation, metadata = con.execute(
            "SELECT explanation, metadata FROM latest_scores WHERE run_id = ? LIMIT 1",
            [row.run_id],
        ).fetchone()
    assert "Grade not found" in explanation
    [call] = json.loads(metadata)["judge"]  # the reply is kept: a new parser needs no call
    assert call["reply"] == "The submission looks reasonable to me."
    assert "[Submission]" in call["prompt"][-1]["content"] and call["usage"]["total_tokens"] > 0


@pytest.mark.slow
def test_swapping_the_judge_is_a_new_verifier_version_rescored_with_flips(
    prefect_api, tmp_path: Path, servers
) -> None:
    from flows.sweep import sweep_flow
    from sweeps.config import parse_config

    gen, judge, judge_server = servers
    judge.recover()
    judge.verdict = "always_c"  # a lenient judge: every answer passes
    raw = _config(tmp_path, gen.base_url, judge_server.base_url)
    cfg = parse_config(raw, source=tmp_path / "sweep.toml")
    [row] = sweep_flow(cfg, workers=1, progress=False).rows
    assert row.accuracy == pytest.approx(1.0)

    # the team swaps in a stricter judge model: the next process sees a new verifier version
    judge.verdict = "compare"
    spec = json.loads(json.dumps(cfg.tasks[0].verifiers[0]))
    spec["roles"]["grader"]["model"] = "openai-api/judge/j2"
    before = judge.count()
    env = cli_kit.shell_env(tmp_path / "home", api_url=prefect_api)
    ran = cli_kit.gradebook(
        "rescore", "--db", str(cfg.warehouse), "--verifier-module", json.dumps(spec),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.code == 0, ran.stderr
    assert judge.count() - before == 6  # every sample judged again by the new judge
    assert ran.stdout.count("flip model_graded_qa") == 2, ran.stdout
    with Warehouse(cfg.warehouse).read() as con:
        versions = con.execute(
            "SELECT count(DISTINCT fingerprint) FROM scores WHERE scorer = 'model_graded_qa'"
        ).fetchone()[0]
        flips = con.execute(
            "SELECT sample_id, old_value, new_value FROM grade_flips "
            "WHERE scorer = 'model_graded_qa' ORDER BY 1"
        ).fetchall()
        models = con.execute("SELECT judge_models FROM judge_usage ORDER BY calls").fetchall()
    assert versions == 2
    assert flips == [("1", 1.0, 0.0), ("2", 1.0, 0.0)]
    assert sorted(m[0][0] for m in models) == ["openai-api/judge/j", "openai-api/judge/j2"]
    assert gen.count() == 6


def test_a_judge_scorer_without_a_grader_is_a_one_line_config_error(tmp_path: Path) -> None:
    from sweeps.config import ConfigError, parse_config

    raw = _config(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
    del raw["model_roles"]
    with pytest.raises(ConfigError) as info:
        parse_config(raw, source=tmp_path / "sweep.toml")
    message = str(info.value)
    assert "\n" not in message
    assert "tasks[0]" in message and "model_roles.grader" in message


def test_a_judge_a_warehouse_names_is_not_called_on_its_word(tmp_path: Path) -> None:
    from scorers.inspect_scorers.specs import SpecError, resolve, spec_of

    spec = {
        "kind": "registry", "scorer": "model_graded_qa", "params": {},
        "roles": {"grader": {"model": "openai-api/judge/j", "base_url": "http://evil:1/v1"}},
    }  # fmt: skip
    with pytest.raises(SpecError, match="never calls on their word"):
        resolve(spec_of(spec), trusted=False)
    assert resolve(spec_of(spec), trusted=True).name == "model_graded_qa"
    assert resolve(spec_of(spec), trusted=False).name == "model_graded_qa"  # the user's own


@pytest.mark.slow
def test_score_and_rescore_take_the_judge_as_model_role(
    prefect_api, tmp_path: Path, servers
) -> None:
    """A log whose task scored with `model_graded_qa`, scored later without a config: the
    judge comes from `--model-role`, as in Inspect's CLI; never from the log."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import model_graded_qa
    from inspect_ai.solver import generate

    _, judge, judge_server = servers
    judge.recover()
    task = Task(
        dataset=MemoryDataset(
            [
                Sample(id=i, input=f"Q{i}: what is {q}?", target=TARGETS[i])
                for i, q in QUESTIONS.items()
            ]  # fmt: skip
        ),
        solver=generate(),
        scorer=model_graded_qa(),
    )
    answers = [ANSWERS[i] for i in sorted(ANSWERS)]
    model = get_model("mockllm/model", custom_outputs=kit.scripted_outputs(answers))
    [log] = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), score=False,
                         display="none")  # fmt: skip
    db = tmp_path / "w.duckdb"
    env = cli_kit.shell_env(
        tmp_path / "home", api_url=prefect_api,
        JUDGE_BASE_URL=judge_server.base_url, JUDGE_API_KEY="test",
    )  # fmt: skip

    no_judge = cli_kit.gradebook("score", log.location, "--db", str(db), env=env, cwd=tmp_path)
    assert no_judge.code == 2 and len(no_judge.stderr_lines) == 1, no_judge.stderr
    assert "--model-role grader=MODEL" in no_judge.stderr and judge.count() == 0

    bad = cli_kit.gradebook("score", log.location, "--db", str(db), "--model-role", "grader",
                            env=env, cwd=tmp_path)  # fmt: skip
    assert bad.code == 2 and len(bad.stderr_lines) == 1 and "ROLE=MODEL" in bad.stderr

    ran = cli_kit.gradebook(
        "score", log.location, "--db", str(db), "--model-role", "grader=openai-api/judge/j",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.code == 0, ran.stderr
    assert judge.count() == 6
    with Warehouse(db).read() as con:
        got = con.execute(
            "SELECT count(*), sum(value) FROM latest_scores WHERE scorer = 'model_graded_qa' "
            "AND status = 'scored'"
        ).fetchone()
    assert got == (6, 4.0)

    # the same judge again: nothing to do, no call
    again = cli_kit.gradebook(
        "rescore", "--db", str(db), "--model-role", "grader=openai-api/judge/j",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert again.code == 0 and judge.count() == 6, again.stdout + again.stderr
    # another judge model: a new verifier version, every sample judged again
    swapped = cli_kit.gradebook(
        "rescore", "--db", str(db), "--model-role", 'grader={"model": "openai-api/judge/j2"}',
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert swapped.code == 0, swapped.stderr
    assert judge.count() == 12


def _stored_rows(*questions: int) -> list[tuple]:
    """The case's samples as a grading worker gets them from the warehouse (SampleRow)."""
    return [
        (ANSWERS[i], [TARGETS[i]], "{}", str(i),
         json.dumps({"messages": [], "input": f"Q{i}: what is {QUESTIONS[i]}?",
                     "model": "openai-api/gen/m", "epoch": 1}))
        for i in questions
    ]  # fmt: skip


@pytest.mark.parametrize(
    "failure, cause",
    [
        (500, "500"),
        (429, "429"),
        ("hang", "imeout"),
        (b"{not json", ""),
        ("refused", "Connection"),
    ],
)
def test_every_way_a_judge_call_fails_is_grader_failed(
    failure: object, cause: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a grading process: 5xx, 429, a call past its timeout, a 200 whose body is not a
    completion, and a refused connection all leave the sample `grader_failed`, with the call's
    error kept; the other samples of the chunk are judged."""
    from scorers.inspect_scorers.grading import InspectGrade
    from scorers.workers.pool import grade_chunk

    monkeypatch.setenv("JUDGE_API_KEY", "test")
    judge = Judge()
    judge.failing = {1: failure if failure != "refused" else 500}
    with scripted_server(judge, models=["j"]) as server:
        url = server.base_url
        if failure == "refused":
            url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
        spec = {
            "kind": "registry", "scorer": "model_graded_qa", "params": {},
            "roles": {"grader": {"model": "openai-api/judge/j", "base_url": url,
                                 "args": {"max_retries": 0},
                                 "config": {"max_retries": 1, "attempt_timeout": 1}}},
        }  # fmt: skip
        rows = _stored_rows(1, 4)
        try:
            results = grade_chunk(InspectGrade(json.dumps(spec)), rows, 30.0)
        finally:
            judge.recover()
    (status, _, _, explanation, reason, meta, _), second = results
    assert (status, reason) == ("unscored", "grader_failed"), explanation
    assert cause in explanation
    calls = json.loads(meta)["judge"]
    assert calls and calls[-1]["error"] and calls[-1]["reply"] is None
    if failure == "refused":
        assert second[4] == "grader_failed"
    else:
        assert second[:2] == ("scored", 1.0)


def test_a_failing_judge_call_is_one_request_per_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inspect retries a judge call (`config.max_retries`); the OpenAI SDK under it retried
    each attempt twice more by itself, so "failed after 3 attempts" was 9 requests. A binding
    as a config or `--model-role` makes it (`RoleModel.to_json`) turns the SDK's retries off."""
    from scorers.inspect_scorers.grading import InspectGrade
    from scorers.workers.pool import grade_chunk
    from sweeps.config import RoleModel

    monkeypatch.setenv("JUDGE_API_KEY", "test")
    judge = Judge()
    judge.failing = {1: 500}
    with scripted_server(judge, models=["j"]) as server:
        role = RoleModel(model="openai-api/judge/j", base_url=server.base_url,
                         config={"max_retries": 2, "attempt_timeout": 5}).to_json()  # fmt: skip
        spec = {"kind": "registry", "scorer": "model_graded_qa", "params": {},
                "roles": {"grader": role}}  # fmt: skip
        rows = _stored_rows(1, 4)
        try:
            failed, judged = grade_chunk(InspectGrade(json.dumps(spec)), rows, 120.0)
        finally:
            judge.recover()
    attempts = json.loads(failed[5])["judge"]  # Inspect records one call per attempt
    assert failed[4] == "grader_failed" and "after 3 attempt(s)" in failed[3]
    assert judge.arrived.count(1) == len(attempts) == 3  # requests == attempts
    assert judge.arrived.count(4) == 1 and judged[:2] == ("scored", 1.0)


@pytest.mark.slow
def test_a_partial_rejudge_reports_its_own_flips_apart_from_the_logs_and_the_runs_totals(
    prefect_api, tmp_path: Path, servers
) -> None:
    """A log Inspect scored at eval time with a lenient judge (every answer C), graded again
    by gradebook's judge, which fails on sample 1: healing re-judges that one sample. Its summary
    must not list the other samples' disagreements with the log as this pass's flips, and must
    say where the whole run stands, not only the one row it wrote."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import model_graded_qa
    from inspect_ai.solver import generate

    _, judge, judge_server = servers
    judge.failing = {1: 500}
    dataset = MemoryDataset(
        [Sample(id=i, input=f"Q{i}: what is {q}?", target=TARGETS[i]) for i, q in QUESTIONS.items()]
    )
    task = Task(dataset=dataset, solver=generate(), scorer=model_graded_qa())
    [log] = inspect_eval(
        task, model=kit.scripted([ANSWERS[i] for i in sorted(ANSWERS)]),
        model_roles={"grader": kit.scripted(["GRADE: C"])},
        log_dir=str(tmp_path / "logs"), display="none",
    )  # fmt: skip
    env = cli_kit.shell_env(tmp_path / "home", api_url=prefect_api)
    role = json.dumps({"model": "openai-api/judge/j", "base_url": judge_server.base_url,
                       "config": {"max_retries": 0, "attempt_timeout": 60}})  # fmt: skip
    scored = cli_kit.gradebook("score", log.location, "--db", "w.duckdb", "--model-role",
                               f"grader={role}", env=env, cwd=tmp_path)  # fmt: skip
    assert scored.code == 0, scored.stdout + scored.stderr
    assert "1 sample unscored (grader_failed 1)" in scored.stdout
    [heal] = [line.strip() for line in scored.stdout.splitlines() if " rescore " in line]
    judge.recover()

    healed = cli_kit.run(["/bin/sh", "-c", heal], env, tmp_path)
    assert healed.code == 0, healed.stdout + healed.stderr
    assert judge.arrived.count(1) == 2, (scored.stdout, healed.stdout)  # failed, then judged
    lines = healed.stdout.splitlines()
    [row] = [line for line in lines if line.startswith("│ model_graded_qa")]
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[3:] == ["1", "1", "0", "1"]  # samples, retries, flipped 0, vs log 1
    assert not [line for line in lines if line.strip().startswith("flip ")]
    [against_log] = [line for line in lines if line.strip().startswith("vs log ")]
    assert "#1.1: 1.0 -> 0.0" in against_log  # the log said C; the judge, back, says I
    assert (
        "model_graded_qa: this pass graded 1 sample(s) (1 scored, 0 not); its 1 run now: "
        "6 scored, 0 unscored, 0 errored of 6, accuracy 66.7% (strict 66.7%)"
    ) in healed.stdout
