"""`gradebook reward serve`: OpenRLHF's remote-reward protocol over a real HTTP server (issue 15).

The client side is OpenRLHF's own (openrlhf/utils/agent.py @ 3c3be62,
SingleTurnAgentExecutor._fetch_rewards_via_http): aiohttp, a 180 s timeout, a batch split across
every URL given, `raise_for_status()` then `response.json()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import need

from scorers.grade import SampleView
from scorers.math import grade_math
from scorers.rewards import openrlhf_reward
from scorers.rewards.server import RewardServer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server():
    lines: list[str] = []
    with RewardServer(openrlhf_reward("math"), port=0, log=lines.append) as srv:
        srv.lines = lines  # type: ignore[attr-defined]
        yield srv


async def fetch_rewards_via_http(endpoints, queries_list, prompts_list, labels_list) -> list:
    """OpenRLHF's HTTP client, as in SingleTurnAgentExecutor._fetch_rewards_via_http."""
    try:
        import aiohttp
    except ImportError:
        need(False, "aiohttp (OpenRLHF's HTTP client) is not installed")
        raise
    num_servers = len(endpoints)
    batch_size = (len(queries_list) + num_servers - 1) // num_servers
    timeout = aiohttp.ClientTimeout(total=180)
    tasks = []
    for i, rm in enumerate(endpoints):
        start_idx, end_idx = i * batch_size, min((i + 1) * batch_size, len(queries_list))
        payload = {
            "query": queries_list[start_idx:end_idx],
            "prompts": prompts_list[start_idx:end_idx],
            "labels": labels_list[start_idx:end_idx],
        }

        async def _post_request(url, data, try_max_times=5):
            for _ in range(try_max_times):
                try:
                    async with aiohttp.ClientSession(timeout=timeout) as session:
                        async with session.post(url, json=data) as response:
                            response.raise_for_status()
                            return await response.json()
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(1)
            raise RuntimeError(f"Request error for {try_max_times} times")

        tasks.append(asyncio.create_task(_post_request(rm, payload)))
    return await asyncio.gather(*tasks)


def _chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def _math500_batch(shared: Path, n: int) -> tuple[list[str], list[str], list[str], list]:
    rows = [json.loads(line) for line in (shared / "math" / "math500_test.jsonl").open()]
    queries, prompts, labels, want = [], [], [], []
    for i in range(n):
        row = rows[i % len(rows)]
        prompt = _chat(row["problem"])
        label = row["answer"] if i % 4 else "\\frac{"  # every 4th: a broken reference
        response = row["solution"] if i % 3 else "I cannot solve this."
        queries.append(prompt + response + "<|im_end|>")
        prompts.append(prompt)
        labels.append(label)
        grade = grade_math(SampleView(completion=response, target=label))
        want.append(grade.value if grade.status == "scored" else None)
    return queries, prompts, labels, want


@pytest.mark.slow
def test_a_batch_of_512_split_across_two_urls(server: RewardServer, shared_data: Path) -> None:
    queries, prompts, labels, want = _math500_batch(shared_data, 512)
    assert want.count(None) == 128 and 1.0 in want and 0.0 in want
    halves = asyncio.run(fetch_rewards_via_http([server.url, server.url + "get_reward"],
                                                queries, prompts, labels))  # fmt: skip
    rewards = halves[0]["rewards"] + halves[1]["rewards"]
    flags = halves[0]["extra_logs"]["unscored"] + halves[1]["extra_logs"]["unscored"]
    assert len(rewards) == 512
    assert [None if f else r for r, f in zip(rewards, flags, strict=True)] == want
    assert halves[0]["scores"] == halves[0]["rewards"]
    assert halves[0]["verifier_fingerprint"] == server.fingerprint
    # the same batch in one request, and what the file form gives for it
    (whole,) = asyncio.run(fetch_rewards_via_http([server.url], queries, prompts, labels))
    assert whole["rewards"] == rewards
    assert openrlhf_reward("math")(queries, prompts, labels)["rewards"] == rewards


