"""Run the real `gradebook` CLI in this process, recording every read of a log's header (test
material).

    python tests/header_probe.py REPORT gradebook-args...

A header read is a `header.json` member inflated from a `.eval` archive
(`warehouse.zip_members.member_data`, which every direct reader uses) or Inspect's own
`read_eval_log(..., header_only=True)`. At exit the process writes REPORT (JSON): one
`{"path", "by"}` per read, `by` being the project module that asked for it (the first frame
outside the readers themselves). Nothing is mocked: the readers run as they are.
"""

from __future__ import annotations

import atexit
import json
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_READERS = ("warehouse/zip_members.py", "warehouse/eval_archive.py", "inspect_ai/")


def _asker() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if any(r in name for r in _READERS) or name == __file__ or "site-packages" in name:
            continue
        try:
            rel = Path(name).resolve().relative_to(ROOT)
        except ValueError:
            continue
        return ".".join(rel.with_suffix("").parts)
    return "?"


def install(report: str) -> None:
    reads: list[dict[str, str]] = []
    atexit.register(lambda: Path(report).write_text(json.dumps(reads)))

    import warehouse.eval_archive as eval_archive
    import warehouse.zip_members as zip_members

    real_member = zip_members.member_data

    def member_data(f: Any, info: Any, budget: Any) -> Any:
        if getattr(info, "filename", "") == "header.json":
            reads.append({"path": str(getattr(f, "name", "?")), "by": _asker()})
        return real_member(f, info, budget)

    zip_members.member_data = member_data
    eval_archive.member_data = member_data

    import inspect_ai.log

    import warehouse.logs as logs

    real_read = inspect_ai.log.read_eval_log

    def read_eval_log(path: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("header_only"):
            reads.append({"path": str(path), "by": _asker()})
        return real_read(path, *args, **kwargs)

    inspect_ai.log.read_eval_log = read_eval_log
    logs.read_eval_log = read_eval_log


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    install(sys.argv[1])
    from flows.cli import main

    sys.argv = ["gradebook", *sys.argv[2:]]
    main()
