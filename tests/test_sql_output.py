"""`gradebook sql` on a terminal: hostile model text is shown escaped, wide rows stay readable.

The warehouse holds real hostile completions (a real Inspect eval with mockllm answering them),
and the command runs as a real subprocess, on a pseudo-terminal where it matters: what reaches
the terminal is what the test reads.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
from pathlib import Path

import pytest
from cli_kit import GRADEBOOK, gradebook, shell_env
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate

from warehouse import Warehouse

HOSTILE = {
    "clear": "before\x1b[2J\x1b[Hafter",  # clear the screen, cursor home
    "colour": "plain \x1b[31mRED\x1b[0m [bold]not markup[/bold] [/]",
    "nul": "nul\x00byte",
    "title": "x\x1b]0;pwned\x07y",  # set the terminal's title
    "bidi": "abc\u202eevil\u202cdef",  # displays reversed
    "lines": "first line\nsecond\tline\r\r",
}
RAW = [b"\x1b[2J", b"\x1b[H", b"\x1b[31m", b"\x1b]0;", b"\x00", b"\x07", b"\r\r"]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    ids = sorted(HOSTILE)
    outputs = [
        ModelOutput.from_content("mockllm/model", HOSTILE[i]).model_copy(
            update={"usage": ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)}
        )
        for i in ids
    ]
    task = Task(
        dataset=[Sample(input=f"say {i}", target="x", id=i) for i in ids], solver=generate()
    )
    [log] = eval(
        task,
        model=get_model("mockllm/model", custom_outputs=outputs),
        log_dir=str(root / "logs"),
        display="none",
        max_samples=1,  # answers in dataset order
    )
    path = root / "hostile.duckdb"
    [res] = Warehouse(path).ingest_logs([log.location])
    assert res.error is None
    with Warehouse(path).read() as con:
        stored = dict(con.execute("SELECT sample_id, completion FROM samples").fetchall())
    assert stored == HOSTILE  # the warehouse holds the exact hostile text
    return path


def _on_a_tty(args: list[str], cwd: Path) -> bytes:
    """Run gradebook with stdout and stderr on a pseudo-terminal; everything it wrote there."""
    master, slave = pty.openpty()
    env = shell_env(cwd / "prefect-home", TERM="xterm-256color", COLUMNS="160")
    proc = subprocess.Popen([str(GRADEBOOK), *args], stdout=slave, stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks)


@pytest.mark.parametrize("fmt", ["table", "line"])
def test_model_text_reaches_the_terminal_escaped(db: Path, tmp_path: Path, fmt: str) -> None:
    out = _on_a_tty(
        ["sql", "--db", str(db), "--format", fmt, "SELECT sample_id, completion FROM samples"],
        tmp_path,
    )
    for raw in RAW:
        assert raw not in out, raw
    text = out.decode()
    assert "\u202e" not in text
    for shown in ("before\\x1b[2J\\x1b[Hafter", "nul\\x00byte", "x\\x1b]0;pwned\\x07y"):
        assert shown in text
    assert "abc\\u202eevil\\u202cdef" in text
    assert "[bold]not markup[/bold] [/]" in text  # text, never rich markup
    assert "first line" in text and "second" in text  # a newline is still a line break


def test_csv_on_a_terminal_is_escaped(db: Path, tmp_path: Path) -> None:
    query = 'SELECT sample_id, completion AS "text\x1b[2J" FROM samples ORDER BY sample_id'
    out = _on_a_tty(["sql", "--db", str(db), "--format", "csv", query], tmp_path)
    for raw in RAW:
        assert raw not in out, raw
    text = out.decode()
    assert "\u202e" not in text
    assert "text\\x1b[2J" in text  # a column name is escaped too
    for shown in ("before\\x1b[2J\\x1b[Hafter", "nul\\x00byte", "x\\x1b]0;pwned\\x07y",
                  "abc\\u202eevil\\u202cdef"):  # fmt: skip
        assert shown in text


def test_json_on_a_terminal_is_escaped_by_json_itself(db: Path, tmp_path: Path) -> None:
    query = "SELECT sample_id, completion FROM samples ORDER BY sample_id"
    out = _on_a_tty(["sql", "--db", str(db), "--format", "json", query], tmp_path)
    for raw in RAW:
        assert raw not in out, raw
    assert max(out) < 0x80  # ASCII only: no U+202E either
    start = out.index(b"[")
    records = json.loads(out[start:].decode())  # and still the exact text once decoded
    assert {r["sample_id"]: r["completion"] for r in records} == HOSTILE


def test_a_failed_query_quoting_model_text_is_escaped(db: Path, tmp_path: Path) -> None:
    env = shell_env(tmp_path / "prefect-home")
    ran = gradebook("sql", "--db", str(db),
                    "SELECT completion::INTEGER FROM samples WHERE sample_id = 'clear'",
                    env=env, cwd=tmp_path)  # fmt: skip
    assert ran.code == 2
    [line] = ran.stderr_lines
    assert line.startswith("error: query failed: ") and "before\\x1b[2J" in line
    assert "\x1b" not in ran.stderr


def test_csv_to_a_pipe_keeps_the_exact_bytes(db: Path, tmp_path: Path) -> None:
    query = "SELECT sample_id, completion FROM samples ORDER BY sample_id"
    env = shell_env(tmp_path / "prefect-home")
    proc = subprocess.run(
        [str(GRADEBOOK), "sql", "--db", str(db), "--format", "csv", query],
        stdout=subprocess.PIPE, env=env, cwd=tmp_path, timeout=120, check=True,
    )  # fmt: skip
    for raw in RAW:
        assert raw in proc.stdout, raw
    assert "abc\u202eevil\u202cdef".encode() in proc.stdout
    rows = list(csv.reader(io.StringIO(proc.stdout.decode(), newline="")))
    assert dict(rows[1:]) == HOSTILE


def test_csv_and_json_keep_the_exact_text(db: Path, tmp_path: Path) -> None:
    query = "SELECT sample_id, completion FROM samples ORDER BY sample_id"
    env = shell_env(tmp_path / "prefect-home")
    as_json = gradebook("sql", "--db", str(db), "--format", "json", query, env=env, cwd=tmp_path)
    assert {r["sample_id"]: r["completion"] for r in json.loads(as_json.stdout)} == HOSTILE
    as_csv = gradebook("sql", "--db", str(db), "--format", "csv", query, env=env, cwd=tmp_path)
    rows = list(csv.reader(io.StringIO(as_csv.stdout, newline="")))
    assert rows[0] == ["sample_id", "completion"]
    assert dict(rows[1:]) == HOSTILE


def test_a_row_too_wide_for_the_terminal_prints_as_lines_and_nothing_is_cut(
    db: Path, tmp_path: Path
) -> None:
    env = shell_env(tmp_path / "prefect-home", COLUMNS="100")
    with Warehouse(db).read() as con:
        cur = con.execute("SELECT * FROM samples WHERE sample_id = 'nul'")
        columns = [d[0] for d in cur.description]
        [row] = cur.fetchall()
    ran = gradebook("sql", "--db", str(db), "SELECT * FROM samples WHERE sample_id = 'nul'",
                    env=env, cwd=tmp_path)  # fmt: skip
    assert ran.code == 0, ran.stderr
    lines = ran.stdout.splitlines()
    for name in columns:  # one `name = value` line per column
        assert any(ln.lstrip().startswith(f"{name} = ") for ln in lines), name
    output = row[columns.index("output")]  # the widest value: the whole ModelOutput JSON
    assert len(output) > 100 and output in ran.stdout
    assert "…" not in ran.stdout

    table = gradebook("sql", "--db", str(db), "--format", "table",
                      "SELECT * FROM samples WHERE sample_id = 'nul'", env=env, cwd=tmp_path)  # fmt: skip
    assert table.code == 0 and "…" not in table.stdout  # folded, never cut
    assert "1 row" in table.stdout


@pytest.mark.parametrize(
    ("query", "hint"),
    [
        ("SELECT * FROM run_metric", 'Did you mean "run_metrics"?'),
        ("SELECT modl FROM run_metrics", 'Candidate bindings: "model"'),
    ],
)
def test_a_failed_query_keeps_duckdbs_hint_on_its_one_line(
    db: Path, tmp_path: Path, query: str, hint: str
) -> None:
    ran = gradebook("sql", "--db", str(db), query, env=shell_env(tmp_path / "ph"), cwd=tmp_path)
    assert ran.code == 2
    [line] = ran.stderr_lines
    assert line.startswith("error: query failed: ") and hint in line, line
    assert "LINE 1" not in line  # the quoted query is left out
