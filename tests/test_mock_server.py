"""The local OpenAI-compatible server (sweeps/mock_server.py) under the load of a log build, and
what its callers see when it stops or when a wait on it stalls. Real HTTP on 127.0.0.1, the
openai client Inspect uses, real Inspect eval() runs; the first `benchmarks/judge_scoring.py`
run (no cached logs) hung building its second log until the fix tested last here."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import sys
import threading
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log
from inspect_ai.model import get_model
from inspect_ai.solver import generate

from sweeps.mock_server import Stalled, scripted_server, watchdog

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = 64  # what the benchmark's log build opens (max_connections=64)
ROUNDS = 8  # requests on each connection after the first, all on the same kept-alive one
WAIT_S = 120.0  # generous on a loaded 2-core machine; the stall this guards against was minutes


def _echo(model: str, messages: list[dict[str, Any]]) -> str:
    return f"{model} heard {messages[-1]['content']}"


def _client(url: str) -> openai.AsyncOpenAI:
    """The openai client as Inspect builds it (httpx2 underneath), keeping every connection
    alive for the whole test, without retries: a failed request is seen, not retried."""
    limits = httpx2.Limits(
        max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS, keepalive_expiry=WAIT_S
    )
    http = openai.DefaultAsyncHttpxClient(limits=limits)
    return openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0, http_client=http)


async def _ask(client: openai.AsyncOpenAI, prompt: str) -> str | None:
    out = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}]
    )
    return out.choices[0].message.content


def test_64_keepalive_connections_are_all_answered_and_closed_when_the_server_stops() -> None:
    together = threading.Barrier(CONNECTIONS, timeout=WAIT_S)
    arrivals = itertools.count()

    def script(model: str, messages: list[dict[str, Any]]) -> str:
        if next(arrivals) < CONNECTIONS:
            together.wait()  # the first 64 requests are answered only when all 64 are in
        return _echo(model, messages)

    async def run() -> None:
        replies: dict[str, str | None] = {}
        with scripted_server(script, models=["m"]) as server:
            client = _client(server.base_url)

            async def one_connection(c: int) -> None:
                for r in range(1 + ROUNDS):
                    replies[f"c{c} r{r}"] = await _ask(client, f"c{c} r{r}")

            load = asyncio.gather(*(one_connection(c) for c in range(CONNECTIONS)))
            try:
                await asyncio.wait_for(load, WAIT_S)
            except TimeoutError:
                pytest.fail(
                    f"{CONNECTIONS} connections x {1 + ROUNDS} requests to {server.base_url}: "
                    f"{len(replies)} answered within {WAIT_S:.0f} s; the server has "
                    f"{server.in_flight} in flight on {server.open_connections} connections"
                )
            assert replies == {p: f"m heard {p}" for p in replies}
            assert len(replies) == server.count(200) == CONNECTIONS * (1 + ROUNDS)
            # all 64 were open at once (the barrier), and kept alive: no request needed another
            assert server.open_connections == CONNECTIONS
        # stopped: a client holding kept-alive connections to it gets no answer on them
        with pytest.raises(openai.APIConnectionError):
            answer = await _ask(client, "after the stop")
            pytest.fail(f"the stopped server answered {answer!r} on a kept-alive connection")
        assert server.open_connections == 0
        await client.close()

    asyncio.run(run())


def _task(n: int) -> Task:
    return Task(dataset=[Sample(id=i, input=f"question {i}") for i in range(n)], solver=generate())


def test_a_wait_on_a_server_that_answers_nothing_ends_with_a_line_saying_what_waited(
    tmp_path: Path,
) -> None:
    with scripted_server(_echo, models=["m"]) as gone:
        pass  # stopped: its port refuses, and Inspect retries a refused request with backoff
    model = get_model("openai-api/gen/m", base_url=gone.base_url, api_key="test", memoize=False)
    with scripted_server(_echo, models=["m"]) as server:
        with pytest.raises(Stalled) as stalled:
            with watchdog(server, waiting="eval() generating 2 samples", quiet_s=5, until=2):
                inspect_eval(_task(2), model=model, display="none", log_dir=str(tmp_path))
    line = str(stalled.value)
    assert line == (
        f"eval() generating 2 samples: stopped: {server.base_url} answered nothing for 5 s "
        "(0 of 2 requests answered, 0 being answered, 0 connections open)"
    )


_IGNORING_CTRL_C = """
import signal, threading
from sweeps.mock_server import Stalled, scripted_server, watchdog
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
with scripted_server(lambda model, messages: "x", models=["m"]) as server:
    try:
        with watchdog(server, waiting="a wait on nothing", quiet_s=1):
            threading.Event().wait(120)
    except Stalled as stalled:
        print(stalled)
print("handler after:", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""


def test_a_wait_in_a_process_started_with_ctrl_c_ignored_still_ends_at_its_bound() -> None:
    """A process a shell started in the background (`cmd &`, nohup) inherits SIGINT ignored;
    the watchdog's interrupt was then lost and a stalled wait ran on to pytest's 600 s limit,
    whose exception the watchdog then reported as the stall."""
    import signal
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _IGNORING_CTRL_C],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("a wait on nothing: stopped: http://127.0.0.1:")
    assert lines[0].endswith("answered nothing for 1 s (0 requests answered, 0 being answered, "
                             "0 connections open)")  # fmt: skip
    assert lines[1] == "handler after: True"  # the process's own choice, given back


def test_a_watched_eval_that_gets_its_answers_runs_to_the_end(tmp_path: Path) -> None:
    with scripted_server(_echo, models=["m"]) as server:
        model = get_model("openai-api/gen/m", base_url=server.base_url, api_key="t", memoize=False)
        with watchdog(server, waiting="eval() generating 3 samples", quiet_s=WAIT_S, until=3):
            (log,) = inspect_eval(_task(3), model=model, display="none", log_dir=str(tmp_path))
    assert log.status == "success"
    assert sorted(s.output.completion for s in log.samples or []) == [
        f"m heard question {i}" for i in range(3)
    ]


def test_two_benchmark_logs_built_in_one_process_each_get_their_own_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/judge_scoring.py with no cached logs builds two in one process, each against
    a generation server of its own. The second eval once got the first one's memoized model,
    bound to the stopped first server, and retried its port for ever, silently."""
    monkeypatch.setattr(sys, "path", [str(ROOT), *sys.path])  # and what the script adds to it
    bench = importlib.import_module("benchmarks.judge_scoring")
    monkeypatch.setattr(bench, "STALL_S", 60.0)  # a stall ends the build with a SystemExit line
    try:
        paths = [bench.build_log(n, tmp_path) for n in (3, 4)]
    finally:
        sys.modules.pop("benchmarks.judge_scoring", None)
    for n, path in zip((3, 4), paths, strict=True):
        log = read_eval_log(str(path))
        assert log.status == "success" and len(log.samples or []) == n
        # no URL recorded: scoring rebuilds the log's model from GEN_BASE_URL, the server the
        # benchmark counts generator calls on, not from this build's server (gone by then)
        assert log.eval.model_base_url is None
        assert [s.output.completion for s in sorted(log.samples or [], key=lambda s: s.id)] == [
            bench._answer("gen", [{"content": bench._question(i)[0]}]) for i in range(1, n + 1)
        ]
