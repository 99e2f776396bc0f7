#!/usr/bin/env bash
# A PostgreSQL database for the Prefect server, from Debian's packages, in its own data directory
# (it does not touch the system's default cluster). Prints the URL for GRADEBOOK_PREFECT_DB.
# infra/cluster/start_server.sh runs it by default.
#
#   infra/cluster/postgres.sh start /srv/prefect-pg 5433    # installs postgresql if missing
#   infra/cluster/postgres.sh stop  /srv/prefect-pg
#
# `start` on a data directory whose server already runs reuses it (on the port it runs on).
#
# Local connections are trusted; on a shared network put a password on the `prefect` role and
# restrict pg_hba.conf. Back up this database with pg_dump (it holds flow-run history only; the
# scores live in the DuckDB warehouse).
set -euo pipefail
cmd="${1:?usage: postgres.sh start|stop DATADIR [PORT]}"
DATA="${2:?give a data directory, e.g. /srv/prefect-pg}"
PORT="${3:-5433}"

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "postgres.sh: PostgreSQL is not installed; run as root (apt-get install -y postgresql)" >&2
        exit 2
    fi
    # a fresh image may have no package lists yet: update once, only when the package is unknown
    apt-cache show postgresql >/dev/null 2>&1 || apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q postgresql >/dev/null
fi
BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
as_pg() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "$cmd" in
start)
    mkdir -p "$DATA"
    [[ $(id -u) -eq 0 ]] && chown postgres:postgres "$DATA" && chmod 700 "$DATA"
    if [[ ! -f "$DATA/PG_VERSION" ]]; then
        as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >/dev/null
    fi
    if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        PORT="$(sed -n 4p "$DATA/postmaster.pid")"  # the 4th line of postmaster.pid: its port
    else
        as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w \
            -o "-p $PORT -k $DATA -c listen_addresses=127.0.0.1" start >/dev/null
    fi
    if ! as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'prefect'" | grep -q 1; then
        as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres prefect
    fi
    echo "postgresql+asyncpg://postgres@127.0.0.1:$PORT/prefect"
    ;;
stop)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    ;;
*)
    echo "postgres.sh: unknown command $cmd (start|stop)" >&2
    exit 2
    ;;
esac
