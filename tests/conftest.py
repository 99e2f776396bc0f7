"""Shared test plumbing.

Services (Docker Engine, a Prefect server) are real in these tests. When one is missing the test
says why and skips on a developer's machine; under CI (CI=true) a missing service is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def need(condition: bool, why: str) -> None:
    """Skip (or, under CI, fail) the calling test when a service or input is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    need(SHARED_DATA.is_dir(), f"reference data not found at {SHARED_DATA} (../shared/data)")
    return SHARED_DATA
