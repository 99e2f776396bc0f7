"""The gate's statistics against published values and the estimator's definition."""

from __future__ import annotations

import math
import random

import pytest

from gates.stats import (
    mcnemar_exact,
    mean_pass_at_k,
    newcombe_paired_ci,
    paired_comparison,
    pass_at_k,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (0, 0, 1.0),  # no discordant pairs: no evidence at all
        (5, 5, 1.0),  # a balanced reshuffle is no evidence of change
        (0, 5, 0.0625),  # 2 * (1/2)^5
        (1, 9, 2 * 11 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        # Cavo et al. 2012 as analysed in Fagerland, Lydersen & Laake (2017), ch. 8:
        # exact conditional McNemar p = 0.0525
        (6, 16, 0.052478790283203125),
        (0, 30, 2 / 2**30),
    ],
)
def test_mcnemar_exact_table(b: int, c: int, expected: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)
    assert mcnemar_exact(c, b) == pytest.approx(expected, rel=1e-12)  # two-sided: symmetric


def test_mcnemar_exact_handles_large_counts_without_overflow() -> None:
    p = mcnemar_exact(4_900, 5_100)
    assert 0.0 < p < 1.0
    # Normal approximation with continuity correction agrees at this size.
    z = (abs(5_100 - 4_900) - 1) / math.sqrt(10_000)
    approx = math.erfc(z / math.sqrt(2))
    assert p == pytest.approx(approx, rel=0.02)


def test_mcnemar_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="discordant"):
        mcnemar_exact(-1, 3)


def test_newcombe_interval_matches_published_example() -> None:
    # Cavo et al. 2012 (both=59, first only=6, second only=16, neither=80): Fagerland et al.
    # report the Newcombe square-and-add interval -0.0621 (95% CI -0.1186 to -0.0046).
    low, high = newcombe_paired_ci(59, 6, 16, 80)
    assert (6 - 16) / 161 == pytest.approx(-0.0621, abs=5e-5)
    assert low == pytest.approx(-0.1186, abs=5e-5)
    assert high == pytest.approx(-0.0046, abs=5e-5)


@pytest.mark.parametrize(
    "cells",
    [(0, 0, 0, 10), (10, 0, 0, 0), (3, 0, 7, 0), (0, 5, 0, 5), (40, 2, 3, 5), (1, 1, 7, 12)],
)
def test_newcombe_interval_contains_estimate_and_stays_in_range(
    cells: tuple[int, int, int, int],
) -> None:
    both, first, second, neither = cells
    n = sum(cells)
    low, high = newcombe_paired_ci(*cells)
    diff = (first - second) / n
    assert -1.0 <= low <= diff <= high <= 1.0
    assert high - low > 0  # never a zero-width interval, even at 0 % or 100 %


def test_newcombe_interval_narrows_with_more_pairs() -> None:
    small = newcombe_paired_ci(20, 3, 7, 10)
    large = newcombe_paired_ci(200, 30, 70, 100)
    assert (large[1] - large[0]) < (small[1] - small[0])


def test_wilson_interval_known_value() -> None:
    # 81 successes in 263 trials (Wilson's own worked example in many texts): 0.2553 to 0.3662
    low, high = wilson_interval(81, 263)
    assert low == pytest.approx(0.2553, abs=5e-4)
    assert high == pytest.approx(0.3662, abs=5e-4)


def test_paired_comparison_counts_and_direction() -> None:
    pairs = [(True, True)] * 50 + [(False, True)] * 12 + [(True, False)] * 2 + [(False, False)] * 36
    cmp = paired_comparison(pairs, alpha=0.05)
    assert cmp is not None
    assert (cmp.both, cmp.candidate_only, cmp.baseline_only, cmp.neither) == (50, 2, 12, 36)
    assert cmp.candidate_accuracy == pytest.approx(0.52)
    assert cmp.baseline_accuracy == pytest.approx(0.62)
    assert cmp.difference == pytest.approx(-0.10)
    assert cmp.ci_low < cmp.difference < cmp.ci_high < 0  # a real drop: CI excludes 0
    assert cmp.p_value == pytest.approx(mcnemar_exact(2, 12))
    assert cmp.p_value < 0.05
    assert paired_comparison([]) is None


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (5, 2, 4), (10, 3, 5), (20, 1, 10), (7, 7, 7)],
)
def test_pass_at_k_equals_combinatorial_definition(n: int, c: int, k: int) -> None:
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_probability_a_random_k_subset_has_a_correct_attempt() -> None:
    # Check by brute force over a sample space rather than by the same formula.
    import itertools

    attempts = [True, False, False, True, False, False]
    k = 3
    subsets = list(itertools.combinations(attempts, k))
    frequency = sum(any(s) for s in subsets) / len(subsets)
    assert pass_at_k(len(attempts), sum(attempts), k) == pytest.approx(frequency)


def test_pass_at_1_is_mean_accuracy() -> None:
    rng = random.Random(7)
    problems = [(8, rng.randint(0, 8)) for _ in range(30)]
    mean = sum(c / n for n, c in problems) / len(problems)
    assert mean_pass_at_k(problems, 1) == pytest.approx(mean)


def test_pass_at_k_bad_input_names_the_bound() -> None:
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="correct count"):
        pass_at_k(3, 4, 1)
    assert mean_pass_at_k([(1, 1), (2, 0)], 3) is None
