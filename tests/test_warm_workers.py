"""Judge-scorer grading workers forked from one warm process (scorers.workers.pool `fork_from`).

The stage boots one zygote that imports Inspect, runs its start-up hooks and builds the judge
once, and forks its grading workers from it. Those workers must grade as started ones do,
vouch for the same code (the fingerprint as loaded), and die with the stage.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import inspect_scorer_kit as kit
import pytest

from sweeps.mock_server import scripted_server

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = {i: (i, i + 1) for i in range(1, 9)}  # i: what is a plus b?
ANSWERS = {i: str(a + b + (1 if i % 4 == 0 else 0)) for i, (a, b) in QUESTIONS.items()}


@pytest.fixture(autouse=True)
def _own_registry():
    path = list(sys.path)
    yield from kit.isolated_registry()
    sys.path[:] = path


def _judge(model: str, messages: list[dict]) -> str:
    """GRADE: C when the submission is the criterion (model_graded_qa's prompt)."""
    prompt = "\n".join(str(m.get("content")) for m in messages)
    sub = re.search(r"\[Submission\]: (\S+)", prompt)
    crit = re.search(r"\[Criterion\]: (\S+)", prompt)
    same = sub and crit and sub.group(1) == crit.group(1)
    return "GRADE: C" if same else "GRADE: I"


def _spec(url: str) -> dict:
    return {
        "kind": "registry", "scorer": "model_graded_qa", "params": {},
        "roles": {"grader": {"model": "openai-api/judge/j", "base_url": url, "args": {},
                             "config": {"max_connections": 8, "max_retries": 1}}},
    }  # fmt: skip


def _rows() -> list[tuple]:
    return [
        (ANSWERS[i], [str(a + b)], "{}", str(i),
         json.dumps({"messages": [], "input": f"Q{i}: what is {a} plus {b}?",
                     "model": "openai-api/gen/m", "epoch": 1}))
        for i, (a, b) in QUESTIONS.items()
    ]  # fmt: skip


def _stage_argv(script: str, judge_url: str, rows: list[tuple]) -> list[str]:
    """A stage script's command line: the judge scorer's spec bound to `judge_url`, and rows."""
    return [sys.executable, "-c", script.format(root=str(ROOT)),
            json.dumps(_spec(judge_url)), json.dumps(rows)]  # fmt: skip


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Running (a zombie, or a pid that no longer exists, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# The stage, as a process of its own: starts the pool for the judge scorer as `gradebook score`
# does, grades two chunks, prints what it graded and the processes it runs, then waits.
_STAGE = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    from scorers.workers.pool import GradingPool
    from scorers.workers.stage import start_for as _start_for
    from scorers.identity.fingerprint import fingerprint
    from scorers.inspect_scorers.factories import ScorerSpec
    from scorers.inspect_scorers.specs import resolve

    verifier = resolve(ScorerSpec.from_json(json.loads(sys.argv[1])), trusted=True)
    rows = json.loads(sys.argv[2])
    pool = GradingPool(2)
    _start_for(pool, [verifier])
    expect = fingerprint(verifier).digest
    results = {{}}
    stale = pool.map(
        verifier.grade.for_processes(2), [rows[::2], rows[1::2]], 60.0,
        results.__setitem__, verifier=verifier, expect=expect,
    )
    zygote = pool._warm_zygote.proc.pid if pool._warm_zygote else None
    print(json.dumps({{"stale": stale, "results": results, "workers": pool.pids(),
                      "zygote": zygote}}), flush=True)
    time.sleep(600)
    """
)


def test_judge_workers_fork_from_one_warm_process_grade_and_die_with_the_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JUDGE_API_KEY", "test")
    rows = _rows()
    with scripted_server(_judge, models=["j"]) as server:
        stage = subprocess.Popen(
            _stage_argv(_STAGE, server.base_url, rows), stdout=subprocess.PIPE, text=True
        )
        try:
            line = stage.stdout.readline()  # type: ignore[union-attr]
            assert line, f"the stage exited ({stage.wait()}) before grading"
            out = json.loads(line)
            # graded, by the code the files hold (no chunk was stale), with the evidence kept
            assert out["stale"] == []
            for chunk, part in enumerate((rows[::2], rows[1::2])):
                for row, (status, value, *_rest, meta, _) in zip(
                    part, out["results"][str(chunk)], strict=True
                ):
                    assert status == "scored"
                    assert value == (0.0 if int(row[3]) % 4 == 0 else 1.0), row
                    (call,) = json.loads(meta)["judge"]
                    assert call["reply"].startswith("GRADE:")
            # both workers are children of one warm process, not of the stage
            workers, zygote = out["workers"], out["zygote"]
            assert zygote is not None and len(workers) == 2
            assert {_ppid(pid) for pid in workers} == {zygote}
            assert _ppid(zygote) == stage.pid
        finally:
            stage.send_signal(signal.SIGKILL)
            stage.wait()
    # the stage killed: the warm process and every worker forked from it are gone
    deadline = time.monotonic() + 60
    left = [pid for pid in (zygote, *workers) if _alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if _alive(pid)]
    assert not left, f"processes outlived their stage: {left}"


# A small log's stage, as `gradebook score` runs it: the start-up decision, then grade_batch.
_SMALL_STAGE = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    from scorers.workers.pool import GradingPool
    from flows.score import ScoreOptions, grade_batch
    from scorers.workers.stage import start_for as _start_for
    from flows.score_start import starts_early
    from scorers.workers.prewarm import warm_preload
    from scorers.identity.fingerprint import fingerprint
    from scorers.inspect_scorers.factories import ScorerSpec
    from scorers.inspect_scorers.specs import resolve

    verifier = resolve(ScorerSpec.from_json(json.loads(sys.argv[1])), trusted=True)
    rows = [dict(zip(("completion", "target", "metadata", "sample_id", "state"), r),
                 run_id="r", epoch=1, error=None) for r in json.loads(sys.argv[2])]
    opts = ScoreOptions(workers=2)
    pool = GradingPool(2)
    early = starts_early([], warm_preload([verifier]), opts.chunk_size)
    if early:
        _start_for(pool, [verifier])
    graded = grade_batch(pool, verifier, rows, opts, expect=fingerprint(verifier).digest)
    from inspect_ai.hooks import _startup
    zygote = pool._warm_zygote.proc.pid if pool._warm_zygote else None
    print(json.dumps({{"early": early, "graded": graded, "zygote": zygote,
                      "hooks_here": _startup._registry_hooks_loaded,
                      "judge_sdk_here": "openai" in sys.modules}}), flush=True)
    pool.close()
    """
)


def test_a_small_judge_log_is_graded_by_a_worker_forked_from_the_warm_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One chunk of a judge scorer is not graded in the stage's own process: that would run
    Inspect's start-up hooks and build the judge there, after Prefect's start and the ingest,
    while the warm process booted at the command's start has done both beside them."""
    from flows.score_start import starts_early
    from scorers.registry import get_verifier
    from scorers.workers.prewarm import warm_preload

    monkeypatch.setenv("JUDGE_API_KEY", "test")
    rows = _rows()
    with scripted_server(_judge, models=["j"]) as server:
        stage = subprocess.run(
            _stage_argv(_SMALL_STAGE, server.base_url, rows),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert stage.returncode == 0, stage.stderr[-3000:]
    out = json.loads(stage.stdout.splitlines()[-1])
    assert out["early"] is True
    assert [tuple(r[:2]) for r in out["graded"]] == [
        ("scored", 0.0 if int(row[3]) % 4 == 0 else 1.0) for row in rows
    ]
    # graded by a worker forked from the warm process: the stage never started Inspect's
    # hooks nor imported the judge's SDK itself
    assert out["zygote"] is not None
    assert (out["hooks_here"], out["judge_sdk_here"]) == (False, False)
    # a math log of the same size needs no warm process: its one chunk is graded in place
    assert warm_preload([get_verifier("math")]) == []
    assert not starts_early([], [], 250)


def test_a_warm_process_that_runs_threads_is_not_forked_from(tmp_path: Path) -> None:
    """A preload that starts a thread in the zygote: the pool starts its workers instead of
    forking them from a threaded process, and they still grade."""
    from scorers.workers.pool import GradingPool

    (tmp_path / "threaded_preload.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    sys.path.insert(0, str(tmp_path))
    pool = GradingPool(1)
    try:
        pool.start(["scorers.workers.pool"], fork_from=["threaded_preload"])
        results: dict = {}
        pool.map(_pid_grade, [[("a", ["a"], "{}", "1")]], 10.0, results.__setitem__)
        ((status, value, *_),) = results[0]
        assert (status, value) == ("scored", 1.0), results
        (pid,) = pool.pids()
        assert _ppid(pid) == os.getpid()  # started by the pool, not forked by the zygote
    finally:
        pool.close()


def _pid_grade(view):  # module-level: picklable
    from scorers.grade import scored

    return scored(
        float(view.completion == view.target[0]),
        answer=view.completion,
        explanation="",
        reason="cmp",
    )


def test_a_pool_adopts_the_warm_process_booted_before_it(tmp_path: Path) -> None:
    """`prewarm` (what `gradebook score` calls before Prefect loads) boots the warm process;
    the stage's pool started later with the same preload forks its workers from that one
    instead of booting another."""
    from scorers.workers import pool as grading_pool
    from scorers.workers.pool import GradingPool, prewarm

    (tmp_path / "warm_probe.py").write_text("import json\nBOOTED = []\n")
    sys.path.insert(0, str(tmp_path))
    preload = ["warm_probe"]
    prewarm(preload)
    broker = grading_pool._PREWARMED[tuple(preload)]
    pool = GradingPool(2)
    try:
        pool.start(["scorers.workers.pool"], fork_from=preload)
        results: dict = {}
        pool.map(_pid_grade, [[("a", ["a"], "{}", "1")], [("b", ["c"], "{}", "2")]], 10.0,
                 results.__setitem__)  # fmt: skip
        assert [r[0][:2] for _, r in sorted(results.items())] == [("scored", 1.0), ("scored", 0.0)]
        assert pool._broker is broker and tuple(preload) not in grading_pool._PREWARMED
        zygote = pool._warm_zygote
        assert zygote is not None
        assert {_ppid(pid) for pid in pool.pids()} == {zygote.proc.pid}
    finally:
        pool.close()
    deadline = time.monotonic() + 30
    while _alive(zygote.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(zygote.proc.pid), "the warm process outlived its pool"


def test_a_warm_process_booted_from_the_command_line_serves_the_resolved_stage(
    tmp_path: Path,
) -> None:
    """`gradebook score` boots the warm process from its `--verifier-module` specs alone, before
    it resolves them; the stage's fuller preload (the scorer's own module added) adopts that
    process instead of booting a second one, and a boot whose warm-ups the stage does not ask
    for (another judge) is closed, not left taking CPU."""
    from scorers.workers import pool as grading_pool
    from scorers.workers.pool import GradingPool, covers, prewarm
    from scorers.workers.prewarm import early_preload

    spec = _spec("http://127.0.0.1:9/v1")
    early = early_preload([json.dumps(spec), "scorers.math"])
    judge = ("scorers.workers.prewarm", "warm_judges", (json.dumps(spec["roles"], sort_keys=True),))
    # Inspect's start-up hooks with only the entry points model_graded_qa needs, then the judge
    hooks = ("scorers.workers.prewarm", "start_inspect", ('["model_graded_qa"]',))
    assert early == ["inspect_ai.scorer", "scorers.inspect_scorers.judges", hooks, judge]
    assert early_preload(["scorers.math", "my_verifiers"]) == []  # no Inspect scorer: no boot
    assert covers(early, ["inspect_ai.scorer._model", *early])
    other = ("scorers.workers.prewarm", "warm_judges", ('{"grader": {"model": "other"}}',))
    assert not covers(early, ["inspect_ai.scorer", other])  # another judge's warm-up

    (tmp_path / "warm_probe.py").write_text("BOOTED = []\n")
    sys.path.insert(0, str(tmp_path))
    first = ["warm_probe"]
    prewarm(first)
    broker = grading_pool._PREWARMED[tuple(first)]
    fuller = ["warm_probe", "json"]
    prewarm(fuller)  # the CLI again, once the verifiers are resolved: the first boot serves
    assert list(grading_pool._PREWARMED) == [tuple(first)]
    pool = GradingPool(2)
    try:
        pool.start(["scorers.workers.pool"], fork_from=fuller)
        results: dict = {}
        pool.map(_pid_grade, [[("a", ["a"], "{}", "1")], [("b", ["c"], "{}", "2")]], 10.0,
                 results.__setitem__)  # fmt: skip
        assert [r[0][:2] for _, r in sorted(results.items())] == [("scored", 1.0), ("scored", 0.0)]
        assert pool._broker is broker and not grading_pool._PREWARMED
        zygote = pool._warm_zygote
        assert zygote is not None
        assert {_ppid(pid) for pid in pool.pids()} == {zygote.proc.pid}
    finally:
        pool.close()

    prewarm(["warm_probe", other])
    stray = grading_pool._PREWARMED[("warm_probe", other)]
    second = GradingPool(1)
    try:
        second.start(["scorers.workers.pool"], fork_from=["warm_probe"])
        assert second._broker is not stray and not grading_pool._PREWARMED
        assert stray._closed
    finally:
        second.close()


def test_the_early_boot_decision_reads_a_log_header_without_importing_inspect(
    shared_data: Path,
) -> None:
    """Whether to boot the warm process is decided from the logs' headers before Inspect is
    imported (importing it first would delay the boot by seconds)."""
    log = shared_data / "logs" / "log_formats.eval"
    code = (
        "import sys; from flows.score_start import expected_samples; "
        f"n = expected_samples([{str(log)!r}]); "
        "print(n, 'inspect_ai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    from warehouse.logs import read_header

    header = read_header(str(log), fast=False).eval
    assert out == [str((header.dataset.samples or 0) * (header.config.epochs or 1)), "False"]
