"""The scoring stage's worker processes: light imports, order, fault isolation, worker death."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.score import ScoreOptions, grade_batch
from scorers.registry import Verifier
from scorers.workers.pool import GradingPool

ROOT = Path(__file__).resolve().parents[1]

_VERIFIER = """
import os, sys, time
from scorers.grade import deferred, scored

HEAVY = ("inspect_ai", "prefect", "sympy", "warehouse", "duckdb")


def grade(view):
    if view.completion == "die":
        os._exit(3)  # a segfault or OOM kill, as the parent sees it
    if view.completion == "spin":
        while True:  # pure Python: the per-sample alarm can stop it
            pass
    if view.completion == "raise":
        raise ValueError("bad sample")
    if view.completion == "defer-die":  # deferred, then the worker dies grading it
        if not view.may_defer:
            os._exit(3)
        return deferred("helper still starting")
    if view.completion == "defer" and view.may_defer or view.completion == "always defer":
        return deferred("helper still starting")
    loaded = sorted(m for m in HEAVY if m in sys.modules)
    return scored(float(view.completion == view.target[0]), answer=view.completion,
                  explanation="cmp", reason="cmp", pid=os.getpid(), loaded=loaded,
                  may_defer=view.may_defer)
"""


@pytest.fixture
def verifier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Verifier:
    name = f"pool_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_VERIFIER))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    return Verifier(name="probe", grade=module.grade, module=name)


def _rows(completions: list[str], target: str = "42") -> list[dict]:
    return [
        {"run_id": "r", "sample_id": str(i), "epoch": 1, "completion": c, "target": [target],
         "metadata": "{}", "error": None}
        for i, c in enumerate(completions)
    ]  # fmt: skip


def _grade(verifier: Verifier, rows: list[dict], workers: int = 2, **opts) -> list[tuple]:
    pool = GradingPool(workers)
    try:
        return grade_batch(
            pool, verifier, rows, ScoreOptions(workers=workers, chunk_size=3, **opts),
            in_process=False,
        )  # fmt: skip
    finally:
        pool.close()


def test_workers_grade_in_order_without_importing_inspect_or_prefect(verifier) -> None:
    rows = _rows(["42", "41"] * 10)
    results = _grade(verifier, rows)
    assert [r[1] for r in results] == [1.0, 0.0] * 10  # each result lands on its own sample
    import json

    metas = [json.loads(r[5]) for r in results]
    assert {m["loaded"] == [] for m in metas} == {True}
    assert len({m["pid"] for m in metas}) == 2  # both workers took chunks
    assert all(m["pid"] != __import__("os").getpid() for m in metas)


def test_a_dead_worker_costs_only_its_chunks_and_is_replaced(verifier) -> None:
    completions = ["42"] * 12
    completions[5] = "die"
    results = _grade(verifier, _rows(completions), workers=1)
    died = {i for i, r in enumerate(results) if r[0] == "unscored"}
    # 4 chunks of 3, strided (chunk k holds samples k, k+4, k+8): "die" is in chunk 1. One
    # worker holds two chunks at once (depth 2): chunk 1 and at most one other are lost.
    chunk = {k: {k, k + 4, k + 8} for k in range(4)}
    assert died in (chunk[1], chunk[0] | chunk[1], chunk[1] | chunk[2])
    assert all("scoring worker died" in results[i][3] for i in died)
    assert all(r[0] == "scored" and r[1] == 1.0 for i, r in enumerate(results) if i not in died)
    assert {results[i][0] for i in chunk[3]} == {"scored"}  # the replacement worker went on


def test_raising_and_spinning_samples_are_unscored_with_reasons(verifier) -> None:
    results = _grade(verifier, _rows(["42", "raise", "spin", "42"]), sample_timeout_s=0.5)
    assert [(r[0], r[4]) for r in results] == [
        ("scored", "cmp"),
        ("unscored", "verifier_error"),
        ("unscored", "timeout"),
        ("scored", "cmp"),
    ]
    assert "ValueError: bad sample" in results[1][5]  # the traceback is kept


def test_generation_errors_never_reach_the_verifier(verifier) -> None:
    rows = _rows(["die", "42"])
    rows[0]["error"] = "RuntimeError: model server returned 500\nmore"
    results = _grade(verifier, rows)
    assert results[0][:5] == (
        "error", None, None, "RuntimeError: model server returned 500", "generation_error"
    )  # fmt: skip
    assert results[1][:2] == ("scored", 1.0)


def test_verifier_cores_import_without_inspect_or_prefect() -> None:
    code = (
        "import sys; import scorers.workers.pool, scorers.math, scorers.code; "
        "print(sorted(m for m in ('inspect_ai', 'prefect', 'sympy', 'anyio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    # and the Inspect scorers are still where callers import them from
    from scorers.code import unit_test_scorer
    from scorers.math import math_verifier

    assert callable(math_verifier) and callable(unit_test_scorer)


def test_deferred_samples_are_graded_again_without_the_option(verifier) -> None:
    rows = _rows(["42", "defer", "41", "defer"] * 6, target="defer")
    results = _grade(verifier, rows)
    import json

    assert [r[0] for r in results] == ["scored"] * 24  # nothing lost, nothing stored deferred
    assert [r[1] for r in results] == [0.0, 1.0, 0.0, 1.0] * 6
    passes = [json.loads(r[5])["may_defer"] for r in results]
    assert passes == [True, False, True, False] * 6  # deferred ones came back without the option


def _map(verifier: Verifier, chunks: list[list[str]], workers: int, depth: int) -> list:
    """GradingPool.map over chunks of completions; the (job, statuses) of each `done` call."""
    from flows.score import Samples

    calls: list = []
    pool = GradingPool(workers, depth=depth)
    try:
        grade_rows = [
            (s := Samples.from_dicts(_rows(c, target="defer"))).rows_at(range(len(s)))
            for c in chunks
        ]
        pool.map(
            verifier.grade,
            grade_rows,
            30.0,
            lambda job, res: calls.append((job, [r[0] for r in res])),
            may_defer=True,
        )
    finally:
        pool.close()
    return calls


def test_a_chunk_that_deferred_rows_is_delivered_once_and_before_the_queued_chunks(
    verifier,
) -> None:
    # one worker taking one chunk at a time: chunk 0's deferred rows are graded next, so the
    # stage does not end with the expensive deferred samples piled up at the back
    calls = _map(verifier, [["defer", "42"], ["42", "41"], ["defer"], ["41"]], 1, 1)
    assert calls == [(0, ["scored"] * 2), (1, ["scored"] * 2), (2, ["scored"]), (3, ["scored"])]


def test_a_worker_dying_on_deferred_rows_leaves_just_those_unscored(verifier) -> None:
    calls = _map(verifier, [["defer-die", "42"], ["42"]], 1, 1)
    assert calls == [(0, ["unscored", "scored"]), (1, ["scored"])]


def test_a_verifier_that_defers_when_it_may_not_leaves_the_sample_unscored(verifier) -> None:
    results = _grade(verifier, _rows(["always defer", "42"]))
    assert [(r[0], r[4]) for r in results] == [("unscored", "verifier_error"), ("scored", "cmp")]
    assert "deferred" in results[0][3]


def test_result_metadata_keeps_each_values_json_type_across_samples() -> None:
    # 1, 1.0 and True are equal (and hash alike) but are different JSON: a worker that
    # re-used the encoding of an equal-looking earlier sample would store the wrong one
    from scorers.grade import scored
    from scorers.workers.pool import grade_chunk

    values = [1, 1.0, True, 1, "1", None, [1], 1.0]

    def grade(view):
        return scored(1.0, answer=None, explanation="", reason="r", x=values[int(view.sample_id)])

    rows = [("c", ["t"], "{}", str(i), None) for i in range(len(values))]
    stored = [r[5] for r in grade_chunk(grade, rows, 0.0) + grade_chunk(grade, rows, 0.0)]
    want = ['{"x": 1}', '{"x": 1.0}', '{"x": true}', '{"x": 1}', '{"x": "1"}', '{"x": null}',
            '{"x": [1]}', '{"x": 1.0}']  # fmt: skip
    assert stored == want * 2


def test_a_chunks_rows_are_built_without_pyarrow_importing_pandas() -> None:
    # pyarrow imports pandas on its first conversion of a Python list (0.2-0.3 s of CPU): the
    # rows of the stage's first chunk must not wait for it
    code = """
