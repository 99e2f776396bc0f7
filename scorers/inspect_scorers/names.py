"""The name an Inspect scorer's score rows are stored under, in every command the same.

One place for both sides: resolving a scorer spec into a verifier (scorers.inspect_scorers.specs)
and storing the scores a log already holds (warehouse.recorded_scores) must name a scorer
alike, or a recorded row and gradebook's re-score of it would read as two scorers.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["RESERVED_NAMES", "stored_name", "variant_name"]

# gradebook's bundled verifiers: an Inspect scorer of the same name (Inspect's own `math()`) is
# stored under its qualified registry name, so the two never read as versions of one verifier
RESERVED_NAMES = ("math", "unit_tests")


def stored_name(name: str, qualified: str | None = None) -> str:
    """The `scores.scorer` of an Inspect scorer's rows: its unqualified name (Inspect's own
    key in `sample.scores`), or the qualified one where that is a gradebook verifier's."""
    if name in RESERVED_NAMES:
        return qualified if qualified and qualified != name else f"inspect_ai/{name}"
    return name


_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.+-]{1,24}")


def variant_name(name: str, params: Mapping[str, Any] | None) -> str:
    """The name a scorer's rows are stored under when it has params: `match[numeric=true]`,
    `model_graded_qa[instructions=3f9a2c]` (a long or structured value by 6 hex digits of its
    JSON), so two variants of one scorer never share a name, and each variant's name is the
    same in every command; `name` itself without params."""
    if not params:
        return name
    parts = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, str) and _PLAIN_VALUE.fullmatch(value):
            text = value
        elif value is None or isinstance(value, bool | int | float):
            text = json.dumps(value)
        else:
            text = hashlib.sha256(
                json.dumps(value, default=str, sort_keys=True).encode()
            ).hexdigest()[:6]
        parts.append(f"{key}={text}")
    return f"{name}[{','.join(parts)}]"
