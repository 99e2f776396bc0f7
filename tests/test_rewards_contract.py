"""Each reward adapter called exactly the way its trainer's own code calls it (issue 15).

The call sites are copied from the trainers' sources (without torch), with their file and
commit: huggingface/trl @ f2cd577, volcengine/verl @ b178a3c, OpenRLHF/OpenRLHF @ 3c3be62.
What a reward returns is checked against the scorer's own verdict on the same text.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import json
import math
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scorers.rewards
from scorers.grade import SampleView
from scorers.identity.fingerprint import fingerprint
from scorers.math import grade_math
from scorers.registry import get_verifier
from scorers.rewards import (
    compute_score,
    compute_score_batch,
    openrlhf_reward,
    trl_reward,
    verifier_fingerprint,
)

REPO = Path(__file__).resolve().parents[1]

# (completion text, reference): right, reformatted, wrong, hedged, no answer, bad reference
MATH_CASES = [
    ("We get \\boxed{\\frac{1}{2}}.", "\\frac12"),
    ("So the value is 0.5.\nANSWER: 0.5", "\\frac{1}{2}"),
    ("Thus \\boxed{3}", "4"),
    ("It is \\boxed{2} or \\boxed{3}", "2"),
    ("I am not sure.", "7"),
    ("ANSWER: 1", "\\frac{"),
]


def scorer_value(text: str, reference: Any, **meta: Any) -> float | None:
    """What the math scorer records for this text: its score, or None when unscored."""
    grade = grade_math(SampleView(completion=text, target=reference, metadata=meta))
    return grade.value if grade.status == "scored" else None


# -- TRL ----------------------------------------------------------------------------------------


def get_callable_name(func: Any) -> str:
    # trl/trainer/utils.py get_callable_name: the name rewards are logged under
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


class TRLTrainer:
    """GRPOTrainer._calculate_rewards (trl/trainer/grpo_trainer.py), minus torch: sync reward
    functions are called in the trainer's thread, async ones gathered on its loop thread."""

    def __init__(self, reward_funcs: list[Any]) -> None:
        self.reward_funcs = reward_funcs
        self.reward_func_names = [get_callable_name(f) for f in reward_funcs]
        self.extra_logs: dict[str, list] = {}
        self.metrics: dict[str, list] = {}
        self.async_loop = asyncio.new_event_loop()
        threading.Thread(target=self.async_loop.run_forever, daemon=True).start()

    def _log_completion_extra(self, column: str, values: list) -> None:
        self.extra_logs.setdefault(column, []).extend(values)

    def _log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(value)

    def calculate_rewards(self, inputs, prompts, completions, completion_ids_list) -> list[list]:
        rewards_per_func: list[list[float]] = [[] for _ in self.reward_funcs]
        keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
        reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
        reward_kwargs["trainer_state"] = object()  # a transformers TrainerState
        reward_kwargs["log_extra"] = self._log_completion_extra
        reward_kwargs["log_metric"] = self._log_metric
        async_funcs_info = []
        for i, reward_func in enumerate(self.reward_funcs):
            if inspect.iscoroutinefunction(reward_func):
                async_funcs_info.append((i, reward_func))
            else:
                output = reward_func(
                    prompts=prompts, completions=completions, completion_ids=completion_ids_list,
                    **reward_kwargs,
                )  # fmt: skip
                rewards_per_func[i] = [r if r is not None else math.nan for r in output]
        if async_funcs_info:

            async def _invoke_async(index, func):
                output = await func(
                    prompts=prompts, completions=completions, completion_ids=completion_ids_list,
                    **reward_kwargs,
                )  # fmt: skip
                return index, [r if r is not None else math.nan for r in output]

            async def _run_async_funcs():
                return await asyncio.gather(*[_invoke_async(i, f) for i, f in async_funcs_info])

            for idx, output in asyncio.run_coroutine_threadsafe(
                _run_async_funcs(), self.async_loop
            ).result():
                rewards_per_func[idx] = output
        return rewards_per_func


def _same(got: list[float], want: list[float | None]) -> bool:
    return all(
        (w is None and math.isnan(g)) or (w is not None and g == w)
        for g, w in zip(got, want, strict=True)
    )


