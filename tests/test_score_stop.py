"""Ctrl-C or SIGTERM in the middle of a big `score` or `rescore` keeps what was graded.

A real `gradebook` process grades a 20,000-sample log; once a good share is graded (counted from
outside the stage: the test verifier appends a byte per sample to a trace file), it is stopped
the way a terminal (SIGINT to the group) or `timeout`/systemd (SIGTERM to the process) would.
It must exit within a bounded time with 130 / 143, say how many results it kept, hold at least
every result graded before the signal, end its Prefect flow run Cancelled, and leave exactly
the rest to the next command. A second signal while the last write waits exits at once, and
what is in the warehouse then is whole (no partial batch).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from process_kit import (
    MARK,
    STOP_LINE,
    Lines,
    cli_env,
    flow_run_states,
    gradebook,
    make_log,
    marked,
    score_counts,
    start_gradebook,
    wait_for,
    write_verifier,
)
from warehouse_logs import reader_holding, repeated_epochs

pytestmark = pytest.mark.slow

TEMPLATE, EPOCHS = 200, 100
N = TEMPLATE * EPOCHS  # samples in the big log
SHARE = 0.3  # the stop comes once this share is graded
DELAY_S = 0.001  # per sample: the stage takes several seconds on two workers
EXIT_WITHIN_S = 120  # a bounded stop (generous: a loaded 2-core machine)


@pytest.fixture(scope="module")
def big_log(pytestconfig, tmp_path_factory) -> Path:
    """A 20,000-sample arith log whose samples record the verifier `traced` (answers all
    right), cached across sessions in pytest's cache directory: written once per checkout
    and Inspect version (~2 minutes here), then reused."""
    import inspect_ai

    name = f"arith_{TEMPLATE}x{EPOCHS}_traced_inspect-{inspect_ai.__version__}.eval"
    try:
        cache = Path(pytestconfig.cache.mkdir("gradebook-big-logs"))
    except AttributeError:  # the cache plugin is off (-p no:cacheprovider)
        cache = tmp_path_factory.mktemp("big-logs")
    path = cache / name
    if not path.exists():
        template = make_log(tmp_path_factory.mktemp("template"), TEMPLATE, verifiers=["traced"])
        repeated_epochs(template, EPOCHS, path, events=False)
    return path


def _graded(trace: Path) -> int:
    return trace.stat().st_size if trace.exists() else 0


def _send(proc, sig: int) -> None:
    # SIGINT as a terminal sends it (to the whole group); SIGTERM as `timeout` does (the process)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)


def _stop_line(err: str, sig: int) -> re.Match:
    again = "Ctrl-C again" if sig == signal.SIGINT else "again"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    found = [
        m for ln in lines if (m := re.fullmatch(STOP_LINE.format(sig=sig.name, again=again), ln))
    ]
    assert len(found) == 1 and len(lines) == 1, err
    return found[0]


def _count(match: re.Match, group: str) -> int:
    return int(match[group].replace(",", ""))


def _start(tmp_path: Path, api_url: str, *args: str):
    write_verifier(tmp_path, "traced", delay_s=DELAY_S)
    trace = tmp_path / "graded"
    env = cli_env(tmp_path, api_url=api_url, GRADEBOOK_TEST_TRACE=str(trace))
    proc = start_gradebook(*args, env=env, preload=("traced",))
    return proc, env, trace


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_score_writes_what_it_graded_and_the_next_grades_exactly_the_rest(
    prefect_api, tmp_path, big_log, sig
):
    """The first case takes up to 60 s where the 20,000-sample log is not cached yet (it is
    written then, ~30 s); each grades the log twice, stopped once."""
    db = tmp_path / "w.duckdb"
    args = ("score", str(big_log), "--db", str(db), "--workers", "2")
    proc, env, trace = _start(tmp_path, prefect_api, *args)
    try:
        wait_for(lambda: _graded(trace) >= SHARE * N, 600, f"{SHARE:.0%} of the log graded")
        graded_before = _graded(trace)
        _send(proc, sig)
        out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err, err
    assert graded_before < N, "the stage was stopped before it finished"
    rows, samples = score_counts(db, "traced")
    # every result graded before the signal is in, once
    assert rows == samples >= graded_before, f"{rows} written, {graded_before} graded before"
    assert flow_run_states(prefect_api, "score", tmp_path) == ["CANCELLED"]
    # and the terminal said how many
    kept = _count(_stop_line(err, sig), "all")
    assert rows == kept
    assert f"wrote {kept:,} results in all; {N - kept:,} samples left for the next " in out
    wait_for(lambda: marked(env[MARK]) == [], 30, "the workers and zygotes to exit")

    again = gradebook(*args, env=env, preload=("traced",))

    assert again.returncode == 0, again.stderr
    assert score_counts(db, "traced") == (N, N)  # none lost, none doubled
    assert f"│ {N - kept} " in again.stdout, again.stdout  # it graded only the rest


def test_a_second_ctrl_c_while_the_last_write_waits_exits_at_once_and_keeps_the_file_whole(
    prefect_api, tmp_path, big_log
):
    db = tmp_path / "w.duckdb"
    args = ("score", str(big_log), "--db", str(db), "--workers", "2", "--lock-timeout", "120")
    proc, env, trace = _start(tmp_path, prefect_api, *args)
    err = Lines(proc.stderr)
    try:
        wait_for(lambda: _graded(trace) >= SHARE * N, 600, f"{SHARE:.0%} of the log graded")
        # a reader holds the file: the stop's last write waits for it
        with reader_holding(db, seconds=120):
            written_before, _ = score_counts(db, "traced")
            os.killpg(proc.pid, signal.SIGINT)
            said = wait_for(
                lambda: [ln for ln in err.lines if "stopping: writing" in ln], 60, "the stop"
            )
            stop = _stop_line(said[0], signal.SIGINT)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=EXIT_WITHIN_S)
            after_exit = score_counts(db, "traced")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert "gradebook: SIGINT again: exiting now" in err.text()
    assert "Traceback" not in err.text(), err.text()
    assert _count(stop, "writing") > 0  # there was a batch in hand, and it is not in
    assert after_exit == (written_before, written_before)
    wait_for(lambda: marked(env[MARK]) == [], 30, "the workers and zygotes to exit")

    again = gradebook(*args, env=env, preload=("traced",))

    assert again.returncode == 0, again.stderr
    assert score_counts(db, "traced") == (N, N)


def test_a_stopped_rescore_writes_what_it_graded_and_the_next_rescores_the_rest(
    prefect_api, tmp_path, big_log
):
    db = tmp_path / "w.duckdb"
    write_verifier(tmp_path, "traced", delay_s=0.0)
    env = cli_env(tmp_path, api_url=prefect_api)
    scored = gradebook("score", str(big_log), "--db", str(db), env=env, preload=("traced",))
    assert scored.returncode == 0, scored.stderr
    # the verifier changes (its fingerprint with it): every sample is graded again
    proc, env, trace = _start(tmp_path, prefect_api, "rescore", "--db", str(db), "--workers", "2")
    try:
        wait_for(lambda: _graded(trace) >= SHARE * N, 600, f"{SHARE:.0%} re-graded")
        graded_before = _graded(trace)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    rows, _ = score_counts(db, "traced")
    assert rows - N >= graded_before, f"{rows - N} re-scored, {graded_before} graded before"
    assert flow_run_states(prefect_api, "rescore", tmp_path) == ["CANCELLED"]
    kept = _count(_stop_line(err, signal.SIGINT), "all")
    assert rows - N == kept
    assert f"wrote {kept:,} results in all; {N - kept:,} samples left for the next " in out

    again = gradebook("rescore", "--db", str(db), env=env, preload=("traced",))

    assert again.returncode == 0, again.stderr
    assert score_counts(db, "traced") == (2 * N, N)  # each sample once per fingerprint
