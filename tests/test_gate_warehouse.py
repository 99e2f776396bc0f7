"""The gate over a real warehouse: real Inspect logs (mockllm), real ingest, real DuckDB."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from gate_world import exact, ingest, outage_judge, run_eval, score_run
from inspect_ai.log import read_eval_log, write_eval_log

from gates.evaluate import evaluate_gates, overall_exit_code
from gates.records import gate_run, planned_samples
from gates.rules import GateRules
from gates.stats import mcnemar_exact, pass_at_k
from warehouse import Warehouse

pytestmark = pytest.mark.slow

FP = {"exact": "fp-v1"}
N = 40


def _answers(wrong: set[int], n: int = N) -> list[str]:
    return ["x" if i in wrong else str(i) for i in range(n)]


@dataclass
class World:
    wh: Warehouse
    baseline: str
    regressed: str
    reshuffled: str
    outage: str
    multi: str
    partial: str
    errored: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("gates")
    logs = root / "logs"
    wh = Warehouse(root / "gradebook.duckdb")

    def run(answers: list[str], **kw) -> str:
        rid = ingest(wh, run_eval(logs, answers, **kw))
        score_run(wh, rid, exact, fingerprint="fp-v1")
        return rid

    # "arith" x mockllm: a passing baseline, then a real regression, then a reshuffle.
    baseline = run(_answers({0, 1, 2, 3}))  # 36/40
    regressed = run(_answers({0, 1, 2, 3} | set(range(10, 22))))  # loses 12, gains none
    reshuffled = run(_answers({0, 1, 30, 31}))  # 36/40: 2 lost, 2 gained

    # The outage: 30 samples, 20 right; the judge times out on exactly the 10 wrong ones.
    outage_log = run_eval(logs, _answers(set(range(20, 30)), 30), task_name="outage")
    outage = ingest(wh, outage_log)
    score_run(wh, outage, outage_judge, fingerprint="fp-v1")

    # Three epochs per sample for pass@k.
    multi_answers = [
        a
        for epoch in (
            ["0", "x", "x", "3", "x", "x"],
            ["x", "x", "2", "3", "x", "x"],
            ["x", "1", "x", "3", "x", "5"],
        )
        for a in epoch
    ]
    multi = run(multi_answers, task_name="multi", epochs=3)

    # A run cut short: 10 of 20 samples survive in the log.
    full = run_eval(logs, _answers(set(), 20), task_name="partial")
    cut = read_eval_log(str(full))
    cut.eval.eval_id = cut.eval.eval_id + "cut"
    cut.samples = (cut.samples or [])[:10]
    cut.status = "cancelled"
    write_eval_log(cut, str(root / "cut.eval"))
    partial = ingest(wh, root / "cut.eval")
    score_run(wh, partial, exact, fingerprint="fp-v1")

    # Generation errors on 3 of 20 samples.
    errored = run(_answers(set(), 20), task_name="flaky", errors=[2, 5, 7])

    assert gate_run(wh, baseline, GateRules(), FP).verdict == "pass"
    return World(wh, baseline, regressed, reshuffled, outage, multi, partial, errored)


def rule(result, name: str):
    [r] = [r for r in result.results if r.rule == name]
    return r


def test_outage_fails_on_unscored_rate_and_shows_both_accuracies(world: World) -> None:
    res = gate_run(world.wh, world.outage, GateRules(), FP)
    assert res.verdict == "fail" and res.exit_code == 1
    unscored = rule(res, "max_unscored_rate")
    assert unscored.passed is False
    assert unscored.value == pytest.approx(10 / 30)
    assert res.metrics["exact"]["accuracy"] == pytest.approx(1.0)
    assert res.metrics["exact"]["accuracy_strict"] == pytest.approx(2 / 3)
    # max_unscored_rate is the rule that fails; relaxing it lets the run pass when no accuracy
    # floor is set, which shows the verdict came from that rule alone.
    relaxed = gate_run(world.wh, world.outage, GateRules(max_unscored_rate=0.5), FP, record=False)
    assert relaxed.verdict == "pass"


def test_outage_min_accuracy_uses_strict_accuracy_by_default(world: World) -> None:
    strict = gate_run(
        world.wh, world.outage, GateRules(max_unscored_rate=None, min_accuracy=0.9), FP
    )
    assert rule(strict, "min_accuracy:outage").value == pytest.approx(2 / 3)
    assert strict.verdict == "fail"
    lenient = GateRules(max_unscored_rate=None, min_accuracy=0.9, metric="accuracy")
    res = gate_run(world.wh, world.outage, lenient, FP, record=False)
    assert rule(res, "min_accuracy:outage").value == pytest.approx(1.0)
    assert res.verdict == "pass"  # exactly the trap the strict default exists to avoid


def test_real_regression_is_flagged_against_last_passing_run(world: World) -> None:
    res = gate_run(world.wh, world.regressed, GateRules(), FP)
    assert res.baseline_run_id == world.baseline
    reg = rule(res, "max_regression")
    assert reg.passed is False
    assert reg.value == pytest.approx(-12 / N)
    assert f"p={mcnemar_exact(0, 12):.4g}" in reg.detail
    assert "CI" in reg.detail
    assert res.verdict == "fail" and res.exit_code == 1


def test_same_accuracy_reshuffle_is_not_flagged(world: World) -> None:
    res = gate_run(world.wh, world.reshuffled, GateRules(), FP)
    # The regressed run failed, so the baseline is still the last run that passed.
    assert res.baseline_run_id == world.baseline
    reg = rule(res, "max_regression")
    assert reg.value == pytest.approx(0.0)
    assert reg.passed is True
    assert "2 gained, 2 lost" in reg.detail
    assert res.verdict == "pass"


def test_named_baseline_and_unknown_baseline(world: World) -> None:
    res = gate_run(
        world.wh, world.reshuffled, GateRules(baseline=world.regressed), FP, record=False
    )
    assert res.baseline_run_id == world.regressed
    assert rule(res, "max_regression").value == pytest.approx(12 / N)  # an improvement
    assert rule(res, "max_regression").passed is True
    missing = gate_run(world.wh, world.reshuffled, GateRules(baseline="nope-nope"), FP)
    assert missing.verdict == "cannot_evaluate" and missing.exit_code == 2
    assert "baseline run 'nope-nope'" in missing.problems[0]


def test_coverage_rule_on_a_run_cut_short(world: World) -> None:
    res = gate_run(world.wh, world.partial, GateRules(), FP)
    cov = rule(res, "min_coverage")
    assert cov.value == pytest.approx(0.5)
    assert cov.passed is False
    assert "10 present / 20 expected" in cov.detail
    ok = gate_run(world.wh, world.partial, GateRules(min_coverage=0.5), FP, record=False)
    assert rule(ok, "min_coverage").passed is True


def test_error_rate_rule_on_generation_errors(world: World) -> None:
    res = gate_run(world.wh, world.errored, GateRules(max_error_rate=0.1), FP, record=False)
    err = rule(res, "max_error_rate")
    assert err.value == pytest.approx(3 / 20)
    assert err.passed is False
    res = gate_run(world.wh, world.errored, GateRules(max_error_rate=0.15), FP, record=False)
    assert rule(res, "max_error_rate").passed is True


def test_pass_at_k_in_run_metrics_and_as_gate_metric(world: World) -> None:
    # per sample correct counts over 3 epochs: q0 1, q1 1, q2 1, q3 3, q4 0, q5 1
    counts = [1, 1, 1, 3, 0, 1]
    expected = {k: sum(pass_at_k(3, c, k) for c in counts) / 6 for k in (1, 2, 3)}
    with world.wh.read() as con:
        epochs, values = con.execute(
            "SELECT epochs, pass_at_k FROM run_metrics WHERE run_id = ?", [world.multi]
        ).fetchone()
    assert epochs == 3
    assert values == pytest.approx([expected[1], expected[2], expected[3]])
    res = gate_run(
        world.wh, world.multi, GateRules(metric="pass@2", min_accuracy=0.8), FP, record=False
    )
    assert rule(res, "min_accuracy:multi").value == pytest.approx(expected[2])
    assert rule(res, "min_accuracy:multi").passed is (expected[2] >= 0.8)
    too_far = gate_run(
        world.wh, world.multi, GateRules(metric="pass@5", min_accuracy=0.5), FP, record=False
    )
    assert too_far.verdict == "cannot_evaluate"


def test_old_fingerprint_says_to_rescore(world: World) -> None:
    res = gate_run(world.wh, world.baseline, GateRules(), {"exact": "fp-v2"})
    assert res.verdict == "cannot_evaluate" and res.exit_code == 2
    [problem] = res.problems
    assert f"gradebook rescore --db {world.wh.path} --scorer exact`" in problem
    assert "fp-v1" in problem


def test_unknown_run_and_unscored_run(world: World, tmp_path: Path) -> None:
    res = gate_run(world.wh, "no-such-run", GateRules(), FP)
    assert res.verdict == "cannot_evaluate" and "unknown run" in res.problems[0]
    with world.wh.read() as con:
        n = con.execute("SELECT count(*) FROM gates WHERE run_id = 'no-such-run'").fetchone()
    assert n == (0,)  # nothing to attach an unknown id to
    wh = Warehouse(tmp_path / "fresh.duckdb")
    rid = ingest(wh, run_eval(tmp_path / "logs", ["0", "1"], task_name="fresh"))
    res = gate_run(wh, rid, GateRules(), FP)
    assert res.exit_code == 2
    [log] = (tmp_path / "logs").glob("*.eval")
    assert f"gradebook score {log} --db {wh.path} --verifier NAME`" in res.problems[0]


def test_the_gate_judges_a_retried_outage_by_its_retried_grades(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "retry.duckdb")
    logs = tmp_path / "logs"
    answers = _answers({0, 1, 2, 3})
    base = ingest(wh, run_eval(logs, answers, task_name="retry"))
    score_run(wh, base, exact)
    assert gate_run(wh, base, GateRules(), FP).verdict == "pass"
    cand = ingest(wh, run_eval(logs, answers, task_name="retry"))
    score_run(wh, cand, outage_judge)  # the judge times out on the 4 wrong answers
    assert gate_run(wh, cand, GateRules(), FP, record=False).verdict == "fail"

    assert score_run(wh, cand, exact, retry="all") == 4  # the judge is back
    rules = GateRules(metric="accuracy")
    res = gate_run(wh, cand, rules, FP, record=False)
    assert res.verdict == "pass"
    assert rule(res, "max_unscored_rate").value == 0.0
    assert res.metrics["exact"]["accuracy"] == pytest.approx(36 / 40)
    # paired on every sample with the retried verdicts: nothing gained, nothing lost
    assert res.baseline_run_id == base
    assert "on 40 shared samples" in rule(res, "max_regression").detail
    assert rule(res, "max_regression").value == 0.0


def test_run_id_prefix_is_accepted(world: World) -> None:
    res = gate_run(world.wh, world.reshuffled[:10], GateRules(), FP, record=False)
    assert res.run_id == world.reshuffled


def test_every_evaluation_is_a_gates_row(world: World) -> None:
    before = _gate_rows(world.wh)
    res = gate_run(world.wh, world.outage, GateRules(), FP)
    after = _gate_rows(world.wh)
    assert len(after) == len(before) + 1
    row = after[-1]
    assert row["gate_id"] == res.gate_id
    assert (row["verdict"], row["exit_code"]) == ("fail", 1)
    assert json.loads(row["fingerprints"]) == {"exact": "fp-v1"}
    assert json.loads(row["rules"])["max_unscored_rate"] == 0.05
    stored = {r["rule"]: r for r in json.loads(row["results"])}
    assert stored["max_unscored_rate"]["passed"] is False
    assert stored["max_unscored_rate"]["value"] == pytest.approx(1 / 3)
    assert json.loads(row["metrics"])["exact"]["accuracy"] == pytest.approx(1.0)


def _gate_rows(wh: Warehouse) -> list[dict]:
    with wh.read() as con:
        cur = con.execute(
            "SELECT gate_id, verdict, exit_code, rules::VARCHAR AS rules, "
            "results::VARCHAR AS results, fingerprints::VARCHAR AS fingerprints, "
            "metrics::VARCHAR AS metrics FROM gates ORDER BY created"
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_newest_run_per_task_and_model(world: World) -> None:
    results = evaluate_gates(world.wh, None, rules=GateRules(), fingerprints=FP, record=False)
    by_task = {r.task: r.run_id for r in results}
    assert by_task["arith"] == world.reshuffled
    assert by_task["outage"] == world.outage
    assert overall_exit_code(results) == 1  # the outage (and the cut run) fail


def test_sweep_selects_its_own_runs(world: World, tmp_path: Path) -> None:
    from gates.records import newest_runs

    evaluate_gates(world.wh, [world.baseline], sweep="nightly", fingerprints=FP)
    with world.wh.read() as con:
        assert newest_runs(con, sweep="nightly") == [world.baseline]
        assert newest_runs(con, sweep="weekly") == []
    # a run whose log carries the sweep name in Inspect's eval metadata
    wh = Warehouse(tmp_path / "s.duckdb")
    marked = ingest(wh, run_eval(tmp_path / "l", ["0"], metadata={"sweep": "weekly"}))
    ingest(wh, run_eval(tmp_path / "l", ["0"], task_name="other"))
    with wh.read() as con:
        assert newest_runs(con, sweep="weekly") == [marked]
    [empty] = evaluate_gates(wh, None, sweep="monthly", fingerprints=FP)
    assert empty.exit_code == 2 and "sweep 'monthly' has no runs" in empty.problems[0]


def test_coverage_counts_the_samples_a_limited_run_set_out_to_generate(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "gradebook.duckdb")
    # A 20-item dataset run with limit = 5 whose every generation failed: Inspect writes no
    # results (so no total) into the log. The run is complete at 5 samples, not 25% covered;
    # what fails is the error rate.
    log = run_eval(
        tmp_path / "logs", _answers(set(), 20), task_name="lim", limit=5, errors=range(5)
    )
    rid = ingest(wh, log)
    score_run(wh, rid, exact, fingerprint="fp-v1")
    res = gate_run(wh, rid, GateRules(max_error_rate=0.1), FP, record=False)
    cov = rule(res, "min_coverage")
    assert cov.passed is True
    assert cov.value == pytest.approx(1.0)
    assert "5 present / 5 expected" in cov.detail
    assert rule(res, "max_error_rate").passed is False


@pytest.mark.parametrize(
    ("config", "planned"),
    [
        ({}, 20),
        ({"limit": 5}, 5),
        ({"limit": 50}, 20),
        ({"limit": [10, 15]}, 5),
        ({"limit": [15, 40]}, 5),
        ({"sample_id": ["a", "b", 3]}, 3),
        ({"sample_id": "a"}, 1),
        ({"sample_id": ["q*"]}, None),
    ],
)
def test_planned_samples_follows_inspects_limit_and_sample_id(config, planned) -> None:
    assert planned_samples(20, json.dumps({"config": config})) == planned
