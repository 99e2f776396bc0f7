"""What every stage runs on: the local Prefect server and session, process control, terminal output.

- `server`, `background_server`, `session`: the one shared local Prefect server and a flow
  run's connection to it;
- `interrupts`, `procs`, `run_owner`, `envvars`: Ctrl-C/SIGTERM, process groups and
  parent-death signals, which process owns a flow run (so a crashed one is marked), scoped
  environment variables;
- `console`, `progress`: the terminal conventions (quiet Prefect logs, progress bars).
"""
