"""extract_code: which part of a model's answer is the code (a table of cases, no Docker)."""

from __future__ import annotations

import pytest

from scorers.code import extract_code, unit_tests_for

CASES = [
    ("```python\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),
    # the last python block wins: drafts come first
    (
        "draft:\n```python\ndef f(): return 0\n```\nfinal:\n```python\ndef f(): return 1\n```",
        "def f(): return 1\n",
    ),
    # an untagged fence counts; other languages do not
    ("```\ndef g(): pass\n```\n```bash\nrm -rf /\n```", "def g(): pass\n"),
    ("```py\nx = 1\n```", "x = 1\n"),
    # an unterminated final fence runs to the end
    ("```python\ndef h():\n    return 2\n", "def h():\n    return 2\n"),
    # unfenced: taken only when it parses and defines something
    ("def k(a):\n    return a\n", "def k(a):\n    return a\n"),
    ("The answer is 42.", None),
    ("x = 1 + 1", None),
    ("```bash\necho hi\n```", None),
    ("", None),
    ("```python\n\n```", None),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_extract_code(text, expected):
    assert extract_code(text) == expected


def test_unfenced_source_is_parsed_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = f"import os\nopen({str(marker)!r}, 'w')\ndef f():\n    pass\n"
    assert extract_code(text) is not None
    assert not marker.exists()


def test_tests_from_humaneval_and_mbpp_metadata():
    humaneval = {"test": "def check(candidate):\n    assert candidate(1)\n", "entry_point": "f"}
    tests, entry = unit_tests_for(humaneval)
    assert tests.rstrip().endswith("check(f)") and entry == "f"
    mbpp = {"test_list": ["assert f(1) == 2"], "test_imports": ["import math"]}
    assert unit_tests_for(mbpp) == ("import math\nassert f(1) == 2\n", None)
    assert unit_tests_for({"answer": "3"}) is None