def _math_batch(conversational: bool) -> tuple[list, list, list, list]:
    num_generations = 2  # the trainer repeats each dataset row once per generation
    rows = [
        {"prompt": f"Problem {i}", "answer": ref, "level": i, "id": f"p{i}"}
        for i, (_, ref) in enumerate(MATH_CASES)
        for _ in range(num_generations)
    ]
    texts = [text for text, _ in MATH_CASES for _ in range(num_generations)]
    if conversational:
        for row in rows:
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
        completions = [[{"role": "assistant", "content": t}] for t in texts]
    else:
        completions = list(texts)
    prompts = [row["prompt"] for row in rows]
    ids = [list(range(len(t))) for t in texts]
    return rows, prompts, completions, ids


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_trl_sync_and_async_rewards_match_the_scorer(conversational: bool) -> None:
    rows, prompts, completions, ids = _math_batch(conversational)
    funcs = [trl_reward("math"), trl_reward("math", asynchronous=True)]
    trainer = TRLTrainer(funcs)
    assert trainer.reward_func_names == ["gradebook_math", "gradebook_math"]
    assert [inspect.iscoroutinefunction(f) for f in funcs] == [False, True]
    got = trainer.calculate_rewards(rows, prompts, completions, ids)
    want = [scorer_value(text, ref) for (text, ref) in MATH_CASES for _ in range(2)]
    assert want.count(None) == 2 and 1.0 in want and 0.0 in want  # the table covers all three
    assert _same(got[0], want) and _same(got[1], want)
    # a reason per completion in the completions table, the unscored share as a metric
    assert trainer.extra_logs["gradebook_math_reason"][:2] == ["verified_equal"] * 2
    assert trainer.metrics["gradebook_math/unscored_frac"] == [2 / 12, 2 / 12]


def test_trl_chat_completions_with_tool_calls_and_content_parts() -> None:
    completions = [
        [
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc"}}]},
            {"role": "tool", "name": "calc", "content": "ANSWER: 5"},  # a tool's text is not
            {"role": "assistant", "content": "So:\nANSWER: 4"},  # the model's final word is
        ],
        [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{4}"}]}],
        [{"role": "assistant", "content": None, "tool_calls": []}],  # cut off after a call
    ]
    reward = trl_reward("math")
    assert reward(prompts=[[{"role": "user", "content": "2+2?"}]] * 3, completions=completions,
                  answer=["4"] * 3) == [1.0, 1.0, 0.0]  # fmt: skip


def test_trl_reward_says_what_is_wrong_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"no dataset column 'answer'.*columns: solution"):
        trl_reward("math")(prompts=["p"], completions=["x"], solution=["1"])
    with pytest.raises(ValueError, match=r"takes no parameter 'answer_pattern'"):
        trl_reward("math", answer_pattern=["boxed"])
    with pytest.raises(ValueError, match=r"unknown verifier 'maths'"):
        trl_reward("maths")
    with pytest.raises(ValueError, match=r"answer_patterns"):
        trl_reward("math", answer_patterns=["(unclosed"])
    # the column named by `column`, and per-sample parameters from a column of the same name
    reward = trl_reward("math", column="solution")
    assert reward(completions=["A: 3", "A: 3"], solution=["3", "3"],
                  answer_patterns=[["answer_line"], [r"^A:\s*(\S+)$"]]) == [0.0, 1.0]  # fmt: skip


def _async_worker_child(pickled: bytes, out: mp.Queue) -> None:
    # trl/experimental/async_grpo/async_rollout_worker.py: the spawned child unpickles the
    # reward functions and _score_group awaits async ones and runs sync ones in a thread.
    reward_funcs = pickle.loads(pickled)
    row = {"prompt": [{"role": "user", "content": "half?"}], "answer": "1/2", "source": "s"}
    num_generations = 3
    reward_kwargs = {
        key: [row[key]] * num_generations
        for key in row
        if key not in {"prompt", "completion", "completion_ids"}
    }
    completions = [[{"role": "assistant", "content": t}] for t in ("ANSWER: 0.5", "ANSWER: 2", "")]
    kwargs = dict(completions=completions, prompts=[row["prompt"]] * num_generations,
                  completion_ids=[[1], [2], [3]], **reward_kwargs)  # fmt: skip

    async def score_group() -> list:
        return await asyncio.gather(
            *[
                reward_func(**kwargs)
                if inspect.iscoroutinefunction(reward_func)
                else asyncio.to_thread(reward_func, **kwargs)
                for reward_func in reward_funcs
            ]
        )

    out.put((asyncio.run(score_group()), [f.fingerprint for f in reward_funcs]))


