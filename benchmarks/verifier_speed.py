"""Latency and throughput of the math verifier on MATH-500 references, against Math-Verify.

    .venv/bin/python benchmarks/verifier_speed.py [--quick] [--json PATH]

Each MATH-500 reference (../shared/data/math/math500_test.jsonl) is checked against itself and
against a perturbed answer (a digit changed, or "+1" appended), by our `verify` and by
Math-Verify's parse+verify, in the same run. Reported: p50/p99 per call and pairs per second,
split into plain numbers and everything else, with Math-Verify as the anchor.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row, emit, info  # noqa: E402
from scorers.math import verify, warm_up  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "math" / "math500_test.jsonl"
_PLAIN = re.compile(r"^-?\d[\d,]*(\.\d+)?$|^-?\\frac\{\d+\}\{\d+\}$|^-?\d+/\d+$")


def perturb(answer: str) -> str:
    m = re.search(r"\d", answer)
    if m:
        d = m.group()
        return answer[: m.start()] + str((int(d) + 1) % 10) + answer[m.end() :]
    return answer + "+1"


def time_calls(fn: Callable[[str, str], object], pairs: list[tuple[str, str]]) -> list[float]:
    out = []
    for cand, ref in pairs:
        start = time.perf_counter()
        fn(cand, ref)
        out.append(time.perf_counter() - start)
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ours(cand: str, ref: str) -> bool:
    return verify(cand, ref).equal


def math_verify(cand: str, ref: str) -> bool:
    from math_verify import parse
    from math_verify import verify as mv_verify

    return bool(mv_verify(parse(f"${ref}$"), parse(f"${cand}$")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="first 120 references only")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not DATA.is_file():
        sys.exit(f"MATH-500 not found at {DATA}: run from a checkout beside ../shared")
    refs = [json.loads(line)["answer"] for line in DATA.open()]
    if args.quick:
        refs = refs[:120]
    pairs = [(r, r) for r in refs] + [(perturb(r), r) for r in refs]
    plain = [p for p in pairs if _PLAIN.match(p[1].strip())]
    other = [p for p in pairs if not _PLAIN.match(p[1].strip())]

    warm_up()
    ours(*pairs[0])
    math_verify(*pairs[0])  # first-call imports are not what we measure
    results: dict[str, dict[str, list[float]]] = {}
    for name, fn in (("gradebook", ours), ("math-verify", math_verify)):
        results[name] = {"plain": time_calls(fn, plain), "other": time_calls(fn, other)}

    rows: list[Row] = []
    mv = results["math-verify"]
    us = results["gradebook"]
    for group, n in (("plain", len(plain)), ("other", len(other))):
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            value, anchor = 1000 * pct(us[group], q), 1000 * pct(mv[group], q)
            name = f"{label} latency, {group} ({n} pairs)"
            if (group, label) == ("plain", "p50"):
                rows.append(Row(name, value, "ms", "math-verify", anchor, value / anchor,
                                "<= 0.2 ms", value <= 0.2))  # fmt: skip
            else:
                rows.append(info(name, value, "ms", "math-verify", anchor, value / anchor))
    total_us = sum(us["plain"]) + sum(us["other"])
    total_mv = sum(mv["plain"]) + sum(mv["other"])
    tput_us, tput_mv = len(pairs) / total_us, len(pairs) / total_mv
    rows.append(Row(f"throughput, all {len(pairs)} pairs", tput_us, "pairs/s", "math-verify",
                    tput_mv, tput_us / tput_mv, ">= 2x math-verify",
                    tput_us / tput_mv >= 2))  # fmt: skip
    rows.append(info("mean latency, all pairs", 1000 * statistics.mean(us["plain"] + us["other"]),
                     "ms", "math-verify", 1000 * statistics.mean(mv["plain"] + mv["other"]),
                     total_us / total_mv))  # fmt: skip
    emit("math verifier speed", rows, args.json)


if __name__ == "__main__":
    main()
