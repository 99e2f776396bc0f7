"""Deprecated: the offline OpenAI-compatible model server moved to `sweeps.mock_server`; this path re-exports it for one release."""

from flows._moved import reexport

reexport(__name__, "sweeps.mock_server", globals())

if __name__ == "__main__":  # `python -m flows.mock_server` as documented before the move
    import sys

    from sweeps.mock_server import main

    sys.exit(main())
