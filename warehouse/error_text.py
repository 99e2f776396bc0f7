"""Generation errors in words a user can act on, and the "errors" that are not errors.

Inspect stores a sample's error as `repr()` of the exception that ended it. When the model API
kept failing, that is tenacity's wrapper, `RetryError(<Future at 0x... raised
APIConnectionError>)`: it names neither the cause nor the server. The traceback Inspect stores
beside it holds the whole chain of causes, so the warehouse's `error` column is rebuilt from
that chain plus the model and server the run talked to. The traceback is stored unchanged.

A sample in flight when its eval was cancelled (Ctrl-C, a stopped sweep, a sibling's failure
tearing the eval down) is logged with the cancellation as its error: it was not generated, it
did not fail (`is_cancellation`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "did_you_mean",
    "import_error",
    "is_cancellation",
    "one_line",
    "readable_error",
    "where_raised",
]

_WRAPPER = re.compile(r"^RetryError\(<Future at 0x[0-9a-f]+ state=\w+ raised (\w+)>\)$")
# the separators Python prints between the exceptions of a chain
_CHAINED = re.compile(
    r"\n\s*\n(?:The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)\s*\n\s*\n"
)
_LIMIT = 500


# How Inspect words a cancelled sample's error: the repr of the event loop's cancellation
# exception, "CancelledError('Cancelled via cancel scope ...')" (asyncio) or "Cancelled()"
# (trio). Inspect tells a cancelled sample from a failed one by this prefix too (its sample
# sources' docs, and inspect_ai._util.error.is_cancellation_message), and words an operator's
# "error" interrupt as a RuntimeError precisely so that it is not taken for one.
_CANCELLED = ("CancelledError(", "Cancelled(")


def is_cancellation(message: str | None) -> bool:
    """Whether a sample's stored error is its cancellation (not generated, not an error)."""
    return message is not None and message.startswith(_CANCELLED)


def readable_error(message: str | None, traceback: str | None, server: str | None) -> str | None:
    """`message`, or for a bare RetryError the chain of causes read from `traceback`:
    "APIConnectionError: Connection error. (cause: ConnectError: All connection attempts
    failed), after retries, calling openai-api/local/m at http://127.0.0.1:9/v1".

    Args:
        message: the error message Inspect stored for the sample.
        traceback: the traceback text Inspect stored with it.
        server: what the run talked to ("<model> at <base url>", or the model), or None.
    """
    if not message or not _WRAPPER.match(message.strip()):
        return message
    chain = [e for e in _exceptions(traceback or "") if not e.startswith("RetryError")]
    if not chain:
        raised = _WRAPPER.match(message.strip())
        chain = [raised.group(1)] if raised else []
    outer, root = chain[-1] if chain else "error", chain[0] if chain else ""
    text = outer + (f" (cause: {root})" if root and root != outer else "") + ", after retries"
    if server:
        text += f", calling {server}"
    return text if len(text) <= _LIMIT else text[: _LIMIT - 3] + "..."


def _exceptions(traceback: str) -> list[str]:
    """The exception line of each link of a printed chain, innermost first, module dropped
    ("httpx.ConnectError: ..." -> "ConnectError: ..."), repeats of the previous link dropped."""
    out: list[str] = []
    for part in _CHAINED.split(traceback):
        lines = part.rstrip().splitlines()
        # the exception is what follows the last indented line (frames, code, carets)
        last_indented = max((i for i, ln in enumerate(lines) if ln.startswith(" ")), default=-1)
        text = " ".join(" ".join(lines[last_indented + 1 :]).split())
        if not text:
            continue
        name, sep, rest = text.partition(":")
        text = name.rsplit(".", 1)[-1] + sep + rest
        if not out or out[-1] != text:
            out.append(text)
    return out


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one short line ("Type: message") for a table cell or an error message."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split()).removesuffix(":")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def where_raised(exc: BaseException) -> str | None:
    """ "file:line" of the line of a module's own code that raised (a syntax error's own line),
    past the import machinery; None when unknown."""
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "importlib" not in f.filename and not f.filename.startswith("<frozen")
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def import_error(exc: BaseException, file: str | None = None) -> str:
    """A module's failure on import as "Type: message at file:line" (`file`, when the line is
    not known)."""
    text = one_line(exc, 200)
    where = where_raised(exc)
    if where:
        return f"{text} at {where}"
    return f"{text} in {file}" if file else text


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ " (did you mean 'math'?)": the names of `known` closest to a mistyped `name`; empty
    when none is close."""
    import difflib

    close = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
