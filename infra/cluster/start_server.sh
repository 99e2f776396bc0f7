#!/usr/bin/env bash
# Start the Prefect server every gradebook host talks to (API + UI on port 4200).
#
# Database: SQLite in $PREFECT_HOME (~/.prefect) by default, fine for one dispatcher and a few
# dozen workers. For more, or for a server you back up with the rest of your databases, use
# PostgreSQL: set GRADEBOOK_PREFECT_DB to an asyncpg URL (infra/cluster/postgres.sh makes one).
#
#   infra/cluster/start_server.sh
#   GRADEBOOK_PREFECT_DB=postgresql+asyncpg://prefect@db-host:5432/prefect infra/cluster/start_server.sh
#
# Then on every host: export PREFECT_API_URL=http://<this-host>:4200/api
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
HOST="${PREFECT_SERVER_HOST:-0.0.0.0}"
PORT="${PREFECT_SERVER_PORT:-4200}"

export PREFECT_SERVER_ANALYTICS_ENABLED=false
if [[ -n "${GRADEBOOK_PREFECT_DB:-}" ]]; then
    export PREFECT_API_DATABASE_CONNECTION_URL="$GRADEBOOK_PREFECT_DB"
fi
# the UI in a browser on another machine must call this host, not 127.0.0.1
export PREFECT_UI_API_URL="${PREFECT_UI_API_URL:-http://$(hostname -f):$PORT/api}"
exec "$PY" -m prefect server start --host "$HOST" --port "$PORT" --analytics-off
