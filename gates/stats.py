"""The statistics a release gate decides with: pure functions, no I/O, no scipy.

Choices (each documented in docs/concepts/gates.md):

- Regression test: McNemar's *exact* conditional test. Two runs graded on the same samples are
  paired; only the discordant pairs (right in one run, wrong in the other) carry information,
  and under "no difference" each discordant pair is a fair coin. The two-sided p-value is twice
  the smaller binomial tail, capped at 1. Exact, so it stays honest on the small discordant
  counts a 50-sample task produces, where the chi-square approximation does not.
- Confidence interval of the paired difference: Newcombe's hybrid score interval for paired
  proportions (method 10 of Newcombe 1998, with the continuity-corrected correlation term).
  Built from the two Wilson intervals, so it never leaves [-1, 1] and does not collapse to a
  zero-width interval at 0 % or 100 % the way the Wald interval does.
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), computed as a
  running product so it neither overflows nor loses precision for large n.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist

__all__ = [
    "PairedComparison",
    "mcnemar_exact",
    "newcombe_paired_ci",
    "paired_comparison",
    "pass_at_k",
    "mean_pass_at_k",
    "wilson_interval",
]


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts.

    Args:
        b: pairs right in the first run and wrong in the second.
        c: pairs wrong in the first run and right in the second.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    # Integer arithmetic up to the one division keeps the tail exact for any n.
    return min(1.0, 2 * tail / 2**n)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for one binomial proportion."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_paired_ci(
    both: int, first_only: int, second_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Confidence interval for p_first - p_second on paired binary outcomes.

    Args:
        both: pairs right in both runs.
        first_only: pairs right in the first run only.
        second_only: pairs right in the second run only.
        neither: pairs wrong in both runs.
        confidence: two-sided coverage, e.g. 0.95.
    """
    n = both + first_only + second_only + neither
    if n <= 0:
        raise ValueError("no paired samples: cannot form a confidence interval")
    first_right, second_right = both + first_only, both + second_only
    p1, p2 = first_right / n, second_right / n
    l1, u1 = wilson_interval(first_right, n, confidence)
    l2, u2 = wilson_interval(second_right, n, confidence)

    margins = (first_right, n - first_right, second_right, n - second_right)
    phi = 0.0
    if all(margins):
        cross = both * neither - first_only * second_only
        # Newcombe's continuity correction: a small positive association is treated as none,
        # which keeps the interval from being too narrow when the runs agree almost everywhere.
        if cross > n / 2:
            cross -= n / 2
        elif cross >= 0:
            cross = 0
        phi = cross / math.sqrt(math.prod(margins))

    diff = p1 - p2
    lower = diff - math.sqrt(
        max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    )
    upper = diff + math.sqrt(
        max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    )
    return max(-1.0, lower), min(1.0, upper)


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """A candidate run against a baseline on the samples both share.

    `difference` is candidate accuracy minus baseline accuracy on those samples, so a
    regression is negative; `ci_low`/`ci_high` bound it.
    """

    n_pairs: int
    both: int
    candidate_only: int
    baseline_only: int
    neither: int
    candidate_accuracy: float
    baseline_accuracy: float
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    confidence: float


def paired_comparison(
    pairs: Iterable[tuple[bool, bool]], *, alpha: float = 0.05
) -> PairedComparison | None:
    """Compare paired outcomes `(candidate_correct, baseline_correct)`; None when there are none.

    Args:
        pairs: one tuple per shared sample (and epoch).
        alpha: significance level; the interval has coverage 1 - alpha.
    """
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for cand, base in pairs:
        counts[(bool(cand), bool(base))] += 1
    n = sum(counts.values())
    if n == 0:
        return None
    both, cand_only = counts[(True, True)], counts[(True, False)]
    base_only, neither = counts[(False, True)], counts[(False, False)]
    confidence = 1 - alpha
    low, high = newcombe_paired_ci(both, cand_only, base_only, neither, confidence)
    return PairedComparison(
        n_pairs=n,
        both=both,
        candidate_only=cand_only,
        baseline_only=base_only,
        neither=neither,
        candidate_accuracy=(both + cand_only) / n,
        baseline_accuracy=(both + base_only) / n,
        difference=(cand_only - base_only) / n,
        ci_low=low,
        ci_high=high,
        p_value=mcnemar_exact(cand_only, base_only),
        confidence=confidence,
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: n attempts, c of them correct.

    Args:
        n: attempts (epochs) graded for the problem.
        c: correct attempts among them.
        k: the budget; must satisfy 1 <= k <= n.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count must be within 0..{n}, got {c}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k)/C(n, k) == 1 - prod_{i=n-c+1..n} (1 - k/i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(attempts: Iterable[tuple[int, int]], k: int) -> float | None:
    """Mean pass@k over problems given `(n, c)` per problem; None when no problem has n >= k."""
    values = [pass_at_k(n, c, k) for n, c in attempts if n >= k]
    return sum(values) / len(values) if values else None