@pytest.mark.slow
def test_trl_rewards_pickle_into_async_grpos_spawned_process() -> None:
    funcs = [trl_reward("math"), trl_reward("math", asynchronous=True)]
    pickled = pickle.dumps(funcs)  # AsyncRolloutWorker.start() checks exactly this
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_async_worker_child, args=(pickled, out))
    child.start()
    rewards, prints = out.get(timeout=180)
    child.join(timeout=30)
    assert rewards == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert prints == [funcs[0].fingerprint] * 2


@pytest.mark.docker
def test_trl_code_reward_reads_humaneval_and_mbpp_columns(docker_sandbox) -> None:
    prompt = 'def add(a, b):\n    """Add two numbers."""\n'
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    reward = trl_reward("unit_tests")
    assert reward.__name__ == "gradebook_unit_tests"
    # HumanEval: a string prompt holding the signature, a completion with only the body
    humaneval = reward(
        prompts=[prompt, prompt],
        completions=["```python\n    return a + b\n```", "```python\n    return a - b\n```"],
        test=[test, test], entry_point=["add", "add"], task_id=["h/0", "h/0"],
    )  # fmt: skip
    assert humaneval == [1.0, 0.0]
    # MBPP, conversational: test_list + test_imports columns
    mbpp = reward(
        prompts=[[{"role": "user", "content": "Write sq."}]] * 2,
        completions=[[{"role": "assistant", "content": f"```python\n{c}\n```"}] for c in
                     ("import math\ndef sq(x):\n    return math.pow(x, 2)",
                      "def sq(x):\n    return x")],
        test_list=[["assert sq(3) == 9"]] * 2, test_imports=[["import math"]] * 2,
    )  # fmt: skip
    assert mbpp == [1.0, 0.0]


def test_code_rewards_are_unscored_not_zero_without_the_sandbox(tmp_path: Path) -> None:
    # No sandbox image (a real condition: nothing built under that tag): no reward at all for
    # TRL, the documented score plus the flag for verl and OpenRLHF. Code never runs on the host.
    script = """
import json
from scorers.rewards import compute_score, openrlhf_reward, trl_reward
code = "```python\\ndef add(a, b):\\n    return a + b\\n```"
trl = trl_reward("unit_tests")(completions=[code], test=["assert add(1, 2) == 3"])
verl = compute_score("humaneval", code, "assert add(1, 2) == 3", {}, verifier="unit_tests")
orl = openrlhf_reward("unit_tests")([code], [""], ["assert add(1, 2) == 3"])
print(json.dumps([trl, verl, orl]))
"""
    env = {"GRADEBOOK_SANDBOX_IMAGE": "gradebook-sandbox:no-such-tag", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO), "GRADEBOOK_CACHE_DIR": str(tmp_path)}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=180, cwd=REPO, check=True)  # fmt: skip
    trl, verl, orl = json.loads(out.stdout.strip().splitlines()[-1])
    assert trl == [None]
    assert (verl["score"], verl["unscored"], verl["reason"]) == (0.0, 1.0, "sandbox_unavailable")
    assert (orl["rewards"], orl["extra_logs"]["unscored"]) == ([0.0], [1.0])


# -- verl ---------------------------------------------------------------------------------------


def verl_custom_reward_fn(config: dict) -> Any:
    """verl/trainer/ppo/reward.py get_custom_reward_fn + utils/import_utils.py load_module for
    a `pkg://` path: the function, with the config's reward_kwargs merged into every call."""
    cfg = config["custom_reward_function"]
    module = importlib.import_module(cfg["path"][len("pkg://") :].replace("/", "."))
    raw_fn = getattr(module, cfg["name"])
    reward_kwargs = dict(cfg.get("reward_kwargs", {}))

    def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    return functools.partial(_call_with_kwargs, raw_fn, reward_kwargs)


