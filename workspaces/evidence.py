"""Evidence: every sandbox call a scorer makes while it grades, kept with its score.

A `RecordingSandbox` stands between a scorer and its sandbox (Inspect's `SandboxEnvironment`
API, so the scorer runs unchanged) and notes each `exec`, `read_file` and `write_file`: the
command (or path), its exit code, its stdout and stderr cut to `MAX_OUTPUT` characters each,
how long it took, and an error it raised. The calls go into the score row's metadata under
`sandbox` (with what was restored), so they are in the warehouse (the `sandbox_calls` view) and
in scored copies of the log: a judge reading them, or a person asking why a sample failed,
needs no container.

A call is `complete` when what it returned is kept whole (nothing cut, text not bytes), and
names what it was given by sha256 (`input_sha256`, `contents_sha256`, `env_sha256`): a grading
whose calls were all complete can be replayed from its evidence (workspaces.restore: a judge
scorer whose judge failed is judged again from the warehouse alone, with no container).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, Union, overload

from inspect_ai.util import ExecResult, SandboxEnvironment

__all__ = ["MAX_CALLS", "MAX_OUTPUT", "Evidence", "RecordingSandbox"]

MAX_OUTPUT = 4000  # characters of stdout / stderr kept per call (head and tail)
MAX_CALLS = 100  # calls kept per sample; the rest are counted


def sha256_of(value: str | bytes | dict[str, str] | None) -> str | None:
    """The sha256 of what a call was given (text as UTF-8, an env as sorted JSON); None: none."""
    import hashlib
    import json

    if value is None:
        return None
    if isinstance(value, dict):
        value = json.dumps(value, sort_keys=True)
    data = value.encode() if isinstance(value, str) else value
    return hashlib.sha256(data).hexdigest()


def _whole(*texts: str | bytes | None) -> bool:
    return all(t is None or (isinstance(t, str) and len(t) <= MAX_OUTPUT) for t in texts)


def _cut(text: str | bytes | None) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if len(text) <= MAX_OUTPUT:
        return text
    half = MAX_OUTPUT // 2
    return f"{text[:half]}\n[... {len(text) - MAX_OUTPUT} characters cut ...]\n{text[-half:]}"


@dataclass
class Evidence:
    """The sandbox calls of one sample's grading, and what its sandboxes started from."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    restored: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, call: dict[str, Any]) -> None:
        self.total += 1
        if len(self.calls) < MAX_CALLS:
            self.calls.append(call)

    def to_json(self) -> dict[str, Any]:
        return {"restored": self.restored, "calls": self.calls, "calls_total": self.total}


class RecordingSandbox(SandboxEnvironment):
    """A sandbox whose calls are noted in `evidence` (under `name`), then passed to `inner`."""

    def __init__(self, name: str, inner: SandboxEnvironment, evidence: Evidence) -> None:
        super().__init__()
        self._name = name
        self._inner = inner
        self._evidence = evidence

    def _note(self, op: str, t0: float, **fields: Any) -> None:
        self._evidence.add(
            {
                "sandbox": self._name,
                "op": op,
                "seconds": round(time.perf_counter() - t0, 4),
                **fields,
            }  # fmt: skip
        )

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        t0 = time.perf_counter()
        given = {"command": list(cmd), "cwd": cwd, "user": user,
                 "input_sha256": sha256_of(input), "env_sha256": sha256_of(env or None)}  # fmt: skip
        try:
            result = await self._inner.exec(
                cmd, input, cwd, env, user, timeout, timeout_retry, concurrency
            )
        except BaseException as exc:
            self._note("exec", t0, **given, exit_code=None, complete=False,
                       error=f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
            raise
        self._note("exec", t0, **given, exit_code=result.returncode,
                   stdout=_cut(result.stdout), stderr=_cut(result.stderr),
                   complete=_whole(result.stdout, result.stderr))  # fmt: skip
        return result

    async def write_file(self, file: str, contents: str | bytes) -> None:
        t0 = time.perf_counter()
        given = {"path": file, "bytes": len(contents), "contents_sha256": sha256_of(contents)}
        try:
            await self._inner.write_file(file, contents)
        except BaseException as exc:
            self._note("write_file", t0, **given, complete=False,
                       error=f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
            raise
        self._note("write_file", t0, **given, complete=True)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007
        t0 = time.perf_counter()
        try:
            data = await self._inner.read_file(file, text)  # type: ignore[call-overload]
        except BaseException as exc:
            self._note("read_file", t0, path=file, text=text, complete=False,
                       error=f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
            raise
        self._note("read_file", t0, path=file, text=text, bytes=len(data), content=_cut(data),
                   complete=_whole(data))  # fmt: skip
        return data

    @classmethod
    async def sample_cleanup(cls, *args: Any, **kwargs: Any) -> None:
        """Not a provider: restore's `Sandboxes.aclose` removes the containers."""
