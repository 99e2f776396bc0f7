"""The `gradebook` command line (Typer): `app`, and `main`, the console script's entry point.

One module per command group, each adding its commands to `app` (`_app`): `pipeline` (sweep,
generate, score, rescore, verifiers, serve), `demo`, `warehouse` (ingest, sql, export, ...),
`gate` (gate, report), `sandbox`, `cluster`, `reward`, `server`. A command parses and checks
its input, then calls the stage in `flows` that does the work.
"""

from flows.cli._app import app, main

__all__ = ["app", "main"]
