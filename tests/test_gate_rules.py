"""Each gate rule's pass side and fail side, decided from counts alone."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gates.rules import GateRules, RuleResult, ScorerStats, evaluate_rules, verdict_of
from gates.stats import paired_comparison

OFF = {
    "max_unscored_rate": None,
    "max_error_rate": None,
    "min_coverage": None,
    "max_regression": None,
}


def stats(**kw) -> ScorerStats:
    base = dict(
        scorer="math",
        fingerprint="f" * 16,
        n_samples=100,
        n_expected=100,
        n_scored=100,
        n_unscored=0,
        n_error=0,
        n_correct=80,
    )
    base.update(kw)
    return ScorerStats(**base)


def only(rules: dict, s: ScorerStats, task: str = "gsm8k", **kw) -> RuleResult:
    results = evaluate_rules(GateRules(**{**OFF, **rules}), task, s, **kw)
    assert len(results) == 1, results
    return results[0]


@pytest.mark.parametrize(
    ("rules", "s", "value", "passed"),
    [
        ({"max_unscored_rate": 0.05}, stats(n_scored=95, n_unscored=5), 0.05, True),
        ({"max_unscored_rate": 0.05}, stats(n_scored=94, n_unscored=6), 0.06, False),
        # samples that have no score row under the fingerprint are unscored, not ignored
        ({"max_unscored_rate": 0.05}, stats(n_scored=90), 0.10, False),
        ({"max_error_rate": 0.02}, stats(n_scored=98, n_error=2), 0.02, True),
        ({"max_error_rate": 0.02}, stats(n_scored=97, n_error=3), 0.03, False),
        ({"min_coverage": 1.0}, stats(), 1.0, True),
        ({"min_coverage": 1.0}, stats(n_expected=120), 100 / 120, False),
        ({"min_accuracy": 0.8}, stats(), 0.8, True),
        ({"min_accuracy": 0.81}, stats(), 0.8, False),
        # strict by default: 10 unscored wrong answers do not lift 80/100 to 80/90
        ({"min_accuracy": 0.85}, stats(n_scored=90, n_unscored=10), 0.8, False),
        (
            {"min_accuracy": 0.85, "metric": "accuracy"},
            stats(n_scored=90, n_unscored=10),
            80 / 90,
            True,
        ),
        ({"min_accuracy": {"gsm8k": 0.9, "*": 0.1}}, stats(), 0.8, False),
        ({"min_accuracy": {"other": 0.9, "*": 0.5}}, stats(), 0.8, True),
        (
            {"min_accuracy": 0.9, "metric": "pass@2"},
            stats(epochs=2, pass_at_k={1: 0.8, 2: 0.93}),
            0.93,
            True,
        ),
        (
            {"min_accuracy": 0.95, "metric": "pass@2"},
            stats(epochs=2, pass_at_k={1: 0.8, 2: 0.93}),
            0.93,
            False,
        ),
    ],
)
def test_rule_pass_and_fail_sides(rules: dict, s: ScorerStats, value: float, passed: bool) -> None:
    r = only(rules, s)
    assert r.value == pytest.approx(value)
    assert r.passed is passed
    assert r.threshold is not None


def test_min_accuracy_for_unnamed_task_without_default_is_not_checked() -> None:
    results = evaluate_rules(GateRules(**{**OFF, "min_accuracy": {"other": 0.9}}), "gsm8k", stats())
    assert results == []


def test_pass_at_k_metric_without_enough_epochs_cannot_be_evaluated() -> None:
    r = only({"min_accuracy": 0.5, "metric": "pass@4"}, stats(epochs=2, pass_at_k={1: 0.5, 2: 0.6}))
    assert r.passed is None
    assert "epochs >= 4" in r.detail
    assert verdict_of([r]) == "cannot_evaluate"


def test_outage_fails_on_unscored_rate_and_shows_both_accuracies() -> None:
    # 300 samples, 200 right; the judge fails on exactly the 100 wrong ones.
    outage = stats(n_samples=300, n_expected=300, n_scored=200, n_unscored=100, n_correct=200)
    assert outage.accuracy == pytest.approx(1.0)
    assert outage.accuracy_strict == pytest.approx(2 / 3)
    results = evaluate_rules(GateRules(min_accuracy=0.9), "gsm8k", outage)
    by_rule = {r.rule: r for r in results}
    assert by_rule["max_unscored_rate"].passed is False
    assert by_rule["min_accuracy:gsm8k"].passed is False  # strict accuracy 0.667 < 0.9
    assert "accuracy over scored 1.000" in by_rule["min_accuracy:gsm8k"].detail
    assert "strict 0.667" in by_rule["min_accuracy:gsm8k"].detail
    assert verdict_of(results) == "fail"


def _pairs(both: int, cand_only: int, base_only: int, neither: int) -> list[tuple[bool, bool]]:
    return (
        [(True, True)] * both
        + [(True, False)] * cand_only
        + [(False, True)] * base_only
        + [(False, False)] * neither
    )


def test_regression_flagged_when_drop_is_real() -> None:
    cmp = paired_comparison(_pairs(60, 1, 14, 25), alpha=0.05)
    r = only({"max_regression": 0.02}, stats(), comparison=cmp, baseline_run_id="base-1")
    assert r.passed is False
    assert r.value == pytest.approx(-0.13)
    assert r.threshold == pytest.approx(-0.02)
    assert "base-1" in r.detail and "McNemar" in r.detail and "CI" in r.detail


def test_same_accuracy_reshuffle_is_not_a_regression() -> None:
    # 15 samples flipped each way: same accuracy, many changes, no evidence of a drop.
    cmp = paired_comparison(_pairs(55, 15, 15, 15), alpha=0.05)
    r = only({"max_regression": 0.0}, stats(), comparison=cmp, baseline_run_id="base-1")
    assert r.value == pytest.approx(0.0)
    assert r.passed is True


def test_small_noisy_drop_does_not_cry_wolf() -> None:
    # 3 lost vs 1 gained: a 2-point drop that chance explains (p = 0.625).
    cmp = paired_comparison(_pairs(70, 1, 3, 26), alpha=0.05)
    r = only({"max_regression": 0.0}, stats(), comparison=cmp, baseline_run_id="b")
    assert r.value == pytest.approx(-0.02)
    assert r.passed is True


def test_significant_drop_within_tolerance_passes() -> None:
    cmp = paired_comparison(_pairs(300, 0, 12, 88), alpha=0.05)  # -3 points, p < 0.001
    assert only({"max_regression": 0.05}, stats(), comparison=cmp, baseline_run_id="b").passed
    assert not only({"max_regression": 0.01}, stats(), comparison=cmp, baseline_run_id="b").passed


def test_no_baseline_passes_and_says_so() -> None:
    r = only({"max_regression": 0.0}, stats())
    assert r.passed is True
    assert "no baseline" in r.detail


def test_verdict_is_pass_only_if_every_rule_passes() -> None:
    good = RuleResult(rule="a", value=0.0, threshold=0.1, op="<=", passed=True)
    bad = RuleResult(rule="b", value=0.2, threshold=0.1, op="<=", passed=False)
    unknown = RuleResult(rule="c", value=None, threshold=0.1, op="<=", passed=None)
    assert verdict_of([good, good]) == "pass"
    assert verdict_of([good, bad]) == "fail"
    assert verdict_of([good, bad, unknown]) == "fail"
    assert verdict_of([good, unknown]) == "cannot_evaluate"
    assert verdict_of([good], {"math": "no scores"}) == "cannot_evaluate"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_unscored_rate": 1.5}, "less than or equal to 1"),
        ({"metric": "f1"}, "pass@K"),
        ({"metric": "pass@0"}, "pass@K"),
        ({"alpha": 0}, "greater than 0"),
        ({"max_unscored": 0.1}, "Extra inputs"),
    ],
)
def test_bad_rules_are_rejected_with_the_reason(raw: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GateRules(**raw)


def test_rules_defaults_and_pass_k() -> None:
    rules = GateRules(metric="pass@3")
    assert rules.pass_k == 3
    assert GateRules().pass_k is None
    assert GateRules().max_unscored_rate == 0.05
    assert GateRules(min_accuracy=0.7).accuracy_threshold("anything") == 0.7
