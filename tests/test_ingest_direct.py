"""The direct `.eval` archive reader gives exactly the rows Inspect's reader gives.

Every log is ingested twice, once with `direct_read=True` (warehouse.eval_archive where it
applies) and once with `direct_read=False` (Inspect's readers only), and the runs, samples and
messages tables are compared row for row, every column but the ingest timestamps.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log
from inspect_ai.model import (
    ChatMessageSystem,
    ChatMessageUser,
    ContentImage,
    ContentText,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import ToolError, tool
from warehouse_logs import make_log, variant

from warehouse import LogReadError, Warehouse, eval_archive
from warehouse.logs import read_header

# a 1x1 PNG: base64 images are moved to attachments by Inspect's writer
_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@tool
def lookup():
    async def execute(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        if key == "missing":
            raise ToolError("no such key")
        return f"value of {key} ✓ — ünïcødé"

    return execute


def _agent(input, tools, tool_choice, config) -> ModelOutput:  # noqa: A002 - Inspect's signature
    last = input[-1]
    usage = ModelUsage(input_tokens=7, output_tokens=3, total_tokens=10, reasoning_tokens=2)
    if last.role == "user" and "boom" in last.text:
        raise RuntimeError("mock provider failure ✗")
    if last.role == "user":
        key = "missing" if "missing" in last.text else "k1"
        out = ModelOutput.for_tool_call("mockllm/model", "lookup", {"key": key})
    else:
        out = ModelOutput.from_content("mockllm/model", f"Done: {last.text} " + "x" * 150)
    out.usage = usage
    return out


def _agent_log(log_dir: Path):
    dataset = [
        Sample(id=1, input="plain question é", target="a", metadata={"n": None, "f": 0.1}),
        Sample(
            id="chat-2",
            input=[
                ChatMessageSystem(content="You are terse, ü. " * 20),
                ChatMessageUser(content=[ContentText(text="part one"), ContentText(text="two")]),
            ],
            target=["b", "B"],
            metadata={"nested": {"z": [1, 2.5, "ü"], "a": True}},
        ),
        Sample(
            id="img",
            input=[ChatMessageUser(content=[ContentText(text="see"), ContentImage(image=_PNG)])],
            target="c",
        ),
        Sample(id="err", input="boom now", target="d"),
        Sample(id="tool-error", input="ask for missing", target="e"),
        Sample(id="under_score_epoch_3", input="odd id", target="f"),
    ]
    [log] = eval(
        Task(dataset=dataset, solver=[use_tools(lookup()), generate()], name="agentic"),
        model=get_model("mockllm/model", custom_outputs=_agent),
        epochs=2,
        log_dir=str(log_dir),
        display="none",
        score=False,
        fail_on_error=False,
    )
    return log


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("direct")
    base = make_log(d / "base")
    agent = _agent_log(d / "agent")
    rewritten = variant(read_eval_log(agent.location), d / "rewritten.eval", eval_id="rewrite1")
    return {
        "base": Path(base.location),
        "agent": Path(agent.location),
        "rewritten": rewritten,  # written whole by write_eval_log, not streamed by eval()
    }


def _tables(wh: Warehouse) -> dict[str, list[tuple]]:
    with wh.read() as con:
        return {
            name: con.sql(f"SELECT {columns} FROM wh.{name} ORDER BY ALL").fetchall()
            for name, columns in (
                ("runs", "* EXCLUDE (first_ingested_at, ingested_at, log_seen_at)"),
                ("samples", "* EXCLUDE (ingested_at)"),
                ("messages", "*"),
            )
        }


def _ingest_both(paths: list[Path], tmp_path: Path, batch_size: int = 4):
    direct, reference = Warehouse(tmp_path / "direct.duckdb"), Warehouse(tmp_path / "ref.duckdb")
    got = direct.ingest_logs(paths, batch_size=batch_size)
    want = reference.ingest_logs(paths, batch_size=batch_size, direct_read=False)
    assert [r.error for r in got] == [None] * len(paths)
    assert [(r.samples_added, r.samples_total) for r in got] == [
        (r.samples_added, r.samples_total) for r in want
    ]
    return _tables(direct), _tables(reference)


@pytest.mark.slow
def test_mockllm_logs_give_identical_rows(logs, tmp_path):
    paths = list(logs.values())
    for p in paths:  # the direct reader really decodes these logs: only image samples go back
        assert eval_archive.applies(str(p), read_header(str(p)))
        batches = list(eval_archive.iter_sample_columns(str(p), "r", set(), batch_size=5))
        assert sum(len(b) for b in batches) == 12
        assert sum(b.via_inspect for b in batches) == (0 if p == logs["base"] else 2)
    got, want = _ingest_both(paths, tmp_path)
    for name in want:
        assert got[name] == want[name], name
    samples = got["samples"]
    assert len(samples) == 12 + 12 + 12
    # the variety the comparison covered: tool calls, tool errors, content lists, errors, images
    with Warehouse(tmp_path / "direct.duckdb").read() as con:
        seen = con.sql(
            "SELECT count(*) FILTER (WHERE tool_calls IS NOT NULL), "
            "count(*) FILTER (WHERE tool_error IS NOT NULL), "
            "count(*) FILTER (WHERE text = 'part one\ntwo') FROM messages"
        ).fetchall()[0]
        assert all(n > 0 for n in seen), seen
        errors = con.sql(
            "SELECT count(*), count(*) FILTER (WHERE error LIKE '%✗%') FROM samples "
            "WHERE error IS NOT NULL"
        ).fetchall()[0]
        # q0, q3 x 2 epochs in the base log; 'err' x 2 epochs in the agent log and its rewrite
        assert errors == (4 + 4, 4)


def test_attachment_samples_go_through_inspects_reader(logs):
    # the image sample's input references an attachment: only Inspect resolves those
    path = str(logs["agent"])
    with zipfile.ZipFile(path) as z:
        raw = z.read("samples/img_epoch_1.json")
    assert b"attachment://" in raw
    header = read_header(path)
    [columns] = list(eval_archive.iter_sample_columns(path, "r", set(), batch_size=100))
    samples, _ = columns.tables()
    img = [i for i in samples.column("input").to_pylist() if "image" in i]
    assert img and all("attachment://" not in i and "base64" in i for i in img)
    assert header.eval.task == "agentic"


def test_grown_log_direct_adds_only_the_missing_samples(logs, tmp_path):
    base = read_eval_log(str(logs["base"]))
    short = variant(base, tmp_path / "grow.eval", eval_id="g1", keep=5)
    wh = Warehouse(tmp_path / "g.duckdb")
    [first] = wh.ingest_logs([short])
    variant(base, tmp_path / "grow.eval", eval_id="g1")
    [second] = wh.ingest_logs([tmp_path / "grow.eval"])
    assert (first.samples_added, second.samples_added, second.samples_total) == (5, 7, 12)


@pytest.mark.slow
def test_shared_reference_logs_give_identical_rows(shared_data, tmp_path):
    paths = sorted(p for p in (shared_data / "logs").iterdir() if p.suffix in {".eval", ".json"})
    got, want = _ingest_both(paths, tmp_path)
    for name in want:
        assert got[name] == want[name], name
    assert len(got["samples"]) > 0


# -- headers -------------------------------------------------------------------------------------


def _same_headers(paths) -> None:
    for p in paths:
        direct = eval_archive.read_header(str(p))
        assert direct is not None, p  # really read directly, not through the fallback
        assert direct.model_dump() == read_eval_log(str(p), header_only=True).model_dump(), p


def test_direct_header_equals_inspects_on_mockllm_logs(logs):
    _same_headers(logs.values())


def test_direct_header_equals_inspects_on_shared_logs(shared_data):
    # older Inspect versions, deflated members, reductions.json: all read the same
    paths = sorted((shared_data / "logs").glob("*.eval"))
    assert len(paths) >= 3
    _same_headers(paths)


def test_direct_header_reads_zip64_archives(logs, tmp_path, monkeypatch):
    # a log of more than 65,535 samples is a ZIP64 archive (and over 4 GiB its entries keep
    # their offsets in a ZIP64 extra field): zipfile is made to write both for a small log
    src = logs["base"]
    big = tmp_path / "zip64.eval"
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 1)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(big, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info), zipfile.ZIP_DEFLATED)
    monkeypatch.undo()
    raw = big.read_bytes()
    assert b"PK\x06\x06" in raw and b"PK\x06\x07" in raw  # the ZIP64 end records
    with zipfile.ZipFile(big) as z:
        assert z.getinfo("header.json").header_offset > 0
    _same_headers([big])


def test_header_falls_back_to_inspects_reader(logs, tmp_path):
    # a log still being written has no header.json: Inspect builds the header from its journal
    src = str(logs["base"])
    partial = tmp_path / "partial.eval"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(partial, "w") as zout:
        for info in zin.infolist():
            if info.filename != "header.json":
                zout.writestr(info.filename, zin.read(info), zipfile.ZIP_DEFLATED)
    assert eval_archive.read_header(str(partial)) is None
    want = read_eval_log(str(partial), header_only=True)
    assert read_header(str(partial)).model_dump() == want.model_dump()
    assert want.eval.eval_id == read_eval_log(src, header_only=True).eval.eval_id

    bad = tmp_path / "bad.eval"
    bad.write_bytes(b"PK\x05\x06" + b"\0" * 40)
    assert eval_archive.read_header(str(bad)) is None
    with pytest.raises(LogReadError, match="bad.eval: not an Inspect log"):
        read_header(str(bad))


def test_header_is_read_once_until_the_file_changes(logs, tmp_path, monkeypatch):
    path = tmp_path / "h.eval"
    shutil.copy(logs["base"], path)
    first = read_header(str(path))
    reads = []
    real = eval_archive.read_header
    monkeypatch.setattr(eval_archive, "read_header", lambda p, *a: reads.append(p) or real(p, *a))
    assert read_header(str(path)) is first and reads == []
    variant(read_eval_log(str(path)), path, eval_id="changed")  # rewritten in place
    assert read_header(str(path)).eval.eval_id == "changed" and reads == [str(path)]
