"""Release-gate rules as pure functions: numbers in, verdict out.

`evaluate_rules` takes what the warehouse knows about one run (per scorer, under that scorer's
current fingerprint) and an optional paired comparison against a baseline, and returns one
`RuleResult` per rule with its value, threshold and pass/fail. The gate passes only when every
rule passes; it cannot be evaluated (exit 2) when the scores it needs are missing.

The rates deliberately use *all samples present* as the denominator, and min_accuracy uses
accuracy_strict (unscored and errored count as wrong) by default: an outage that leaves the
wrongly answered samples unscored must never read as a better score (design principle 6).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gates.stats import PairedComparison

__all__ = [
    "EXIT_CANNOT_EVALUATE",
    "EXIT_FAIL",
    "EXIT_PASS",
    "GateResult",
    "GateRules",
    "RuleResult",
    "ScorerStats",
    "Verdict",
    "evaluate_rules",
    "verdict_of",
]

EXIT_PASS, EXIT_FAIL, EXIT_CANNOT_EVALUATE = 0, 1, 2
Verdict = Literal["pass", "fail", "cannot_evaluate"]
EXIT_CODES: dict[str, int] = {
    "pass": EXIT_PASS,
    "fail": EXIT_FAIL,
    "cannot_evaluate": EXIT_CANNOT_EVALUATE,
}

Fraction = Annotated[float, Field(ge=0, le=1)]
_METRIC_RE = re.compile(r"^(accuracy|accuracy_strict|pass@([1-9][0-9]*))$")


class GateRules(BaseModel):
    """The thresholds a run must meet; the `[gates]` section of a sweep config.

    A rule set to None is not checked. Fractions are in [0, 1].

    Attributes:
        max_unscored_rate: unscored samples / samples present must be at most this. Samples
            with no score row under the current fingerprint count as unscored.
        max_error_rate: samples that errored at generation / samples present, at most this.
        min_coverage: samples present / (dataset size x epochs) must be at least this.
        min_accuracy: a threshold for every task, or a table `{task = threshold}` where the key
            "*" applies to tasks not named.
        metric: what min_accuracy and the regression test compare: "accuracy_strict"
            (correct / samples present, the default), "accuracy" (correct / scored) or
            "pass@K" for a task run with epochs >= K.
        max_regression: the largest drop against the baseline that is tolerated; the rule
            fails only when the drop is larger AND McNemar's exact test on the shared samples
            is significant at `alpha`, so noise does not fail a release.
        alpha: significance level of the paired test; the difference's confidence interval
            has coverage 1 - alpha.
        baseline: a run id to compare with; None means the newest earlier run of the same
            task and model whose gate passed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_unscored_rate: Fraction | None = 0.05
    max_error_rate: Fraction | None = 0.05
    min_coverage: Fraction | None = 1.0
    min_accuracy: Fraction | dict[str, Fraction] | None = None
    metric: str = "accuracy_strict"
    max_regression: Fraction | None = 0.0
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    baseline: str | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not _METRIC_RE.match(v):
            raise ValueError("must be 'accuracy_strict', 'accuracy' or 'pass@K' (K >= 1)")
        return v

    @property
    def pass_k(self) -> int | None:
        """K when the metric is pass@K, else None."""
        m = _METRIC_RE.match(self.metric)
        return int(m.group(2)) if m and m.group(2) else None

    def accuracy_threshold(self, task: str) -> float | None:
        """The min_accuracy that applies to `task`, if any."""
        if self.min_accuracy is None or isinstance(self.min_accuracy, float | int):
            return self.min_accuracy
        return self.min_accuracy.get(task, self.min_accuracy.get("*"))