def _verl_items() -> list[dict]:
    items = []
    for i, (text, ref) in enumerate(MATH_CASES):
        items.append({
            "data_source": "lighteval/MATH", "response_str": text, "ground_truth": ref,
            "extra_info": {"split": "train", "index": i, "question": f"Problem {i}"},
        })  # fmt: skip
    # a GSM8K row that extracts "A: n" lines, set per sample (parquet hands lists over as arrays)
    items.append({
        "data_source": "openai/gsm8k", "response_str": "2 + 2 = 4\nA: 4", "ground_truth": "4",
        "extra_info": {"answer_patterns": np.array([r"^A:\s*(\S+)$"]), "index": 9},
    })  # fmt: skip
    return items


def _want(item: dict) -> float | None:
    patterns = item["extra_info"].get("answer_patterns")
    meta = {"answer_patterns": list(patterns)} if patterns is not None else {}
    return scorer_value(item["response_str"], item["ground_truth"], **meta)


def test_verl_naive_reward_manager_loop() -> None:
    # verl/workers/reward_manager/naive.py NaiveRewardManager.__call__, then ray_trainer turning
    # the extras into arrays
    config = {"custom_reward_function": {"path": "pkg://scorers.rewards", "name": "compute_score",
                                         "reward_kwargs": {"timeout_s": 5}}}  # fmt: skip
    compute = verl_custom_reward_fn(config)
    rewards, reward_extra_info = [], {}
    for item in _verl_items():
        extra_info = dict(item["extra_info"])
        extra_info["num_turns"] = None
        extra_info["rollout_reward_scores"] = {}
        score = compute(data_source=item["data_source"], solution_str=item["response_str"],
                        ground_truth=item["ground_truth"], extra_info=extra_info)  # fmt: skip
        if isinstance(score, dict):
            reward = score["score"]
            for key, value in score.items():
                reward_extra_info.setdefault(key, []).append(value)
        else:
            reward = score
        rewards.append(reward)
    want = [_want(item) for item in _verl_items()]
    assert rewards == [0.0 if w is None else w for w in want]
    assert reward_extra_info["unscored"] == [1.0 if w is None else 0.0 for w in want]
    assert reward_extra_info["acc"] == [1.0 if w == 1.0 else 0.0 for w in want]
    arrays = {k: np.array(v) for k, v in reward_extra_info.items()}  # non_tensor_batch.update
    assert {len(a) for a in arrays.values()} == {len(want)}
    assert set(reward_extra_info["verifier_fingerprint"]) == {
        verifier_fingerprint("math", timeout_s=5.0)
    }
    assert reward_extra_info["reason"][-2:] == ["invalid_target", "verified_equal"]


def test_verl_reward_loop_runs_compute_score_in_executor_threads() -> None:
    # verl/experimental/reward_loop/reward_manager/naive.py run_single: one sample per task,
    # compute_score in the loop's default executor, many samples at once
    items = _verl_items()

    async def run_single(item: dict) -> dict:
        loop = asyncio.get_running_loop()
        extra_info = dict(item["extra_info"])
        result = await loop.run_in_executor(None, lambda: compute_score(
            data_source=item["data_source"], solution_str=item["response_str"],
            ground_truth=item["ground_truth"], extra_info=extra_info,
        ))  # fmt: skip
        reward_extra_info = dict(result) if isinstance(result, dict) else {"acc": result}
        return {"reward_score": result["score"], "reward_extra_info": reward_extra_info}

    async def run_all() -> list[dict]:
        return await asyncio.gather(*[run_single(item) for item in items * 4])

    got = [r["reward_score"] for r in asyncio.run(run_all())]
    assert got == [0.0 if w is None else w for w in [_want(i) for i in items]] * 4


def test_verl_batch_reward_manager_calls_compute_score_batch() -> None:
    # verl/workers/reward_manager/batch.py BatchRewardManager.verify
    items = _verl_items()
    scores = compute_score_batch(
        data_sources=np.array([i["data_source"] for i in items], dtype=object),
        solution_strs=[i["response_str"] for i in items],
        ground_truths=[i["ground_truth"] for i in items],
        extra_infos=[{**i["extra_info"], "rollout_reward_scores": {}} for i in items],
    )
    assert [s["score"] for s in scores] == [0.0 if w is None else w for w in map(_want, items)]
    assert compute_score_batch(["x"], ["ANSWER: 1"], ["1"], None, as_float=True) == [1.0]


