"""A score row's fingerprint is the fingerprint of the exact code that produced it.

A verifier module imported before an edit keeps running its old code while its file already
holds the new one. Each test injects the edit between the import (by the process that grades)
and the fingerprint (which the stage reads from the files), deterministically, and asserts that
no verdict of the old code is stored under the new fingerprint. Real Inspect logs, real Prefect
flow runs, real worker processes, a real DuckDB file.
"""

from __future__ import annotations

import functools
import importlib
import sys
import textwrap
import time
import uuid
from pathlib import Path

import flows_kit
import pytest
from gate_world import run_eval

from flows.score import ScoreOptions, score_flow, score_runs, start_early
from flows.sweep import sweep_flow
from gates.evaluate import current_fingerprints
from scorers import registry
from scorers.identity.fingerprint import fingerprint
from scorers.registry import get_verifier
from sweeps.config import parse_config
from warehouse import Warehouse


def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _rows(db: Path, scorer: str) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute(
            "SELECT fingerprint, value, explanation FROM scores WHERE scorer = ? ORDER BY sample_id",
            [scorer],
        ).fetchall()


@pytest.fixture
def exact(tmp_path, monkeypatch):
    """A fresh test verifier (flows_kit's exact_check), imported by this process; its module
    file, and the directory where each process importing it leaves a mark."""
    name = f"exact_{uuid.uuid4().hex[:8]}"
    marks = tmp_path / "marks"
    marks.mkdir()
    path = flows_kit.write_verifier(tmp_path, name, name, marks=marks)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    return name, path, marks


@pytest.mark.slow
def test_an_edit_after_this_process_imported_the_verifier_is_what_grades(
    prefect_api, tmp_path, exact
):
    # The reported race: the watcher's flow run had imported the verifier when it was edited;
    # its one chunk was graded in the flow's own process, by the old code, and stored under
    # the new fingerprint.
    name, path, _ = exact
    log = run_eval(tmp_path / "logs", [str(i) for i in range(6)])  # all right under OFFSET = 0
    _edit(path, "OFFSET = 0", "OFFSET = 1")  # imported already; now every answer is off by one
    db = tmp_path / "gb.duckdb"
    score_flow([str(log)], str(db), verifiers=[name], workers=1, progress=False)

    new = current_fingerprints([name])[name]
    rows = _rows(db, name)
    assert len(rows) == 6
    assert {fp for fp, _, _ in rows} == {new}
    # the verdicts are the new code's: want i + 1 (the old code said "equal" for all of them)
    assert [(v, e) for _, v, e in rows] == [
        (0.0, f"mismatch: got {i}, want {i + 1}") for i in range(6)
    ]


@pytest.mark.slow
def test_the_sweeps_early_workers_never_store_old_code_under_the_new_fingerprint(
    prefect_api, tmp_path, exact, monkeypatch
):
    # The sweep starts its grading workers before generating; they import the verifier then.
    # The edit lands after they imported it and after the sweep's own check, just before the
    # score step fingerprints the files.
    import flows.sweep as sweep_module

    name, path, marks = exact
    workers = 2
    real = sweep_module.current_fingerprints
    edited: list[bool] = []

    def edit_after_the_workers_imported(names):
        result = real(names)
        if not edited and len(list(marks.iterdir())) > workers:  # this process + the workers
            _edit(path, "OFFSET = 0", "OFFSET = 1")
            edited.append(True)
        return result

    monkeypatch.setattr(sweep_module, "current_fingerprints", edit_after_the_workers_imported)
    # the pool starts early only for more than two chunks: chunks of 2 make 6 samples enough
    small_chunks = functools.partial(sweep_module.ScoreOptions, chunk_size=2)
    monkeypatch.setattr(sweep_module, "ScoreOptions", small_chunks)
    answer = flows_kit.mock_outputs(set())

    def answer_once_the_workers_imported(*args):
        _wait_for(lambda: len(list(marks.iterdir())) > workers, "the early workers' imports")
        return answer(*args)

    raw = {
        "name": "early",
        "log_dir": "logs",
        "warehouse": "gb.duckdb",
        "models": [
            {
                "name": "m",
                "model": "mockllm/model",
                "args": {"custom_outputs": answer_once_the_workers_imported},
            }
        ],
        "tasks": [{"task": flows_kit.TASK_SPEC, "args": {"n": 6}, "verifiers": [name]}],
        "gates": {"max_regression": None},
    }
    cfg = parse_config(raw, source=tmp_path / "sweep.toml")
    result = sweep_flow(cfg, workers=workers, progress=False, gate=False)

    assert edited, "the edit was never injected"
    new = current_fingerprints([name])[name]
    rows = _rows(cfg.warehouse, name)
    assert len(rows) == 6 and {fp for fp, _, _ in rows} == {new}
    assert {v for _, v, _ in rows} == {0.0}  # the new code: every right answer is off by one
    (row,) = result.rows
    assert (row.scored, row.correct) == (6, 0)