class ScorerStats(BaseModel):
    """One run graded by one scorer under one fingerprint.

    Attributes:
        n_samples: samples (x epochs) present in the run's log.
        n_expected: dataset size x epochs from the log header, None if the header lacks it.
        n_scored / n_unscored / n_error: score rows by status under `fingerprint`; samples
            without a row are `n_missing`.
        n_correct: the sum of scored values (the count of right answers for 0/1 verifiers).
        pass_at_k: unbiased pass@k for k = 1..epochs (empty when epochs == 1).
    """

    scorer: str
    fingerprint: str
    n_samples: int
    n_expected: int | None = None
    n_scored: int
    n_unscored: int
    n_error: int
    n_correct: float
    epochs: int = 1
    pass_at_k: dict[int, float] = Field(default_factory=dict)

    @property
    def n_missing(self) -> int:
        return max(0, self.n_samples - self.n_scored - self.n_unscored - self.n_error)

    @property
    def accuracy(self) -> float | None:
        """Correct over scored: what an outage inflates, shown next to the strict one."""
        return self.n_correct / self.n_scored if self.n_scored else None

    @property
    def accuracy_strict(self) -> float | None:
        """Correct over samples present: unscored, errored and missing count as wrong."""
        return self.n_correct / self.n_samples if self.n_samples else None

    @property
    def unscored_rate(self) -> float | None:
        return (self.n_unscored + self.n_missing) / self.n_samples if self.n_samples else None

    @property
    def error_rate(self) -> float | None:
        return self.n_error / self.n_samples if self.n_samples else None

    @property
    def coverage(self) -> float | None:
        return self.n_samples / self.n_expected if self.n_expected else None

    def metric(self, name: str) -> float | None:
        if name == "accuracy":
            return self.accuracy
        if name == "accuracy_strict":
            return self.accuracy_strict
        k = int(name.removeprefix("pass@"))
        return self.pass_at_k.get(k)


class RuleResult(BaseModel):
    """One rule's outcome. `passed` is None when the rule could not be evaluated."""

    rule: str
    scorer: str | None = None
    value: float | None
    threshold: float | None
    op: Literal["<=", ">="]
    passed: bool | None
    detail: str = ""

    @property
    def label(self) -> str:
        return f"{self.rule}[{self.scorer}]" if self.scorer else self.rule


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _check(
    rule: str,
    scorer: str,
    value: float | None,
    threshold: float,
    op: Literal["<=", ">="],
    detail: str,
) -> RuleResult:
    if value is None:
        return RuleResult(
            rule=rule,
            scorer=scorer,
            value=None,
            threshold=threshold,
            op=op,
            passed=None,
            detail=detail or "no value to compare",
        )
    # A tiny tolerance so 2/3 against a threshold written as 0.6667 is decided by intent,
    # not by the last bit of a float.
    eps = 1e-9
    ok = value <= threshold + eps if op == "<=" else value >= threshold - eps
    return RuleResult(
        rule=rule, scorer=scorer, value=value, threshold=threshold, op=op, passed=ok, detail=detail
    )


def evaluate_rules(
    rules: GateRules,
    task: str,
    stats: ScorerStats,
    comparison: PairedComparison | None = None,
    *,
    baseline_run_id: str | None = None,
) -> list[RuleResult]:
    """Apply every configured rule to one scorer's view of a run.

    Args:
        rules: the thresholds.
        task: the run's task name (selects the min_accuracy threshold).
        stats: counts under the scorer's current fingerprint.
        comparison: candidate vs baseline on shared samples, or None when there is no baseline.
        baseline_run_id: named in the regression rule's detail.
    """
    s = stats
    out: list[RuleResult] = []
    counts = (
        f"{s.n_unscored + s.n_missing} unscored"
        + (f" ({s.n_missing} without a score row)" if s.n_missing else "")
        + f" / {s.n_samples} samples"
    )
    if rules.max_unscored_rate is not None:
        out.append(
            _check(
                "max_unscored_rate",
                s.scorer,
                s.unscored_rate,
                rules.max_unscored_rate,
                "<=",
                counts,
            )
        )
    if rules.max_error_rate is not None:
        out.append(
            _check(
                "max_error_rate",
                s.scorer,
                s.error_rate,
                rules.max_error_rate,
                "<=",
                f"{s.n_error} errored / {s.n_samples} samples",
            )
        )
    if rules.min_coverage is not None:
        detail = (
            f"{s.n_samples} present / {s.n_expected} expected (dataset, cut by limit, x epochs)"
            if s.n_expected
            else "the log header does not give the planned number of samples"
        )
        out.append(_check("min_coverage", s.scorer, s.coverage, rules.min_coverage, ">=", detail))
    threshold = rules.accuracy_threshold(task)
    if threshold is not None:
        value = s.metric(rules.metric)
        detail = (
            f"{rules.metric}; accuracy over scored {_fmt(s.accuracy)}, "
            f"strict {_fmt(s.accuracy_strict)} ({s.n_correct:g} correct, {s.n_scored} scored, "
            f"{s.n_samples} samples)"
        )
        if value is None and rules.pass_k:
            detail = f"{rules.metric} needs epochs >= {rules.pass_k}; this run has {s.epochs}"
        out.append(_check(f"min_accuracy:{task}", s.scorer, value, threshold, ">=", detail))
    if rules.max_regression is not None:
        out.append(_regression(rules, s.scorer, comparison, baseline_run_id))
    return out