def test_one_sample_per_request_and_an_empty_shard(server: RewardServer) -> None:
    # OpenRLHF sends each sample as soon as it is generated; split across two URLs, one query
    # leaves the second URL an empty batch, which must be answered, not refused.
    prompt = _chat("Half of 1?")
    out = asyncio.run(fetch_rewards_via_http([server.url, server.url],
                                             [prompt + "ANSWER: 1/2<|im_end|>"], [prompt], ["0.5"]))  # fmt: skip
    assert out[0]["rewards"] == [1.0]
    assert out[1]["rewards"] == [] and out[1]["extra_logs"] == {"unscored": []}


def _post(url: str, body: bytes, headers: dict | None = None, method: str = "POST"):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.reason, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.reason, json.loads(exc.read())


def _raw(server: RewardServer, data: bytes) -> bytes:
    host, port = server._httpd.server_address[:2]
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"not json", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"prompts": [], "labels": []}', 400, '"query" must be a list'),
        (b'{"query": ["a", 3], "labels": ["1", "2"]}', 400, '"query"[1] is int'),
        (b'{"query": ["a"], "labels": ["1", "2"]}', 400, '"labels" has 2 items for 1 queries'),
        (b'{"query": ["a"], "prompts": "p", "labels": ["1"]}', 400, '"prompts" must be a list'),
    ],
)
def test_a_malformed_request_is_a_4xx_with_one_line(server, body, status, says) -> None:
    code, reason, payload = _post(server.url, body)
    assert code == status
    assert says in payload["error"] and "\n" not in payload["error"]
    assert reason == payload["error"]  # the status line says it too
    # and the server goes on answering
    assert _post(server.url, b'{"query": ["ANSWER: 2"], "labels": ["2"]}')[2]["rewards"] == [1.0]


def test_transport_faults_are_answered_and_survived(server: RewardServer) -> None:
    assert _post(server.url + "nope", b"{}")[0] == 404
    assert _post(server.url, b"", method="PUT")[0] == 405
    assert b"411" in _raw(server, b"POST / HTTP/1.0\r\n\r\n").split(b"\r\n")[0]
    big = b"POST / HTTP/1.0\r\nContent-Length: 999999999999\r\n\r\n"
    assert b"413" in _raw(server, big).split(b"\r\n")[0]
    # a client that promises 100 bytes, sends 5 and hangs up
    cut = _raw(server, b'POST / HTTP/1.0\r\nContent-Length: 100\r\n\r\n{"qu')
    assert b"400" in cut.split(b"\r\n")[0]
    # one that connects and leaves without a word
    socket.create_connection(server._httpd.server_address[:2], timeout=5).close()
    code, _, health = _post(server.url + "health", None, method="GET")
    assert code == 200 and health["status"] == "ok"
    assert health["verifier_fingerprint"] == server.fingerprint
    assert health["rejected"] == 4  # the 404, 411, 413 and 400 above


@pytest.mark.slow
def test_gradebook_reward_serve_command(tmp_path: Path) -> None:
    env = {**os.environ, "GRADEBOOK_CACHE_DIR": str(tmp_path)}
    bad = subprocess.run([sys.executable, "-m", "flows.cli", "reward", "serve", "--verifier",
                          "maths"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: openrlhf_reward('maths'): unknown verifier 'maths': known verifiers are math, "
        "unit_tests"
    ]
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "reward", "serve", "--port", "0"],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"at (http://\S+/) ", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server never said where it listens"
        assert url.startswith("http://127.0.0.1:")  # private by default
        assert _post(url, b'{"query": ["ANSWER: 3"], "labels": ["3"]}')[2]["rewards"] == [1.0]
        # the port is taken now: a second server says so in one line
        port = url.rsplit(":", 1)[1].strip("/")
        taken = subprocess.run([sys.executable, "-m", "flows.cli", "reward", "serve", "--port",
                                port], cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=120)  # fmt: skip
        assert taken.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr.strip().splitlines()[-1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