HELPER = textwrap.dedent(
    """
    import os

    MARKS = {marks!r}
    open(os.path.join(MARKS, str(os.getpid())), "w").close()


    def judge(answer, want):
        return answer == want
    """
)

VERIFIER = textwrap.dedent(
    """
    from scorers.workers.bounded import shared_pool
    from scorers.grade import scored
    from scorers.registry import Verifier, register

    HELPERS = ({helper!r},)


    def grade(view):
        answer = view.completion.split()[-1]
        ok = shared_pool(HELPERS).call({helper!r} + ":judge", answer, view.targets[0], timeout_s=60)
        return scored(1.0 if ok else 0.0, answer=answer, explanation=f"judged {{ok}}",
                      reason="judged")


    register(Verifier({name!r}, grade, module={name!r}, label="test: judged in a helper",
                      helpers=(HELPERS,)))
    """
)


@pytest.mark.slow
def test_code_run_by_a_helper_process_counts_in_the_fingerprint(
    prefect_api, tmp_path, monkeypatch, request
):
    # A verifier whose comparisons run in a helper zygote (as math's sympy comparisons do): the
    # helper module is part of its fingerprint, and a helper booted before an edit of that
    # module never grades under the new fingerprint.
    name = f"judged_{uuid.uuid4().hex[:8]}"
    helper = f"{name}_helper"
    marks = tmp_path / "marks"
    marks.mkdir()
    helper_path = tmp_path / f"{helper}.py"
    helper_path.write_text(HELPER.format(marks=str(marks)))
    (tmp_path / f"{name}.py").write_text(VERIFIER.format(name=name, helper=helper))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    verifier = get_verifier(name)
    # unregistered afterwards: its helper module is importable only while tmp_path is on
    # sys.path, and other tests fingerprint every registered verifier
    request.addfinalizer(lambda: registry._VERIFIERS.pop(name, None))

    before = fingerprint(verifier).digest
    assert f"# ---- module {helper}" in fingerprint(verifier).source

    wh = Warehouse(tmp_path / "gb.duckdb")
    log = run_eval(tmp_path / "logs", [str(i) for i in range(8)])
    [ingested] = wh.ingest_logs([log])
    opts = ScoreOptions(workers=2, chunk_size=2, progress=False)
    pool = start_early([name], opts)  # boots the shared helper zygote, which imports the helper
    try:
        _wait_for(lambda: any(marks.iterdir()), "the helper zygote's import")
        _edit(helper_path, "return answer == want", "return answer == str(int(want) + 1)")
        after = fingerprint(verifier).digest
        assert after != before  # the helper's code is the verifier's code
        summaries = score_runs(wh.path, {ingested.run_id: [name]}, opts, pool)
    finally:
        pool.close()

    rows = _rows(wh.path, name)
    assert len(rows) == 8 and {fp for fp, _, _ in rows} == {after}
    assert {v for _, v, _ in rows} == {0.0}  # judged by the edited helper: all off by one
    assert sum(s.written for s in summaries) == 8 and not any(s.stale for s in summaries)


def test_the_fingerprint_as_loaded_is_of_the_bytes_this_process_compiled(tmp_path, monkeypatch):
    from scorers.identity.fingerprint import fingerprint_as_loaded

    name = f"exact_{uuid.uuid4().hex[:8]}"
    path = flows_kit.write_verifier(tmp_path, name, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    verifier = get_verifier(name)
    loaded = fingerprint_as_loaded(verifier)
    assert loaded is not None and loaded == fingerprint(verifier)

    _edit(path, "OFFSET = 0", "OFFSET = 1")
    assert fingerprint(verifier).digest != loaded.digest  # the file moved on...
    assert fingerprint_as_loaded(verifier) == loaded  # ...the code that runs here did not
    assert "OFFSET = 0" in loaded.source and "OFFSET = 1" in fingerprint(verifier).source

    _edit(path, "OFFSET = 1", "OFFSET = 0")  # reverted: the two agree again
    assert fingerprint(verifier) == loaded


def test_a_module_imported_before_recording_began_cannot_be_vouched_for(tmp_path, monkeypatch):
    from scorers.identity import loaded_code
    from scorers.identity.fingerprint import fingerprint_as_loaded

    name = f"exact_{uuid.uuid4().hex[:8]}"
    flows_kit.write_verifier(tmp_path, name, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    # loaded by the plain path finder, as happens to whatever a process imports before the
    # recording is installed
    spec = importlib.machinery.PathFinder.find_spec(name, [str(tmp_path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        assert loaded_code.recorded_source(module) is None
        verifier = get_verifier(name)
        assert fingerprint_as_loaded(verifier) is None
        assert fingerprint(verifier).digest  # the files can still be fingerprinted
    finally:
        del sys.modules[name]
        registry._VERIFIERS.pop(name, None)
