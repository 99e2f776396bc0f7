"""OpenRLHF reward functions over gradebook verifiers (`scorers.rewards.reward_func`).

OpenRLHF's `--reward.remote_url` takes a `.py` file defining `reward_func(queries, prompts,
labels, **kw)`, or HTTP URLs serving the same call (`gradebook reward serve`). Either way it
gets `{"rewards", "scores", "extra_logs"}` back: "rewards" drive the advantage, "scores" (0..1)
the dynamic filtering, and every "extra_logs" entry is logged per sample (numbers only). A query
is the decoded prompt + response with special tokens kept; the response is what follows the
prompt in it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.grade import Grade
from scorers.rewards._core import (
    Item,
    RewardSpec,
    grade_all,
    plain,
    reward_value,
    target_of,
    tests_of,
)

__all__ = ["UNSCORED_REWARD", "OpenRLHFReward", "openrlhf_reward", "response_of", "reward_func"]

# The reward of a sample the verifier could not grade (timeout, sandbox down, bad reference).
# OpenRLHF takes a number for every sample, so it is this documented value, and the sample's
# `unscored` extra log is 1.0 (its mean is the unscored rate of the step).
UNSCORED_REWARD = 0.0
# Chat-template markers left in a query decoded with skip_special_tokens=False: <|im_end|>,
# <|eot_id|>, <|endoftext|>, </s>, <end_of_turn>... An "ANSWER: 42<|im_end|>" line must read 42.
_SPECIAL = re.compile(
    r"<\|[A-Za-z0-9_]{1,64}\|>|</?s>|<(?:eos|bos|pad|unk|end_of_turn|start_of_turn)>"
)


def response_of(query: str, prompt: Any) -> str:
    """The response in an OpenRLHF query: the text after the prompt, special tokens removed."""
    if isinstance(prompt, str) and prompt:
        at = query.find(prompt)
        if at >= 0:
            return _SPECIAL.sub("", query[at + len(prompt) :])
        # a tokenizer round trip may have changed the markers, not the words
        bare_query, bare_prompt = _SPECIAL.sub("", query), _SPECIAL.sub("", prompt)
        at = bare_query.find(bare_prompt) if bare_prompt else -1
        if at >= 0:
            return bare_query[at + len(bare_prompt) :]
        return bare_query
    return _SPECIAL.sub("", query)


class OpenRLHFReward:
    """An OpenRLHF `reward_func` grading with one gradebook verifier.

    Attributes:
        spec: the verifier and its parameters; `fingerprint` its digest.
        unscored_reward: the reward (and score) of an unscored sample.
    """

    def __init__(
        self, verifier: str, params: Mapping[str, Any], unscored_reward: float = UNSCORED_REWARD
    ) -> None:
        self.spec = RewardSpec.make(verifier, params, who=f"openrlhf_reward({verifier!r})")
        self.unscored_reward = float(unscored_reward)

    @property
    def verifier(self) -> str:
        return self.spec.verifier

    @property
    def fingerprint(self) -> str:
        return self.spec.fingerprint

    def __repr__(self) -> str:
        return f"openrlhf_reward({self.verifier!r}, unscored_reward={self.unscored_reward!r})"

    def __call__(
        self,
        queries: Sequence[str],
        prompts: Sequence[Any] | None = None,
        labels: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """{"rewards": [...], "scores": [...], "extra_logs": {"unscored": [...]}}, in order."""
        return self.respond(self.grades(queries, prompts, labels))

    def grades(
        self, queries: Sequence[str], prompts: Sequence[Any] | None, labels: Sequence[Any] | None
    ) -> list[Grade]:
        return grade_all(self.spec, self.items(queries, prompts, labels))

    def items(
        self, queries: Sequence[str], prompts: Sequence[Any] | None, labels: Sequence[Any] | None
    ) -> list[Item]:
        """What to grade for an OpenRLHF call: each query's response with its label.

        Raises:
            ValueError: the three lists differ in length.
        """
        n = len(queries)
        prompts = [None] * n if prompts is None else list(prompts)
        labels = [None] * n if labels is None else list(labels)
        if len(prompts) != n or len(labels) != n:
            raise ValueError(f"{n} queries, {len(prompts)} prompts, {len(labels)} labels")
        return [
            self._item(response_of(q, p), label)
            for q, p, label in zip(queries, prompts, labels, strict=True)
        ]

    def _item(self, response: str, label: Any) -> Item:
        if self.verifier == "unit_tests":
            return Item(response, "", tests_of(label))
        label = plain(label)
        if isinstance(label, str) and label.lstrip().startswith("{"):
            try:
                decoded = json.loads(label)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict) and "answer" in decoded:
                label = decoded
        if isinstance(label, dict) and "answer" in label:
            # {"answer": ..., "answer_patterns": [...]}: a reference with per-sample settings
            meta = {k: v for k, v in label.items() if k != "answer"}
            return Item(response, target_of(label["answer"]), meta)
        return Item(response, target_of(label), {})

    def respond(self, grades: Sequence[Grade]) -> dict[str, Any]:
        values = [reward_value(g) for g in grades]
        rewards = [self.unscored_reward if v is None else v for v in values]
        return {
            "rewards": rewards,
            "scores": list(rewards),
            "extra_logs": {"unscored": [0.0 if v is not None else 1.0 for v in values]},
        }


def openrlhf_reward(
    verifier: str = "math", *, unscored_reward: float = UNSCORED_REWARD, **params: Any
) -> OpenRLHFReward:
    """An OpenRLHF `reward_func` for a gradebook verifier (for a reward file:
    `reward_func = openrlhf_reward("unit_tests")`).

    Args:
        verifier: "math" (labels are reference answers, or {"answer": ..., <setting>: ...}) or
            "unit_tests" (labels are test source, a list of asserts, or a dict (or its JSON)
            with `test` + `entry_point` or `test_list`).
        unscored_reward: the reward of a sample the verifier could not grade.
        **params: verifier parameters (`answer_patterns`, `timeout_s` for math).
    """
    return OpenRLHFReward(verifier, params, unscored_reward)


# OpenRLHF's file-form reward function: the `math` verifier with its defaults (an instance, so
# it has `.fingerprint`; OpenRLHF calls it as reward_func(queries, prompts, labels)).
reward_func = OpenRLHFReward("math", {})
