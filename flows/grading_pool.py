"""Deprecated: the scoring stage's worker pool moved to `scorers.workers.pool`; this path re-exports it for one release."""

from flows._moved import reexport

reexport(__name__, "scorers.workers.pool", globals())
