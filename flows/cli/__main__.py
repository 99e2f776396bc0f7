"""`python -m flows.cli`: the `gradebook` command without its console script."""

from flows.cli._app import main

main()
