#!/usr/bin/env bash
# Create the `gpu` and `cpu` process work pools, deploy gradebook's cluster flows to them, and
# add the automation that marks a dead host's flow runs Crashed. The deployments name the flows
# by module with no pull step: each worker runs them from the gradebook installed in its own
# environment (`pip install gradebook`), so the hosts share no path (docs/how-to/cluster.md).
# Idempotent; run it once per server, from any host that reaches it.
#   PREFECT_API_URL=http://prefect-host:4200/api infra/cluster/setup.sh [--gpu-pool P] [--cpu-pool P]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# this checkout's environment (`make install`) if it has one, else the installed `gradebook`
if [ -x "$ROOT/.venv/bin/gradebook" ]; then
    exec "$ROOT/.venv/bin/gradebook" cluster setup "$@"
fi
exec gradebook cluster setup "$@"