def _prime_evaluation(task, completion, reference, task_extra_info) -> Any:
    func = functools.partial(compute_score, as_float=True)  # the partial get_custom_reward_fn makes
    return func(task, completion, reference, task_extra_info)


def test_verl_prime_manager_calls_positionally_in_worker_processes() -> None:
    # verl/workers/reward_manager/prime.py: run_in_executor(ProcessPoolExecutor, partial(
    # evaluation_func, task, completion, reference, task_extra_info)); it takes a float
    items = _verl_items()

    async def run() -> list:
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("fork")) as executor:
            futures = [
                loop.run_in_executor(executor, functools.partial(_prime_evaluation,
                    i["data_source"], i["response_str"], i["ground_truth"], i["extra_info"]))
                for i in items
            ]  # fmt: skip
            return await asyncio.gather(*futures)

    results = asyncio.run(run())
    assert all(isinstance(r, float) for r in results)
    assert results == [0.0 if w is None else w for w in map(_want, items)]


def test_verl_settings_errors_are_one_line() -> None:
    with pytest.raises(
        ValueError, match=r"compute_score: verifier 'math' takes no parameter 'timeout'"
    ):
        compute_score("x", "ANSWER: 1", "1", None, timeout=3)
    # verl's own extras for a custom function are not mistaken for gradebook parameters
    result = compute_score("x", "ANSWER: 1", "1", None, reward_router_address=None)
    assert result["score"] == 1.0


@pytest.mark.docker
def test_verl_code_rewards_from_ground_truth_and_extra_info(docker_sandbox) -> None:
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    spec = json.dumps({"test": "def check(f):\n    assert f(1, 2) == 3\n", "entry_point": "add"})
    humaneval = compute_score("humaneval", code, spec, {"index": 0}, verifier="unit_tests")
    mbpp = compute_score("mbpp", code, ["assert add(2, 2) == 5"], {"verifier": "unit_tests"})
    assert (humaneval["score"], humaneval["reason"]) == (1.0, "tests_passed")
    assert (mbpp["score"], mbpp["unscored"], mbpp["reason"]) == (0.0, 0.0, "tests_failed")


# -- OpenRLHF -----------------------------------------------------------------------------------


def openrlhf_load_reward_func(path: str) -> Any:
    # openrlhf/utils/agent.py SingleTurnAgentExecutor.__init__: a `.py` remote_url
    spec = importlib.util.spec_from_file_location("reward_func", path)
    reward_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward_module)
    return reward_module.reward_func


async def openrlhf_fetch_rewards_via_func(func, queries_list, prompts_list, labels_list) -> list:
    # SingleTurnAgentExecutor._fetch_rewards_via_func: chunks of one, each in a thread
    batch_size = 1
    num_chunks = (len(queries_list) + batch_size - 1) // batch_size
    tasks = []
    for i in range(num_chunks):
        start_idx, end_idx = i * batch_size, min((i + 1) * batch_size, len(queries_list))
        tasks.append(asyncio.to_thread(func, queries_list[start_idx:end_idx],
                                       prompts_list[start_idx:end_idx],
                                       labels_list[start_idx:end_idx]))  # fmt: skip
    return await asyncio.gather(*tasks)


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def test_openrlhf_file_form_loaded_by_path() -> None:
    # the file the RL how-to (docs/how-to/rl-rewards.md) points OpenRLHF at
    func = openrlhf_load_reward_func(scorers.rewards.__file__)
    assert func.fingerprint == scorers.rewards.reward_func.fingerprint
    # the prompt's own worked example must not be taken for the model's answer
    prompt = chat("Example: 1+1?\nANSWER: 2\nNow: what is half of 1?")
    samples = [(text, ref) for text, ref in MATH_CASES] + [("I give up.", "2")]
    queries = [prompt + text + "<|im_end|>" for text, _ in samples]
    labels = [ref for _, ref in samples]

    async def execute_all() -> list:
        # SingleTurnAgentExecutor.execute: one sample at a time, many at once
        return await asyncio.gather(*[
            openrlhf_fetch_rewards_via_func(func, [q], [prompt], [label])
            for q, label in zip(queries, labels, strict=True)
        ])  # fmt: skip

    outputs = asyncio.run(execute_all())
    got, flags = [], []
    for rewards_info_list in outputs:
        rewards_info = rewards_info_list[0]
        score_value = rewards_info.get("scores")
        if score_value is None:
            score_value = rewards_info.get("rewards")
        # _process_response_into_experience: torch.tensor([value]) of every extra log
        assert all(isinstance(v, list) and all(isinstance(x, float) for x in v)
                   for v in rewards_info["extra_logs"].values())  # fmt: skip
        got.append(rewards_info.get("rewards")[0])
        flags.append(rewards_info["extra_logs"]["unscored"][0])
    want = [scorer_value(text, ref) for text, ref in samples]
    assert got == [0.0 if w is None else w for w in want]
    assert flags == [1.0 if w is None else 0.0 for w in want]
    assert got[-1] == 0.0 and flags[-1] == 0.0  # no answer of its own: wrong, not "2"


