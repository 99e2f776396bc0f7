"""Zip bombs: a `.eval` from elsewhere cannot make ingest inflate gigabytes (issue 29, item 4).

Real logs (a mockllm `eval()` run, and a real log of an older Inspect version read through
Inspect's own reader) with one member replaced by a highly compressible huge one: JSON with
1.5 GB of whitespace in it, as Zstandard (what Inspect writes) and as deflate (what older
Inspect versions wrote), its directory entry honest or lying about its size. `gradebook
ingest` runs as a real subprocess whose own peak RSS is measured (os.wait4), never a time.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import zstandard
from inspect_ai.log import read_eval_log
from warehouse_logs import bomb_member, lie_about_size, make_log, variant

from sweeps.config import parse_config
from warehouse import Warehouse
from warehouse.inflate import MB, InflateLimits

GRADEBOOK = [sys.executable, "-m", "flows.cli"]
GB = 1 << 30
RSS_BOUND = 500 * MB  # `gradebook ingest` of a 12-sample log peaks at ~260 MB
BOMB = "samples/q1_epoch_1.json"


@pytest.fixture(scope="module")
def base_log(tmp_path_factory) -> Path:
    """6 samples x 2 epochs; q0 and q3 errored at generation time (their members ~95 KB)."""
    return Path(make_log(tmp_path_factory.mktemp("logs")).location)


@pytest.fixture(scope="module")
def bombs(base_log, tmp_path_factory) -> dict[str, Path]:
    """The same log with one sample (or its header) a bomb: written once, copied per test."""
    out = tmp_path_factory.mktemp("bombs")
    return {
        "zstd": bomb_member(base_log, out / "zstd.eval", BOMB, 3 * GB // 2),
        # deflate inflates ~230x at level 1 (~1000x at best): 900 MB is a 4 MB file
        "deflate": bomb_member(
            base_log, out / "deflate.eval", BOMB, 900 * MB, method=zipfile.ZIP_DEFLATED
        ),
        "header": bomb_member(base_log, out / "header.eval", "header.json", 3 * GB // 2),
    }


# Runs the command and prints its peak RSS. A small process of its own: a child's peak RSS
# (ru_maxrss) starts at its parent's RSS at the fork, and the test process is big.
_MEASURED = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, timeout=600).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.exit(code)
"""


