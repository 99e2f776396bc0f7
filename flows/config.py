"""Deprecated: the sweep config moved to `sweeps.config`; this path re-exports it for one release."""

from flows._moved import reexport

reexport(__name__, "sweeps.config", globals())
