"""environ_set: a block's environment changes are undone, so a caller's settings survive."""

from __future__ import annotations

import os

import pytest

from flows.runtime.envvars import environ_set


def test_restores_set_variables_and_unsets_new_ones_even_on_error(monkeypatch) -> None:
    monkeypatch.setenv("GRADEBOOK_T_KEPT", "mine")
    monkeypatch.delenv("GRADEBOOK_T_NEW", raising=False)
    with pytest.raises(RuntimeError, match="flow failed"):
        with environ_set({"GRADEBOOK_T_KEPT": "block", "GRADEBOOK_T_NEW": ""}):
            assert os.environ["GRADEBOOK_T_KEPT"] == "block"
            assert os.environ["GRADEBOOK_T_NEW"] == ""
            raise RuntimeError("flow failed")
    assert os.environ["GRADEBOOK_T_KEPT"] == "mine"
    assert "GRADEBOOK_T_NEW" not in os.environ
