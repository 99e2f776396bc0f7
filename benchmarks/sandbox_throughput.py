"""Sandbox throughput: warm-pool tests/s and per-test latency vs a plain `docker run` per solution.

Both sides run the HumanEval canonical solutions in the same process, on the same image and
with the same concurrency, so the ratio holds on a noisy shared machine.

    .venv/bin/python benchmarks/sandbox_throughput.py [--quick] [--json PATH]

Bars: pool throughput >= 5x the docker-run throughput; per-test latency p50 <= 100 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row, emit, info  # noqa: E402
from scorers.code import unit_tests_for  # noqa: E402
from scorers.sandbox.pool import SandboxPool  # noqa: E402
from tasks.code import humaneval_problems  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _cases(n: int) -> list[tuple[str, str, str]]:
    out = []
    for p in humaneval_problems()[:n]:
        tests, entry = unit_tests_for({"test": p["test"], "entry_point": p["entry_point"]})
        out.append((p["prompt"] + p["canonical_solution"], tests, entry))
    return out


def run_pool(cases, concurrency: int) -> tuple[float, list[float], list[float], int]:
    """(wall seconds, concurrent per-test durations, sequential latencies, passed count)."""
    with SandboxPool(concurrency=concurrency) as pool:
        # Warm: every container started and used once, outside the timing.
        with ThreadPoolExecutor(concurrency) as ex:
            list(ex.map(lambda c: pool.run_tests(*c[:2], entry_point=c[2]), cases[:concurrency]))
        sequential = []
        for code, tests, entry in cases:
            start = time.perf_counter()
            pool.run_tests(code, tests, entry_point=entry)
            sequential.append(time.perf_counter() - start)
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            outcomes = list(ex.map(lambda c: pool.run_tests(c[0], c[1], entry_point=c[2]), cases))
        wall = time.perf_counter() - start
    return wall, [o.duration_s for o in outcomes], sequential, sum(o.passed for o in outcomes)


def run_docker(cases, concurrency: int, image: str) -> tuple[float, list[float], int]:
    """A fresh `docker run --rm` per solution (same limits, same image, same concurrency)."""
    import docker

    client = docker.from_env(timeout=120)

    def one(case) -> tuple[float, bool]:
        code, tests, _ = case
        start = time.perf_counter()
        try:
            client.containers.run(
                image,
                ["python3", "-I", "-S", "-c", code + "\n" + tests],
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit="512m",
                memswap_limit="512m",
                pids_limit=128,
                remove=True,
                labels={"gradebook.benchmark": "1"},
            )
            ok = True
        except docker.errors.ContainerError:
            ok = False
        return time.perf_counter() - start, ok

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        results = list(ex.map(one, cases))
    return time.perf_counter() - start, [r[0] for r in results], sum(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 solutions instead of 164")
    parser.add_argument("--json", type=Path, default=None, help="write the result rows here")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    cases = _cases(30 if args.quick else 164)
    docker_cases = cases[:12] if args.quick else cases
    c = args.concurrency
    wall, _, sequential, passed = run_pool(cases, c)
    from scorers.sandbox.image import image_tag

    d_wall, d_lat, d_passed = run_docker(docker_cases, c, image_tag())

    pool_tps, docker_tps = len(cases) / wall, len(docker_cases) / d_wall
    p50, p99 = _percentile(sequential, 0.5) * 1000, _percentile(sequential, 0.99) * 1000
    d50, d99 = _percentile(d_lat, 0.5) * 1000, _percentile(d_lat, 0.99) * 1000
    rows = [
        Row(
            "pool throughput",
            pool_tps,
            "tests/s",
            "docker run per solution",
            docker_tps,
            pool_tps / docker_tps,
            ">= 5x docker run throughput",
            pool_tps / docker_tps >= 5,
        ),
        Row(
            "per-test latency p50",
            p50,
            "ms",
            "docker run p50",
            d50,
            p50 / d50,
            "<= 100 ms",
            p50 <= 100,
        ),
        info("per-test latency p99", p99, "ms", "docker run p99", d99, p99 / d99),
        Row(
            "canonical solutions passed",
            passed,
            "of " + str(len(cases)),
            "docker run passed",
            d_passed,
            passed / max(1, d_passed) * len(docker_cases) / len(cases),
            "all pass",
            passed == len(cases),
        ),
    ]
    print(
        f"pool: {len(cases)} tests, concurrency {c}, {wall:.2f}s; mean per-test "
        f"{statistics.mean(sequential) * 1000:.1f} ms sequential. docker run: "
        f"{len(docker_cases)} solutions in {d_wall:.2f}s"
    )
    emit("sandbox throughput (HumanEval canonical solutions)", rows, args.json)


if __name__ == "__main__":
    main()
