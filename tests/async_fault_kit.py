"""An async grade (it binds, as an Inspect scorer's does: scorers.workers.async_grading) whose
binding fails with an error no grading code expects: importable by a grading worker."""

from __future__ import annotations


class BindFails:
    def bind(self):
        raise RuntimeError("the scorer's package is broken")
