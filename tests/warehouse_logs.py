"""Real Inspect logs for the warehouse tests, written by `eval()` with the offline mockllm model."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog, read_eval_log, write_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate


def _answer(input, tools, tool_choice, config) -> ModelOutput:  # noqa: A002 - Inspect's signature
    text = input[-1].text
    if "boom" in text:
        raise RuntimeError(f"mock provider failure on {text!r}")
    output = ModelOutput.from_content("mockllm/model", f"The answer is {len(text)}")
    output.usage = ModelUsage(input_tokens=len(text), output_tokens=5, total_tokens=len(text) + 5)
    return output


def make_log(
    log_dir: Path,
    *,
    n: int = 6,
    epochs: int = 2,
    boom_every: int = 3,
    task_name: str = "arith",
) -> EvalLog:
    """Run a real generate-only eval: `n` samples x `epochs`, every `boom_every`-th sample errors.

    Returns:
        The log as read back from disk (with samples).
    """
    dataset = [
        Sample(
            id=f"q{i}",
            input=f"question {i}" + (" boom" if boom_every and i % boom_every == 0 else ""),
            target=str(len(f"question {i}")),
            metadata={"level": i % 3, "topic": "arith"},
        )
        for i in range(n)
    ]
    task = Task(dataset=dataset, solver=[generate()], name=task_name)
    [log] = eval(
        task,
        model=get_model("mockllm/model", custom_outputs=_answer),
        epochs=epochs,
        log_dir=str(log_dir),
        display="none",
        score=False,
        fail_on_error=False,
        log_format="eval",
    )
    return read_eval_log(log.location)


def variant(
    log: EvalLog, path: Path, *, eval_id: str, keep: int | None = None, status: str | None = None
) -> Path:
    """Write a copy of `log` under a new eval_id, optionally truncated / with another status."""
    copy = log.model_copy(deep=True)
    copy.eval.eval_id = eval_id
    if keep is not None:
        copy.samples = (copy.samples or [])[:keep]
    if status is not None:
        copy.status = status  # type: ignore[assignment]
    write_eval_log(copy, str(path))
    return path


_READER = """
import select, sys, time, duckdb
deadline = time.monotonic() + 60
while True:
    try:
        con = duckdb.connect(sys.argv[1], read_only=True)
        break
    except duckdb.IOException:  # a writer holds it: open as soon as it lets go
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
print("open", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))
"""


@contextmanager
def reader_holding(db: Path, seconds: float = 20) -> Iterator[subprocess.Popen[str]]:
    """Another process with a read-only DuckDB connection open on `db` for the block (`seconds`
    at most; opened as soon as no writer holds the file): a writer here must wait for it; a
    reader need not."""
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(db), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "open"
        yield reader
    finally:
        reader.communicate("")


def damage_member(log: Path, out: Path, member: str) -> Path:
    """A copy of `log` with the stored bytes of one zip member overwritten in the middle (what
    a bad disk block or a torn copy does): the member no longer decompresses or fails its CRC;
    every other member and the zip directory are intact."""
    shutil.copy(log, out)
    with zipfile.ZipFile(log) as archive:
        info = archive.getinfo(member)
    with open(out, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        data_at = info.header_offset + 30 + name_len + extra_len
        f.seek(data_at + info.compress_size // 3)
        f.write(b"\xff" * max(8, info.compress_size // 3))
    return out


def rewrite_member(log: Path, out: Path, member: str, edit: Callable[[bytes], bytes]) -> Path:
    """A copy of `log` with one member's uncompressed bytes replaced by `edit(bytes)` (written
    back with the member's own compression, Zstandard for Inspect's samples)."""
    import inspect_ai._util.zipfile  # noqa: F401 - teaches zipfile Inspect's Zstandard members

    with zipfile.ZipFile(log) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == member:
                data = edit(data)
            dst.writestr(info, data, compress_type=info.compress_type)
    return out


def truncated(log: Path, out: Path) -> Path:
    """A copy of `log` cut in half (an interrupted copy)."""
    data = Path(log).read_bytes()
    out.write_bytes(data[: len(data) // 2])
    return out


ZIP_ZSTD = 93  # the zip method id of Inspect's Zstandard members


def bomb_member(log: Path, out: Path, member: str, size: int, *, method: int = ZIP_ZSTD) -> Path:
    """A copy of `log` whose `member` is its own JSON with `size` bytes of whitespace after the
    opening brace: still valid JSON, inflating to `size` bytes from a few MB at most (a zip
    bomb), written as Zstandard or deflate (level 1: the quickest to write). Every other member
    and the directory are as Inspect wrote them; the bomb's directory entry is honest."""
    import inspect_ai._util.zipfile  # noqa: F401 - teaches zipfile Inspect's Zstandard members

    spaces = b" " * (16 << 20)
    with (
        zipfile.ZipFile(log) as src,
        zipfile.ZipFile(
            out,
            "w",
            compression=method,
            compresslevel=1 if method == zipfile.ZIP_DEFLATED else None,
        ) as dst,
    ):
        for info in src.infolist():
            data = src.read(info)
            if info.filename != member:
                dst.writestr(info, data, compress_type=info.compress_type)
                continue
            assert data[:1] == b"{"
            # opened by name: the archive's own method and level
            with dst.open(member, "w", force_zip64=True) as stream:
                stream.write(b"{")
                left = size
                while left > 0:
                    stream.write(spaces[: min(left, len(spaces))])
                    left -= len(spaces)
                stream.write(data[1:])
    return out