def test_openrlhf_labels_carry_per_sample_settings() -> None:
    reward = openrlhf_reward("math")
    out = reward(["Q A: 12", "Q A: 12"], ["Q", "Q"],
                 ['{"answer": "12", "answer_patterns": ["^\\\\s*A:\\\\s*(\\\\S+)$"]}', "12"])  # fmt: skip
    assert out["rewards"] == [1.0, 0.0]
    assert openrlhf_reward("math", unscored_reward=-1.0)(["q"], ["q"], ["\\frac{"])["rewards"] == [
        -1.0
    ]


@pytest.mark.docker
def test_openrlhf_code_reward_file(docker_sandbox, tmp_path: Path) -> None:
    path = tmp_path / "reward.py"
    path.write_text(
        'from scorers.rewards import openrlhf_reward\nreward_func = openrlhf_reward("unit_tests")\n'
    )
    func = openrlhf_load_reward_func(str(path))
    prompt = chat("Write add(a, b).")
    code = "```python\ndef add(a, b):\n    return a + b\n```<|im_end|>"
    label = json.dumps({"test_list": ["assert add(1, 2) == 3"]})
    out = asyncio.run(openrlhf_fetch_rewards_via_func(func, [prompt + code], [prompt], [label]))
    assert out[0]["rewards"] == [1.0]


# -- provenance -----------------------------------------------------------------------------------


def test_every_adapter_reports_the_warehouse_fingerprint() -> None:
    digest = fingerprint(get_verifier("math")).digest  # what the scoring stage stores
    assert trl_reward("math").fingerprint == digest
    assert trl_reward("math", asynchronous=True).fingerprint == digest
    assert compute_score("x", "ANSWER: 1", "1")["verifier_fingerprint"] == digest
    assert scorers.rewards.reward_func.fingerprint == digest == openrlhf_reward().fingerprint
    assert verifier_fingerprint("math", timeout_s=2) == digest  # the default, written as an int
    assert verifier_fingerprint("math", timeout_s=3.0) != digest  # other settings, other digest
    assert trl_reward("unit_tests").fingerprint == fingerprint(get_verifier("unit_tests")).digest


@pytest.mark.docker
@pytest.mark.slow
def test_code_rewards_in_a_forked_child_leave_the_parents_sandbox_alone(
    docker_sandbox, tmp_path: Path
) -> None:
    # verl's prime manager forks its workers from a process that may already hold a sandbox
    # pool: the child must grade in containers of its own (the parent's exec streams are the
    # parent's), and its exit must not remove the parent's containers.
    script = """
import json, os, sys
from scorers.rewards import trl_reward
reward = trl_reward("unit_tests")
good = "```python\\ndef add(a, b):\\n    return a + b\\n```"
bad = "```python\\ndef add(a, b):\\n    return a - b\\n```"
def grade():
    return reward(completions=[good, bad], test_list=[["assert add(1, 2) == 3"]] * 2)
first = grade()
pid = os.fork()
if pid == 0:
    print(json.dumps({"child": grade()}), flush=True)
    sys.exit(0)  # a normal exit: atexit handlers run in the child
os.waitpid(pid, 0)
print(json.dumps({"parent": [first, grade(), grade()]}), flush=True)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADEBOOK_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO, check=True)  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    got = {k: v for line in lines for k, v in line.items()}
    assert got["child"] == [1.0, 0.0]
    assert got["parent"] == [[1.0, 0.0]] * 3
