"""The rewards' hard time limit holds wherever a trainer calls them (issue 15).

Signal-based timeouts work only in a process's main thread: Math-Verify's did nothing in Ray
workers and reward threads (Math-Verify #50/#55, verl #3407), so MATH rewards silently became
0 or hung. gradebook kills a worker process at the deadline instead. These tests call the
rewards the ways trainers do (16 threads at once, an asyncio loop, a forked executor process)
with an input that grinds sympy until killed, and demand an answer within its limit + 0.5 s,
then a correct answer from the next call.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from scorers.rewards import compute_score, openrlhf_reward, trl_reward, warm_up
from scorers.workers.bounded import shared_pool

LIMIT_S = 1.0
SLACK_S = 0.5
GRIND = "ANSWER: x^{x^{x^{x^{x}}}}"  # sympy works on this until its worker is killed
REFERENCE = "x^2+2x+1"
GOOD = "ANSWER: (x+1)^2"  # symbolic too: the next call needs a working worker


@pytest.fixture(autouse=True)
def _booted() -> None:
    # The one documented exception to the limit is a process's first start of its workers
    # (the zygote importing sympy); trainers call warm_up() once per worker process.
    warm_up()


def _trl(completion: str) -> float | None:
    reward = trl_reward("math", timeout_s=LIMIT_S)
    return reward(prompts=["p"], completions=[completion], answer=[REFERENCE])[0]


def _verl(completion: str) -> float | None:
    result = compute_score("math", completion, REFERENCE, {"timeout_s": LIMIT_S})
    assert isinstance(result, dict)
    return None if result["unscored"] else result["score"]


def _openrlhf(completion: str) -> float | None:
    out = openrlhf_reward("math", timeout_s=LIMIT_S)([f"p {completion}"], ["p"], [REFERENCE])
    return None if out["extra_logs"]["unscored"][0] else out["rewards"][0]


def _timed(fn, completion: str) -> tuple[float, float | None]:
    start = time.monotonic()
    value = fn(completion)
    return time.monotonic() - start, value


@pytest.mark.slow
@pytest.mark.serial
def test_sixteen_threads_at_once_each_answer_within_the_limit() -> None:
    # 16 pathological calls and only 2 sympy workers: the calls that find no free worker give
    # up at their deadline too (unscored), instead of queueing for 8 rounds of the limit.
    adapters = [_trl, _verl, _openrlhf, _trl]
    results: list[tuple[float, float | None]] = []
    lock = threading.Lock()
    go = threading.Barrier(16)

    def call(i: int) -> None:
        go.wait()
        outcome = _timed(adapters[i % 4], GRIND)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 16
    assert all(value is None for _, value in results), results  # unscored, never 0.0 silently
    slowest = max(elapsed for elapsed, _ in results)
    assert slowest <= LIMIT_S + SLACK_S, sorted(e for e, _ in results)
    for adapter in (_trl, _verl, _openrlhf):
        assert adapter(GOOD) == 1.0


@pytest.mark.serial
def test_the_async_reward_answers_in_time_and_never_blocks_the_loop() -> None:
    reward = trl_reward("math", asynchronous=True, timeout_s=LIMIT_S)
    gaps: list[float] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.02)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    async def main() -> tuple[float, list[list[float | None]], float]:
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeat(stop))
        start = time.monotonic()
        # as TRL gathers its async reward functions
        outs = await asyncio.gather(
            *[reward(prompts=["p"], completions=[GRIND], answer=[REFERENCE]) for _ in range(2)]
        )
        elapsed = time.monotonic() - start
        # the sync adapters called straight from a coroutine (blocking it) are bounded too
        blocking, value = _timed(_verl, GRIND)
        assert value is None
        stop.set()
        await beat
        return elapsed, outs, blocking

    elapsed, outs, blocking = asyncio.run(main())
    assert outs == [[None], [None]]
    assert elapsed <= LIMIT_S + SLACK_S
    assert blocking <= LIMIT_S + SLACK_S
    # while the async reward graded, the loop kept running its other tasks
    assert max(gaps[: max(1, len(gaps) // 2)]) < SLACK_S
    assert asyncio.run(reward(prompts=["p"], completions=[GOOD], answer=[REFERENCE])) == [1.0]


def _child_calls(queue: mp.Queue) -> None:
    for adapter in (_trl, _verl, _openrlhf):
        queue.put((adapter.__name__, *_timed(adapter, GRIND)))
    queue.put(("good", *_timed(_trl, GOOD)))


@pytest.mark.serial
def test_a_forked_child_answers_within_the_limit() -> None:
    # multiprocessing's "fork": the child's pool forks its workers from the parent's zygote
    # (handed over at the fork), so its first call does not wait for a sympy import.
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_calls, args=(queue,))
    child.start()
    got = [queue.get(timeout=120) for _ in range(4)]
    child.join(timeout=30)
    assert child.exitcode == 0
    for name, elapsed, value in got[:3]:
        assert value is None, name
        assert elapsed <= LIMIT_S + SLACK_S, (name, elapsed)
    assert got[3][2] == 1.0
    assert _trl(GOOD) == 1.0  # the parent's own pool is untouched


def _prime_style(completion: str) -> tuple[float, float]:
    # verl's "prime" reward manager: compute_score(task, completion, reference, extra_info)
    # in a ProcessPoolExecutor, reward_kwargs merged in
    start = time.monotonic()
    score = compute_score("math", completion, REFERENCE, {}, timeout_s=LIMIT_S, as_float=True)
    return time.monotonic() - start, score


@pytest.mark.serial
def test_a_fork_process_pool_executor_like_verls_prime_manager() -> None:
    with ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("fork")) as pool:
        slow = [pool.submit(_prime_style, GRIND) for _ in range(2)]
        outcomes = [f.result(timeout=120) for f in slow]
        good = pool.submit(_prime_style, GOOD).result(timeout=120)
    for elapsed, score in outcomes:
        assert score == 0.0  # the documented unscored score (as_float carries no flag)
        assert elapsed <= LIMIT_S + SLACK_S
    assert good[1] == 1.0


def _state(pid: int) -> str:
    """The process's state letter (R running, S sleeping, Z zombie, ...); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return ""


def _running(pid: int) -> bool:
    return _state(pid) not in ("", "Z")


def grind_in_worker(pid_file: str) -> None:
    """Runs in a verification worker: says which process it is, then works for hours."""
    Path(pid_file).write_text(str(os.getpid()))
    pow(10, 10**13)


def _grind_forever(pid_file: str) -> None:
    pool = shared_pool(("scorers.math._symbolic",))  # the pool the child inherited at the fork
    threading.Thread(
        target=pool.call,
        args=(f"{__name__}:grind_in_worker", pid_file),
        kwargs={"timeout_s": 600},
        daemon=True,
    ).start()
    time.sleep(600)


def test_a_killed_forked_child_takes_its_busy_worker_with_it(tmp_path: Path) -> None:
    # The child's workers come from the parent's zygote, which outlives the child: the zygote
    # must kill them when the child's channel closes, or a SIGKILLed trainer process would
    # leave a worker grinding big integers for hours.
    pid_file = tmp_path / "worker.pid"
    child = mp.get_context("fork").Process(target=_grind_forever, args=(str(pid_file),))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the worker never started the call"
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        # the worker is inside pow() now: on a CPU (R), where an idle one sleeps on its pipe
        while _state(worker) != "R":
            assert time.monotonic() < deadline, "the worker never started computing"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
    deadline = time.monotonic() + 10
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker)
    assert _trl(GOOD) == 1.0
