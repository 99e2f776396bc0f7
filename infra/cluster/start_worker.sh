#!/usr/bin/env bash
# Join this host to a work pool as a Prefect process worker, polling every 2 s (Prefect's
# default 10 s adds up to 10 s to every generate -> score hop).
#   PREFECT_API_URL=http://prefect-host:4200/api infra/cluster/start_worker.sh gpu
#   PREFECT_API_URL=http://prefect-host:4200/api infra/cluster/start_worker.sh cpu --limit 1
# The host needs this checkout at the same path as the server's deployments name, the shared
# log/staging directories mounted at the same paths, and (gpu) the model server it calls.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec "$ROOT/.venv/bin/gradebook" cluster worker "$@"
