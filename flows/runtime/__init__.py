"""What every stage runs on: the local Prefect server and session, process control, terminal output.

- `server`, `background_server`, `server_homes`, `server_leases`, `session`: the shared local
  Prefect servers (one home per Prefect version; the leases of the commands using one, so no
  command stops it under another) and a flow run's connection to it;
- `interrupts`, `procs`, `run_owner`, `envvars`: Ctrl-C/SIGTERM, process groups and
  parent-death signals, which process owns a flow run (so a crashed one is marked), scoped
  environment variables;
- `console`, `progress`: the terminal conventions (quiet Prefect logs, progress bars).
"""
