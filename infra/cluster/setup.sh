#!/usr/bin/env bash
# Create the `gpu` and `cpu` process work pools, deploy gradebook's cluster flows to them from
# this checkout, and add the automation that marks a dead host's flow runs Crashed.
# Idempotent; run it once per server (and again after moving the checkout).
#   PREFECT_API_URL=http://prefect-host:4200/api infra/cluster/setup.sh [--gpu-pool P] [--cpu-pool P]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec "$ROOT/.venv/bin/gradebook" cluster setup "$@"
