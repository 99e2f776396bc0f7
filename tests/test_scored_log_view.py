"""Scored copies in `inspect view`: the log list shows gradebook's verifier as the headline.

A log generated with `score=False` still names its task's scorer; in a scored copy that scorer
never ran, and when it came first in `results.scores` the log list showed NaN for every copy.
This drives the real `inspect view` server in headless Chromium and reads what it draws.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import browser_kit
import inspect_scorer_kit as kit
import pytest
from conftest import need

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _own_registry():
    yield from kit.isolated_registry()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(log_dir: Path, port: int, log: Path) -> subprocess.Popen:
    inspect = Path(sys.executable).parent / "inspect"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(inspect), "view", "start", "--log-dir", str(log_dir), "--host", "127.0.0.1",
             "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inspect view exited: {log.read_text()[-500:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2):
                return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"inspect view did not answer: {log.read_text()[-500:]}")


def test_the_log_list_shows_the_verifiers_score_not_the_unrun_task_scorer(
    prefect_api, tmp_path: Path
) -> None:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.log import read_eval_log
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    from flows.score import score_flow

    need(browser_kit.chromium() is not None, "chromium not installed: `make services`")
    # the task names match() as its scorer; generation never runs it (score=False)
    task = Task(
        dataset=MemoryDataset([Sample(id=i, input=f"Q{i}?", target=str(i)) for i in (1, 2, 3, 4)]),
        solver=generate(),
        scorer=match(),
        name="headline",
    )
    logs = []
    for answers in (["1", "2", "x", "4"], ["1", "x", "x", "4"]):
        [log] = inspect_eval(task, model=kit.scripted(answers), log_dir=str(tmp_path / "logs"),
                             score=False, display="none")  # fmt: skip
        logs.append(log.location)
    scored = tmp_path / "scored"
    score_flow(logs, str(tmp_path / "w.duckdb"), verifiers=["includes"], progress=False,
               scored_log_dir=str(scored))  # fmt: skip

    port = _free_port()
    server = _serve(scored, port, tmp_path / "view.log")
    try:
        with browser_kit.browser(tmp_path / "profile") as open_page:
            page = open_page(f"http://127.0.0.1:{port}/")
            text = page.wait_for(
                lambda t: t.count("headline") >= 2 and "Syncing" not in t and "Loading" not in t
                and "0.75" in t and "0.5" in t,
                timeout_s=120,
            )  # fmt: skip
            shot = page.screenshot(tmp_path / "log-list.png")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert "SCORE" in text.upper(), text
    # both copies list gradebook's accuracy (3 of 4, 2 of 4), and no NaN anywhere
    assert "0.75" in text and "0.5" in text, text
    assert "NaN" not in text and "nan" not in text.split(), text
    assert shot.stat().st_size > 10_000
    # what the list draws comes from each copy's first results.scores entry
    headers = [read_eval_log(str(p), header_only=True) for p in sorted(scored.glob("*.eval"))]
    assert [h.results.scores[0].name for h in headers] == ["includes", "includes"]
    assert all("match" not in {s.name for s in h.results.scores} for h in headers)