import sys, duckdb
from flows.score import Samples
table = duckdb.sql(
    "SELECT 'r' AS run_id, i::VARCHAR AS sample_id, 1 AS epoch, 'ANSWER: ' || i AS completion,"
    " [i::VARCHAR] AS target, '{}' AS metadata, NULL::VARCHAR AS error FROM range(1000) t(i)"
).fetch_arrow_table()
samples = Samples(table)
assert samples.rows_at([999, 0])[0][:2] == ("ANSWER: 999", ["999"])
assert samples.keys([999, 0]).column("sample_id").to_pylist() == ["999", "0"]
print("pandas" in sys.modules)
"""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_workers_started_before_their_verifier_was_known_import_its_module(tmp_path: Path) -> None:
    """An early pool (started while the command resolved its verifiers, with only the command
    line's preload) had workers that never imported an Inspect scorer's module: the scorer's
    factory was missing from their registry and every sample was `verifier_error` ("unknown
    verifier 'math_verifier'"), as `benchmarks/agentic_rescore.py --samples 12` showed."""
    import inspect_scorer_kit as kit
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    from scorers.identity.fingerprint import fingerprint
    from scorers.inspect_scorers.specs import resolve
    from warehouse import Warehouse
    from warehouse.score_batches import Samples

    answers = ["The answer is \\boxed{0.5}", "so 8", "\\boxed{12}", "\\boxed{4/6}"]
    task = Task(
        dataset=MemoryDataset([Sample(input=f"Q{i}", target=t, id=i)
                               for i, t in enumerate(["1/2", "7", "12", "2/3"], 1)]),
        solver=generate(), scorer=match(), name="math_local",
    )  # fmt: skip
    _, plain = kit.twice(task, answers, tmp_path / "logs")
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.ingest_logs([plain.location])
    verifier = resolve("math_verifier", trusted=True)
    assert verifier.module == "scorers.math.scorer"
    digest = fingerprint(verifier).digest
    samples = Samples(wh.samples_to_score(verifier.name, digest, state=True))
    pool = GradingPool(2)
    try:
        pool.start([])  # started as interpreters, before the verifier was resolved
        got = grade_batch(
            pool, verifier, samples, ScoreOptions(workers=2, chunk_size=2), in_process=False,
            expect=digest,  # as the stage grades: the code the workers must have run
        )  # fmt: skip
    finally:
        pool.close()
    assert [(g[0], g[1]) for g in got] == [("scored", 1.0), ("scored", 0.0)] + [
        ("scored", 1.0)
    ] * 2, got[:1]