def _regression(
    rules: GateRules, scorer: str, cmp: PairedComparison | None, baseline_run_id: str | None
) -> RuleResult:
    threshold = -float(rules.max_regression or 0.0) or 0.0  # never print -0
    if cmp is None:
        why = (
            f"no shared samples with baseline {baseline_run_id}"
            if baseline_run_id
            else "no baseline: no earlier passing run of this task and model"
        )
        # Nothing to regress against (a first run) is a pass, not a failure: said so plainly.
        return RuleResult(
            rule="max_regression",
            scorer=scorer,
            value=None,
            threshold=threshold,
            op=">=",
            passed=True,
            detail=why,
        )
    significant = cmp.p_value < rules.alpha
    too_large = cmp.difference < threshold - 1e-12
    passed = not (significant and too_large)
    pct = round(cmp.confidence * 100)
    detail = (
        f"vs {baseline_run_id}: {rules.metric} on {cmp.n_pairs} shared samples "
        f"{cmp.candidate_accuracy:.3f} vs {cmp.baseline_accuracy:.3f}, "
        f"difference {cmp.difference:+.3f} ({pct}% CI {cmp.ci_low:+.3f} to {cmp.ci_high:+.3f}), "
        f"McNemar exact p={cmp.p_value:.4g} ({cmp.candidate_only} gained, "
        f"{cmp.baseline_only} lost)" + ("" if passed else f"; significant at alpha={rules.alpha}")
    )
    return RuleResult(
        rule="max_regression",
        scorer=scorer,
        value=cmp.difference,
        threshold=threshold,
        op=">=",
        passed=passed,
        detail=detail,
    )


def verdict_of(results: list[RuleResult], problems: Collection[str] | None = None) -> Verdict:
    """fail if any rule failed; else cannot_evaluate if data is missing or a rule had no value.

    A failing rule is decisive even when another scorer could not be evaluated: the release is
    blocked either way, and "fail" names the reason that needs no re-scoring to confirm.
    """
    if any(r.passed is False for r in results):
        return "fail"
    if problems or any(r.passed is None for r in results):
        return "cannot_evaluate"
    return "pass"


class GateResult(BaseModel):
    """One gate evaluation of one run: what is stored in the `gates` table and reported.

    Attributes:
        verdict: "pass" only if every rule passed; "cannot_evaluate" when `problems` is set.
        results: one entry per rule and scorer.
        fingerprints: the verifier fingerprint used for each scorer (its current one).
        metrics: per scorer, the counts and both accuracies the rules were applied to.
        problems: why the gate could not be evaluated, each with the command that fixes it.
    """

    gate_id: str
    created: datetime
    run_id: str
    task: str | None = None
    model: str | None = None
    verdict: Verdict
    rules: GateRules
    results: list[RuleResult] = Field(default_factory=list)
    fingerprints: dict[str, str] = Field(default_factory=dict)
    baseline_run_id: str | None = None
    metrics: dict[str, dict[str, Any]] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)
    sweep: str | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def failing(self) -> list[RuleResult]:
        return [r for r in self.results if r.passed is False]
