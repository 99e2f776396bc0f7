"""verl reward functions over gradebook verifiers (`scorers.rewards.compute_score`).

verl loads `reward.custom_reward_function.path` / `.name` (`pkg://scorers.rewards`,
`compute_score`) and calls it once per sample as `compute_score(data_source=...,
solution_str=..., ground_truth=..., extra_info=...)` merged with the config's `reward_kwargs`,
from a loop, from thread executors (the reward loop) or from forked executor processes (the
"prime" manager); the "batch" manager calls `compute_score_batch(data_sources=...,
solution_strs=..., ground_truths=..., extra_infos=...)` once per batch. A dict result is
logged: "score" is the reward, every other key a per-sample extra (numbers are averaged in the
validation metrics, strings are kept in the dumped generations).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.grade import Grade
from scorers.rewards._core import (
    Item,
    RewardSpec,
    grade_all,
    grade_now,
    plain,
    reward_value,
    target_of,
    tests_of,
)

__all__ = ["UNSCORED_SCORE", "compute_score", "compute_score_batch"]

# The reward of a sample the verifier could not grade (timeout, sandbox down, bad reference).
# verl has no "no reward": a NaN would spread through its group's advantage. So the score is
# this documented value, and the sample carries `unscored = 1.0` in its logged extras.
UNSCORED_SCORE = 0.0
# verl passes these to a custom reward function itself; they are not gradebook parameters.
_VERL_KWARGS = frozenset(
    {"reward_router_address", "reward_model_tokenizer", "sandbox_fusion_url",
     "concurrent_semaphore", "memory_limit_mb"}
)  # fmt: skip
_SPECS: dict[tuple[str, str], RewardSpec] = {}


def _spec(verifier: str, params: dict[str, Any]) -> RewardSpec:
    key = (verifier, json.dumps(params, sort_keys=True, default=str))
    spec = _SPECS.get(key)
    if spec is None:
        spec = _SPECS[key] = RewardSpec.make(verifier, params, who="compute_score")
    return spec


def _settings(kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], float, bool]:
    params = {k: v for k, v in kwargs.items() if k not in _VERL_KWARGS}
    verifier = str(params.pop("verifier", "math"))
    unscored_score = float(params.pop("unscored_score", UNSCORED_SCORE))
    as_float = bool(params.pop("as_float", False))
    return verifier, params, unscored_score, as_float


def _item(verifier: str, solution_str: str, ground_truth: Any, extra_info: Any) -> tuple[str, Item]:
    """The verifier for this sample (`extra_info["verifier"]` overrides the run's) and its item."""
    meta = plain(extra_info) if isinstance(extra_info, Mapping) else {}
    verifier = str(meta.get("verifier") or verifier)
    if verifier == "unit_tests":
        return verifier, Item(solution_str or "", "", {**meta, **tests_of(ground_truth)})
    return verifier, Item(solution_str or "", target_of(ground_truth), meta)


def _result(grade: Grade, spec: RewardSpec, unscored_score: float) -> dict[str, Any]:
    value = reward_value(grade)
    return {
        "score": unscored_score if value is None else value,
        "acc": 1.0 if grade.correct else 0.0,
        "unscored": 0.0 if value is not None else 1.0,
        "reason": grade.reason,
        "verifier_fingerprint": spec.fingerprint,
    }


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any] | float:
    """verl's custom reward function: the verifier's verdict on one response.

    Args:
        data_source: the sample's dataset name (logged by verl; not used for grading).
        solution_str: the decoded response.
        ground_truth: math: the reference answer (or a list of them); unit_tests: the test
            source, a list of asserts, or a dict (or its JSON) with `test` + `entry_point` or
            `test_list` (+ `test_imports`).
        extra_info: per-sample settings: `answer_patterns`, `timeout_s`, `verifier`, and for
            code `entry_point`, `prompt`, `test_imports`.
        **kwargs: the config's `reward_kwargs`: `verifier` ("math"), verifier parameters
            (`answer_patterns`, `timeout_s`), `unscored_score` (UNSCORED_SCORE), `as_float`
            (return the bare score, for reward managers that take no dict).

    Returns:
        {"score", "acc", "unscored", "reason", "verifier_fingerprint"}: "unscored" is 1.0 when
        the verifier could not grade (then "score" is `unscored_score`, "acc" 0.0).
    """
    run_verifier, params, unscored_score, as_float = _settings(kwargs)
    verifier, item = _item(run_verifier, solution_str, ground_truth, extra_info)
    spec = _spec(verifier, params if verifier == run_verifier else {})
    result = _result(grade_now(spec, item), spec, unscored_score)
    return float(result["score"]) if as_float else result


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]] | list[float]:
    """`compute_score` over a whole batch (verl's "batch" reward manager), graded concurrently;
    one result per response, in order."""
    n = len(solution_strs)
    if len(ground_truths) != n:
        raise ValueError(
            f"compute_score_batch: {len(ground_truths)} ground truths for {n} responses"
        )
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    if len(infos) != n:
        raise ValueError(f"compute_score_batch: {len(infos)} extra_infos for {n} responses")
    verifier, params, unscored_score, as_float = _settings(kwargs)
    picked = [
        _item(verifier, s, t, e)
        for s, t, e in zip(solution_strs, ground_truths, infos, strict=True)
    ]
    results: list[dict[str, Any] | None] = [None] * n
    for name in dict.fromkeys(v for v, _ in picked):
        # the run's parameters are the run's verifier's; a sample that names another uses its
        # defaults
        spec = _spec(name, params if name == verifier else {})
        where = [i for i, (v, _) in enumerate(picked) if v == name]
        for i, grade in zip(where, grade_all(spec, [picked[i][1] for i in where]), strict=True):
            results[i] = _result(grade, spec, unscored_score)
    done = [r for r in results if r is not None]
    return [float(r["score"]) for r in done] if as_float else done
