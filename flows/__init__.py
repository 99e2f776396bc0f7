"""gradebook: the Prefect flows (generate, score, rescore, sweep, serve, demo) and the CLI."""

import os as _os

# Prefect reads its settings when first imported, so this must run before any flow module
# imports it: a server on SQLite with telemetry on prints "database is locked" tracebacks.
_os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
