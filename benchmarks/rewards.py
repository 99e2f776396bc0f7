"""One GRPO step's math rewards: gradebook's reward against Math-Verify, on the same inputs.

    .venv/bin/python benchmarks/rewards.py [--quick] [--json PATH]

A GRPO step is 512 prompts x 16 completions = 8,192 rewards. Prompts are MATH-500 problems
(../shared/data/math/math500_test.jsonl, cycled to 512); each gets 16 completions built from
its reference solution, in a fixed seeded mix: 6 right (the solution as written), 3 right but
reformatted (\\dfrac, thousands separators, "x = ", an ANSWER: line instead of a box), 4 wrong
(a digit changed), 2 hedged ("\\boxed{a} or \\boxed{b}") and 1 cut off before its answer, each
with its own first line (sampled completions differ in words even where their answers agree).

Measured in one run, pinned to 2 cores: gradebook's TRL reward called once on the whole batch
(as GRPOTrainer calls it) and one completion per call (as verl's managers call compute_score),
against Math-Verify called the way verl's math_verify integration does (math_metric with the
reference boxed), one completion per call. Reported: throughput, the 8,192-reward wall time,
p50/p99 per-call latency, and agreement with how each completion was built. `--quick`: 32
prompts.

The reward server (`gradebook reward serve`) under slow clients: the worst latency of a
one-query request while 64 clients (its default `--connections`) hold sockets with a request
they stopped sending halfway (half in the headers, half in the body: a slowloris), against the
same requests with no such client (bar: under 1 s).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row, emit, info  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "math" / "math500_test.jsonl"
PROMPTS, PER_PROMPT = 512, 16
MIX = ["right"] * 6 + ["reformatted"] * 3 + ["wrong"] * 4 + ["hedged"] * 2 + ["cut"]
CORRECT = {"right": 1.0, "reformatted": 1.0, "wrong": 0.0, "hedged": 0.0, "cut": 0.0}


def last_box(text: str) -> tuple[int, int] | None:
    """(start, end) of the last \\boxed{...} in text, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start, i + 1
        i += 1
    return None


def perturb(answer: str) -> str:
    m = re.search(r"\d", answer)
    if m:
        return answer[: m.start()] + str((int(m.group()) + 1) % 10) + answer[m.end() :]
    return answer + "+1"


def reformat(answer: str, rng: random.Random) -> tuple[str, bool]:
    """An equivalent way to write `answer`, and whether it goes on an ANSWER: line."""
    if re.fullmatch(r"\d{4,}", answer):
        return f"{int(answer):,}", False
    if "\\frac" in answer and "\\dfrac" not in answer:
        return answer.replace("\\frac", "\\dfrac"), False
    if re.fullmatch(r"-?\d+", answer) and rng.random() < 0.5:
        return f"x = {answer}", False
    return answer, True