def ingest(db: Path, *logs: Path, flags: tuple[str, ...] = (), env: dict | None = None):
    """`gradebook ingest` in a subprocess: (exit code, stderr lines, its peak RSS in bytes)."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, *GRADEBOOK, "ingest", "--db", str(db), *flags,
         *map(str, logs)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )  # fmt: skip
    return proc.returncode, proc.stderr.splitlines(), int(proc.stdout.strip().splitlines()[-1])


def stored(db: Path) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute("SELECT run_id, sample_id, epoch FROM samples ORDER BY ALL").fetchall()


def runs(db: Path) -> list[tuple]:
    with Warehouse(db).read() as con:
        return con.execute("SELECT run_id, ingest_state, n_samples FROM runs").fetchall()


def all_but_the_bomb() -> set[tuple[str, int]]:
    return {(f"q{i}", e) for i in range(6) for e in (1, 2)} - {("q1", 1)}


@pytest.mark.slow
@pytest.mark.parametrize("lying", [False, True], ids=["honest", "lying"])
@pytest.mark.parametrize("kind", ["zstd", "deflate"])
def test_a_sample_bomb_is_refused_in_one_line_and_the_rest_is_stored(
    base_log, bombs, tmp_path, kind, lying
) -> None:
    log = shutil.copy(bombs[kind], tmp_path / f"{kind}.eval")
    if lying:  # the directory claims the member's real size: only the inflation can tell
        with zipfile.ZipFile(base_log) as archive:
            lie_about_size(Path(log), BOMB, archive.getinfo(BOMB).file_size)
    db = tmp_path / "g.duckdb"
    code, lines, rss = ingest(db, log)

    print(f"peak RSS {rss / MB:.0f} MB", *lines, sep="\n")
    assert code == 2, lines
    assert rss < RSS_BOUND, f"peak RSS {rss / MB:.0f} MB"
    assert "Traceback" not in "\n".join(lines)
    refused, summary = lines
    assert refused.startswith(f"error: {log}: sample q1 epoch 1: refused ({BOMB} ")
    why = "declares 1,536 MB inflated, over the 1,024 MB limit" if kind == "zstd" else "over 100x"
    assert (why if not lying else "over 100x (a zip bomb?)") in refused
    assert "raise --max-" in refused
    assert summary == (
        f"error: {log}: 1 refused sample(s); 11 stored, the run stays partial: if they are "
        "genuine, raise the limit named above and ingest it again"
    )
    assert [(state, n) for _, state, n in runs(db)] == [("partial", 11)]
    assert {(s, e) for _, s, e in stored(db)} == all_but_the_bomb()


@pytest.mark.slow
@pytest.mark.parametrize("lying", [False, True], ids=["honest", "lying"])
def test_a_header_bomb_refuses_the_log_in_one_line_and_nothing_else_is_lost(
    base_log, bombs, tmp_path, lying
) -> None:
    log = shutil.copy(bombs["header"], tmp_path / "header.eval")
    if lying:
        with zipfile.ZipFile(base_log) as archive:
            lie_about_size(Path(log), "header.json", archive.getinfo("header.json").file_size)
    other = variant(read_eval_log(str(base_log)), tmp_path / "other.eval", eval_id="other-run")
    db = tmp_path / "g.duckdb"
    code, lines, rss = ingest(db, log, other)

    assert code == 2, lines
    assert rss < RSS_BOUND, f"peak RSS {rss / MB:.0f} MB"
    [refused] = [line for line in lines if line.startswith("error:")]
    assert refused.startswith(f"error: {log}: refused (header.json ")
    assert ("declares 1,536 MB" if not lying else "over 100x (a zip bomb?)") in refused
    assert len([line for line in lines if line.strip()]) == 1, lines
    # the other log is in whole; the bomb's run is not there at all
    assert runs(db) == [("other-run", "complete", 12)]


OLD_LOG = "2025-02-11T15-17-00-05-00_popularity_dPiJifoWeEQBrfWsAopzWr.eval"  # Inspect 0.3.6x


@pytest.mark.slow
def test_a_bomb_in_an_older_inspect_log_is_refused_before_inspects_reader(
    shared_data, tmp_path
) -> None:
    # an older Inspect version's log goes to Inspect's own reader, which inflates a member
    # whole: the bomb must be refused before that reader sees it
    log = bomb_member(shared_data / "logs" / OLD_LOG, tmp_path / "old.eval",
                      "samples/5_epoch_1.json", 900 * MB, method=zipfile.ZIP_DEFLATED)  # fmt: skip
    lie_about_size(log, "samples/5_epoch_1.json", 7827)  # its real size: only inflating tells
    db = tmp_path / "g.duckdb"
    code, lines, rss = ingest(db, log)

    assert code == 2, lines
    assert rss < RSS_BOUND, f"peak RSS {rss / MB:.0f} MB"
    refused, summary = lines
    assert refused.startswith(f"error: {log}: sample 5 epoch 1: refused (samples/5_epoch_1.json ")
    assert "over 100x (a zip bomb?)" in refused
    assert summary.startswith(f"error: {log}: 1 refused sample(s); 9 stored")
    assert sorted(int(s) for _, s, _ in stored(db)) == [1, 2, 3, 4, 6, 7, 8, 9, 10]


def test_the_member_limit_is_a_flag_and_an_environment_variable(base_log, tmp_path) -> None:
    # q0 and q3 errored at generation: their members hold tracebacks (~95 KB), the others ~5 KB
    for how, flags, env in [
        ("flag", ("--max-member-mb", "0.05"), {}),
        ("env", (), {"GRADEBOOK_MAX_MEMBER_MB": "0.05"}),
    ]:
        db = tmp_path / f"{how}.duckdb"
        code, lines, _ = ingest(db, base_log, flags=flags, env=env)
        assert code == 2, lines
        assert len(lines) == 5, lines  # q0 and q3, two epochs each, and the summary
        assert lines[0].startswith(f"error: {base_log}: sample q0 epoch 1: refused (")
        assert "over the 51.2 KB limit per member; raise --max-member-mb" in lines[0]
        assert {(s, e) for _, s, e in stored(db)} == {
            (f"q{i}", e) for i in (1, 2, 4, 5) for e in (1, 2)
        }
    # a bad value is one line, before anything is read
    code, lines, _ = ingest(tmp_path / "bad.duckdb", base_log, flags=("--max-member-mb", "0"))
    assert (code, lines) == (2, [
        "error: --max-member-mb (env GRADEBOOK_MAX_MEMBER_MB) must be a number above 0, not 0"
    ])  # fmt: skip
    assert not (tmp_path / "bad.duckdb").exists()


@pytest.mark.slow
def test_a_member_past_its_size_limit_is_refused_while_it_streams(bombs, tmp_path) -> None:
    # the ratio guard raised out of the way: the size limit alone stops a lying bomb at 64 MB
    log = lie_about_size(Path(shutil.copy(bombs["zstd"], tmp_path / "z.eval")), BOMB, 5000)
    flags = ("--max-inflate-ratio", "1000000", "--max-member-mb", "64")
    code, lines, rss = ingest(tmp_path / "g.duckdb", log, flags=flags)
    assert code == 2, lines
    assert rss < RSS_BOUND, f"peak RSS {rss / MB:.0f} MB"
    assert lines[0].startswith(f"error: {log}: sample q1 epoch 1: refused ({BOMB} inflates past "
                               "the 64 MB limit per member")  # fmt: skip


def test_the_log_limit_stops_a_log_and_keeps_what_was_read(base_log, tmp_path) -> None:
    db = tmp_path / "g.duckdb"
    code, lines, _ = ingest(db, base_log, flags=("--max-log-mb", "0.2"))
    assert code == 2, lines
    [line] = lines
    assert line.startswith(f"error: {base_log}: refused (its members inflate past the 204.8 KB "
                           "limit per log (at samples/")  # fmt: skip
    assert "raise --max-log-mb (GRADEBOOK_MAX_LOG_MB)" in line
    [(_, state, n)] = runs(db)
    assert state == "partial" and 0 < n < 12  # what was read before the limit is stored
    # raised, the same log completes (only the samples missing are read)
    code, lines, _ = ingest(db, base_log)
    assert code == 0, lines
    assert [(s, n) for _, s, n in runs(db)] == [("complete", 12)]


def test_a_json_log_over_the_member_limit_is_refused(shared_data, tmp_path) -> None:
    log = shared_data / "logs" / "2025-05-12T20-28-13-04-00_popularity.json"  # 42 KB
    db = tmp_path / "g.duckdb"
    code, lines, _ = ingest(db, log, flags=("--max-member-mb", "0.01"))
    assert code == 2, lines
    [line] = lines
    assert line.startswith(f"error: {log}: refused (a .json log is read whole, and this one is ")
    assert "inspect log convert" in line
    code, lines, _ = ingest(db, log)
    assert code == 0, lines


def test_the_sweep_config_sets_the_limits_and_the_environment_wins(monkeypatch) -> None:
    raw = {
        "name": "s",
        "models": [{"model": "mockllm/model"}],
        "tasks": [{"task": "math_verified"}],
        "ingest": {"max_member_mb": 2, "max_inflate_ratio": 50},
    }
    for name in ("GRADEBOOK_MAX_MEMBER_MB", "GRADEBOOK_MAX_LOG_MB", "GRADEBOOK_MAX_INFLATE_RATIO"):
        monkeypatch.delenv(name, raising=False)
    limits = parse_config(raw).ingest.limits()
    assert limits == InflateLimits(member_bytes=2 * MB, ratio=50.0)
    assert parse_config({**raw, "ingest": {}}).ingest.limits() == InflateLimits()
    monkeypatch.setenv("GRADEBOOK_MAX_MEMBER_MB", "8")  # what --max-member-mb sets
    assert parse_config(raw).ingest.limits() == InflateLimits(member_bytes=8 * MB, ratio=50.0)
    with pytest.raises(ValueError, match=r"ingest\.max_member_mb"):
        parse_config({**raw, "ingest": {"max_member_mb": 0}})
    with pytest.raises(ValueError, match=r"ingest\.max_members"):
        parse_config({**raw, "ingest": {"max_members": 1}})


def test_a_big_genuine_member_streams_whole_across_zstd_frames(tmp_path, monkeypatch) -> None:
    # Inspect writes a member over 200 MB as several Zstandard frames; with its frame size made
    # small, a 3 MB completion is such a member: inflated in streamed chunks, every frame read
    import random

    import inspect_ai._util.zipfile as inspect_zip
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import generate

    monkeypatch.setattr(inspect_zip, "_MAX_INPUT_PER_FRAME", 256 << 10)
    rng = random.Random(29)
    text = " ".join(f"{rng.random():.12f}" for _ in range(200_000))  # 3 MB, ~2x compressible
    output = ModelOutput.from_content("mockllm/model", text)
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    [log] = eval(
        Task(dataset=[Sample(id="big", input="talk", target="x")], solver=generate()),
        model=get_model("mockllm/model", custom_outputs=[output]),
        log_dir=str(tmp_path / "logs"), display="none", score=False,
    )  # fmt: skip
    with zipfile.ZipFile(log.location) as archive:
        info = archive.getinfo("samples/big_epoch_1.json")
        with open(log.location, "rb") as f:
            f.seek(info.header_offset + 26)
            name_len, extra_len = struct.unpack("<2H", f.read(4))
            f.seek(info.header_offset + 30 + name_len + extra_len)
            first = zstandard.ZstdDecompressor().decompress(
                f.read(info.compress_size), max_output_size=info.file_size
            )
    assert info.file_size > 3 * MB and len(first) < info.file_size  # several frames

    for direct in (True, False):
        wh = Warehouse(tmp_path / f"{direct}.duckdb")
        [res] = wh.ingest_logs([log.location], direct_read=direct)
        assert (res.error, res.samples_total) == (None, 1)
        with wh.read() as con:
            assert con.execute("SELECT completion FROM samples").fetchall() == [(text,)]
