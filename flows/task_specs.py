"""Deprecated: loading the tasks a config names moved to `sweeps.tasks`; this path re-exports it for one release."""

from flows._moved import reexport

reexport(__name__, "sweeps.tasks", globals())