def completion(row: dict, kind: str, rng: random.Random) -> str:
    solution, answer = row["solution"], row["answer"]
    box = last_box(solution)
    head, tail = (solution[: box[0]], solution[box[1] :]) if box else (solution + " ", "")
    if kind == "right":
        return solution if box else f"{solution}\n\\boxed{{{answer}}}"
    if kind == "reformatted":
        text, on_line = reformat(answer, rng)
        if on_line:
            return f"{head}{answer}{tail}\nANSWER: {text}"
        return f"{head}\\boxed{{{text}}}{tail}"
    if kind == "wrong":
        return f"{head}\\boxed{{{perturb(answer)}}}{tail}"
    if kind == "hedged":
        return f"{head}\\boxed{{{answer}}} or \\boxed{{{perturb(answer)}}}{tail}"
    return solution[: max(1, (box[0] if box else len(solution)) // 2)]


def build(prompts: int) -> tuple[list[str], list[str], list[float]]:
    rows = [json.loads(line) for line in DATA.open()]
    rng = random.Random(15)
    texts, refs, labels = [], [], []
    for i in range(prompts):
        row = rows[i % len(rows)]
        for k, kind in enumerate(rng.sample(MIX, len(MIX))):
            # sampled completions differ in their words even where their answers agree
            texts.append(f"Attempt {k + 1}, thinking step by step.\n\n{completion(row, kind, rng)}")
            refs.append(row["answer"])
            labels.append(CORRECT[kind])
    return texts, refs, labels


_MV = None


def _mv_warm() -> None:
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # a warning per unparsed answer
    from sympy.utilities.exceptions import SymPyDeprecationWarning

    warnings.filterwarnings("ignore", category=SymPyDeprecationWarning)  # raised in Math-Verify
    math_verify_score("\\boxed{1}", "1")


def math_verify_score(text: str, reference: str) -> float:
    """verl/utils/reward_score/math_verify.py compute_score (timeout_score 0)."""
    global _MV
    if _MV is None:
        from math_verify.metric import math_metric
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

        _MV = math_metric(
            gold_extraction_target=(LatexExtractionConfig(),),
            pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
        )
    try:
        score, _ = _MV(["\\boxed{" + reference + "}"], [text])
    except Exception:  # noqa: BLE001 - verl's integration swallows every failure as 0
        score = 0.0
    return float(score)


def per_call(fn: Callable[[str, str], float | None], texts, refs) -> tuple[list, list[float]]:
    values, times = [], []
    for t, r in zip(texts, refs, strict=True):
        start = time.perf_counter()
        values.append(fn(t, r))
        times.append(time.perf_counter() - start)
    return values, times


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def agreement(values: list, labels: list[float]) -> float:
    return sum((v or 0.0) == lab for v, lab in zip(values, labels, strict=True)) / len(labels)


SLOW_CLIENTS, SERVER_REQUESTS = 64, 20


def server_latency(slow_clients: int) -> float:
    """The slowest of SERVER_REQUESTS one-query requests to a reward server, in seconds, while
    `slow_clients` connections hold a request they stopped sending halfway."""
    import socket
    import urllib.request

    from scorers.rewards import openrlhf_reward
    from scorers.rewards.server import RewardServer

    body = b'{"query": ["ANSWER: 2"], "labels": ["2"]}'
    stalls = [b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: ",
              b'POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"query": [']  # fmt: skip
    with RewardServer(openrlhf_reward("math"), port=0, log=lambda _: None) as server:
        slow = [socket.create_connection(server.address, timeout=30) for _ in range(slow_clients)]
        try:
            for i, sock in enumerate(slow):
                sock.sendall(stalls[i % 2])
            times = []
            for _ in range(SERVER_REQUESTS):
                start = time.perf_counter()
                request = urllib.request.Request(server.url, data=body, method="POST")
                with urllib.request.urlopen(request, timeout=120) as response:
                    if json.loads(response.read())["rewards"] != [1.0]:
                        sys.exit("the reward server answered wrongly: a bug, not a result")
                times.append(time.perf_counter() - start)
        finally:
            for sock in slow:
                sock.close()
    return max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 prompts (512 rewards)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not DATA.is_file():
        sys.exit(f"MATH-500 not found at {DATA}: run from a checkout beside ../shared")
    cores = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cores)  # before any worker starts: they inherit it
    texts, refs, labels = build(32 if args.quick else PROMPTS)
    n = len(texts)

    from scorers.rewards import compute_score, trl_reward, warm_up

    warm_up()
    reward = trl_reward("math")
    reward(completions=texts[:64], answer=refs[:64])  # first-call costs are not measured
    _mv_warm()

    start = time.perf_counter()
    batch = reward(prompts=[""] * n, completions=texts, answer=refs)
    batch_s = time.perf_counter() - start
    ours_single, ours_times = per_call(
        lambda t, r: compute_score("math", t, r)["score"], texts, refs
    )

    mv_values, mv_times = per_call(math_verify_score, texts, refs)
    mv_s = sum(mv_times)
    tput, mv_tput = n / batch_s, n / mv_s
    step = f"{n:,} rewards"
    rows = [
        Row(f"throughput, {step} in one TRL call", tput, "rewards/s", "math-verify", mv_tput,
            tput / mv_tput, ">= 10x math-verify", tput / mv_tput >= 10),
        info(f"wall time, {step}, {len(cores)} cores", batch_s, "s", "math-verify", mv_s,
             batch_s / mv_s),
        info("p50 latency, one completion per call", 1000 * pct(ours_times, 0.5), "ms",
             "math-verify", 1000 * pct(mv_times, 0.5), pct(ours_times, 0.5) / pct(mv_times, 0.5)),
        info("p99 latency, one completion per call", 1000 * pct(ours_times, 0.99), "ms",
             "math-verify", 1000 * pct(mv_times, 0.99),
             pct(ours_times, 0.99) / pct(mv_times, 0.99)),
        info("agreement with how completions were built", 100 * agreement(batch, labels), "%",
             "math-verify", 100 * agreement(mv_values, labels),
             agreement(batch, labels) / max(agreement(mv_values, labels), 1e-9)),
    ]  # fmt: skip
    calm, stalled = server_latency(0), server_latency(SLOW_CLIENTS)
    rows.append(
        Row(f"reward server: slowest of {SERVER_REQUESTS} requests, {SLOW_CLIENTS} stalled "
            "clients connected", 1000 * stalled, "ms", "no stalled client", 1000 * calm,
            stalled / calm, "< 1 s", stalled < 1.0)
    )  # fmt: skip
    if [0.0 if v is None else v for v in batch] != ours_single:
        sys.exit("the batch and the per-call rewards differ: a bug, not a benchmark result")
    emit(f"math rewards for one GRPO step ({n:,} completions, {len(cores)} cores)", rows, args.json)


if __name__ == "__main__":
    main()
