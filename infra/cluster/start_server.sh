#!/usr/bin/env bash
# Start the Prefect server every gradebook host talks to (API + UI on port 4200).
#
# Database: PostgreSQL by default. On SQLite (one file, one writer at a time) Prefect's server
# fails writes with "database is locked" tracebacks as soon as a few workers report at once, even
# with one GPU and one CPU worker; Prefect already runs SQLite in WAL mode with a 60 s busy
# timeout, and no setting of its removes the rest (a transaction that read before another
# committed cannot write). So, by GRADEBOOK_PREFECT_DB:
#
#   unset       a PostgreSQL of its own (infra/cluster/postgres.sh), started if it is not running,
#               in GRADEBOOK_PREFECT_PG_DIR (default /var/lib/gradebook/prefect-postgres as root,
#               else ~/.local/state/gradebook/prefect-postgres) on GRADEBOOK_PREFECT_PG_PORT (5433)
#   an asyncpg URL          that database (postgresql+asyncpg://prefect@db-host:5432/prefect)
#   sqlite      SQLite in $PREFECT_HOME (~/.prefect): one worker host, a trial
#
# Where PostgreSQL cannot be had (not installed, and not root to install it) it says so and uses
# SQLite.
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
say() { echo "start_server.sh: $*" >&2; }

export PREFECT_SERVER_ANALYTICS_ENABLED=false
DB="${GRADEBOOK_PREFECT_DB:-}"
if [[ -z "$DB" ]]; then
    if [[ $(id -u) -eq 0 ]]; then
        default_dir=/var/lib/gradebook/prefect-postgres
    else
        default_dir="${XDG_STATE_HOME:-$HOME/.local/state}/gradebook/prefect-postgres"
    fi
    PG_DIR="${GRADEBOOK_PREFECT_PG_DIR:-$default_dir}"
    if DB="$(bash "$ROOT/infra/cluster/postgres.sh" start "$PG_DIR" "${GRADEBOOK_PREFECT_PG_PORT:-5433}")"; then
        say "Prefect database: PostgreSQL in $PG_DIR ($DB); stop it with infra/cluster/postgres.sh stop $PG_DIR"
    else
        say "no PostgreSQL (see above): using SQLite, where Prefect logs 'database is locked' once several workers report; set GRADEBOOK_PREFECT_DB=sqlite to choose it"
        DB=sqlite
    fi
fi
if [[ "$DB" == sqlite ]]; then
    say "Prefect database: SQLite in ${PREFECT_HOME:-$HOME/.prefect}"
else
    export PREFECT_API_DATABASE_CONNECTION_URL="$DB"
fi
# the UI in a browser on another machine must call this host, not 127.0.0.1
export PREFECT_UI_API_URL="${PREFECT_UI_API_URL:-http://$(hostname -f):$PORT/api}"
exec "$PY" -m prefect server start --host "$HOST" --port "$PORT" --analytics-off
