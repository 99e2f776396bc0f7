"""Rewards for RL training, built on the very functions that grade evaluations.

Every reward here calls a registered verifier's own grade function (`grade_math`,
`grade_unit_tests`), the one behind the Inspect scorers and the scoring stage, so a reward and
a measured score can never disagree (principle 2). One module per trainer convention:

- TRL: `trl_reward(verifier="math", column="answer", **params)` -> a reward function (sync,
  or `asynchronous=True`), picklable, named "gradebook_<verifier>"; None = unscored.
- verl: `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`
  and `compute_score_batch(...)` -> {"score", "acc", "unscored", "reason",
  "verifier_fingerprint"}.
- OpenRLHF: `reward_func(queries, prompts, labels)` (math) and `openrlhf_reward(verifier)`
  -> {"rewards", "scores", "extra_logs": {"unscored"}}; over HTTP: `gradebook reward serve`.

Every adapter exposes `verifier_fingerprint(verifier, **params)` (also `.fingerprint` on the
reward objects), the digest the warehouse keys scores by.

Imports here are absolute on purpose: OpenRLHF may load this very file by path.
"""

from __future__ import annotations

from typing import Any

from scorers.grade import SampleView
from scorers.math import DEFAULT_PATTERNS, DEFAULT_TIMEOUT_S, grade_math
from scorers.rewards._core import RewardSpec
from scorers.rewards.openrlhf import UNSCORED_REWARD, OpenRLHFReward, openrlhf_reward, reward_func
from scorers.rewards.trl import AsyncTRLReward, TRLReward, trl_reward
from scorers.rewards.verl import UNSCORED_SCORE, compute_score, compute_score_batch

__all__ = [
    "UNSCORED_REWARD",
    "UNSCORED_SCORE",
    "AsyncTRLReward",
    "OpenRLHFReward",
    "TRLReward",
    "compute_score",
    "compute_score_batch",
    "math_reward",
    "openrlhf_reward",
    "reward_func",
    "trl_reward",
    "verifier_fingerprint",
    "warm_up",
]


def verifier_fingerprint(verifier: str = "math", **params: Any) -> str:
    """The fingerprint a reward with this verifier and these parameters grades with: the
    `fingerprint` column of the warehouse's `verifiers` view for the same verifier."""
    return RewardSpec.make(verifier, params, who="verifier_fingerprint").fingerprint


def warm_up(verifier: str = "math", **params: Any) -> None:
    """Do now what the first reward call of a process would otherwise wait for, outside any
    time limit: start the verifier's helper workers (math: the sympy worker pool, seconds) and
    compute its fingerprint. A trainer calls it once per worker process (a forked child
    inherits both)."""
    from scorers.workers.bounded import shared_pool

    spec = RewardSpec.make(verifier, params, who="warm_up")
    for preload in spec.grader.helpers:
        shared_pool(preload).warm()
    _ = spec.fingerprint


def math_reward(
    completion: str,
    reference: str,
    *,
    answer_patterns: tuple[str, ...] = DEFAULT_PATTERNS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """1.0 exactly when the math scorer grades `completion` CORRECT against `reference`, else 0.0.

    Unscored outcomes (timeout, invalid reference) give 0.0 here; the trainer adapters above
    keep them apart (None, or a flag).

    Args:
        completion: the model's full completion (the answer is extracted from it).
        reference: the reference answer.
        answer_patterns: extraction strategies, as for `math_verifier()`.
        timeout_s: hard verification limit, as for `math_verifier()`.
    """
    view = SampleView(
        completion=completion,
        target=reference,
        metadata={"answer_patterns": list(answer_patterns), "timeout_s": timeout_s},
    )
    return 1.0 if grade_math(view).correct else 0.0