def lie_about_size(archive: Path, member: str, size: int) -> Path:
    """Make `member`'s central directory entry claim `size` inflated bytes (a lying archive:
    a reader that trusts the directory is fooled). The entry must hold its sizes in 32 bits
    (an inflated size under 2 GiB)."""
    data = bytearray(archive.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    cd_offset = struct.unpack_from("<L", data, end + 16)[0]
    if cd_offset == 0xFFFFFFFF:  # ZIP64: the offset is in the ZIP64 end record
        record = struct.unpack_from("<Q", data, end - 20 + 8)[0]
        cd_offset = struct.unpack_from("<Q", data, record + 48)[0]
    at = cd_offset
    name = member.encode()
    while data[at : at + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<3H", data, at + 28)
        if data[at + 46 : at + 46 + name_len] == name:
            assert struct.unpack_from("<L", data, at + 24)[0] != 0xFFFFFFFF
            struct.pack_into("<L", data, at + 24, size)
            archive.write_bytes(bytes(data))
            return archive
        at += 46 + name_len + extra_len + comment_len
    raise AssertionError(f"{member} is not in {archive}")


def repeated_epochs(template: Path, epochs: int, path: Path, *, events: bool = True) -> Path:
    """`template`'s samples as epochs 1..`epochs` of a new run, written with the recorder
    Inspect's `eval()` and `write_eval_log` write with, then read back with Inspect's reader:
    a big log (the same mix of answers) without generating every sample (a mockllm eval costs
    ~12 ms a sample here). Also benchmarks/scoring_stage.py's.

    `events=False` leaves out the samples' event transcripts (most of a sample's bytes, and
    nothing ingest or grading reads): the log is written several times faster."""
    import asyncio

    from inspect_ai.log import read_eval_log, read_eval_log_sample

    log = read_eval_log(str(template))
    base = log.samples or []
    n = len(base) * epochs
    spec = log.eval.model_copy(
        update={
            "eval_id": _uuid(),
            "run_id": _uuid(),
            "config": log.eval.config.model_copy(update={"epochs": epochs}),
        }
    )
    update: dict[str, Any] = {"eval": spec, "samples": None, "location": None}
    if log.results is not None:
        update["results"] = log.results.model_copy(
            update={"total_samples": n, "completed_samples": n}
        )
    if log.stats is not None:
        usage = {
            m: u.model_copy(
                update={k: getattr(u, k) * epochs
                        for k in ("input_tokens", "output_tokens", "total_tokens")}
            )
            for m, u in log.stats.model_usage.items()
        }  # fmt: skip
        update["stats"] = log.stats.model_copy(update={"model_usage": usage})
    header = log.model_copy(update=update)
    # shallow copies, made as they are written: messages, output and events are shared
    samples = (
        s.model_copy(update={"epoch": epoch, "uuid": _uuid(), **({} if events else {"events": []})})
        for epoch in range(1, epochs + 1)
        for s in base
    )
    tmp = path.with_name(f".{path.stem}.partial.eval")
    asyncio.run(_record(header, samples, tmp))
    # Inspect's reader accepts it: the header, and a sample of the last epoch
    read = read_eval_log(str(tmp), header_only=True)
    last = read_eval_log_sample(str(tmp), base[-1].id, epochs)
    if read.eval.config.epochs != epochs or last.output.completion != base[-1].output.completion:
        raise RuntimeError(f"{tmp}: Inspect reads back another log than was written")
    tmp.replace(path)
    return path


def _uuid() -> str:
    from shortuuid import uuid

    return uuid()


async def _record(header: Any, samples: Iterable[Any], path: Path) -> None:
    """What `write_eval_log` does (Inspect's `.eval` recorder: the zip members, summaries and
    header that `eval()` writes), for samples that come from a log: already condensed, and
    each (id, epoch) given once. The recorder's own `log_sample` searches its whole buffer for
    an earlier record of the same sample on every call, which is quadratic in the samples
    buffered (hours for 200,000 at once); here they go into its buffer directly, written out
    every 20,000."""
    from inspect_ai.log._recorders.eval import EvalRecorder, _BufferedSample

    spec = header.eval
    recorder = EvalRecorder(str(path.parent))
    await recorder.log_init(spec, str(path), clean=True)
    await recorder.log_start(spec, header.plan)
    (zip_log,) = recorder.data.values()
    for i, sample in enumerate(samples, 1):
        zip_log._samples.append(_BufferedSample(sample=sample, summary=sample.summary()))
        if i % 20_000 == 0:
            await zip_log.write_buffered_samples()
    await recorder.log_finish(
        spec, header.status, header.stats, header.results, header.reductions, header.error,
        invalidated=header.invalidated, log_updates=header.log_updates,
        config_updates=header.config_updates,
    )  # fmt: skip
