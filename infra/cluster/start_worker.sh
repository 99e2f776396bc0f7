#!/usr/bin/env bash
# Join this host to a work pool as a Prefect process worker, polling every 2 s (Prefect's
# default 10 s adds up to 10 s to every generate -> score hop).
#   PREFECT_API_URL=http://prefect-host:4200/api infra/cluster/start_worker.sh gpu
#   PREFECT_API_URL=http://prefect-host:4200/api infra/cluster/start_worker.sh cpu --limit 1
# The host needs gradebook installed (the dispatcher's version, with the packages the config's
# tasks and verifier_modules name), the bucket's credentials and endpoint in its environment
# (the standard AWS chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE or a role,
# AWS_ENDPOINT_URL for a store other than AWS), and (gpu) the model server it calls. It shares
# no path with the other hosts; on a host with the package installed, `gradebook cluster worker
# gpu` is the same command.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# this checkout's environment (`make install`) if it has one, else the installed `gradebook`
if [ -x "$ROOT/.venv/bin/gradebook" ]; then
    exec "$ROOT/.venv/bin/gradebook" cluster worker "$@"
fi
exec gradebook cluster worker "$@"
