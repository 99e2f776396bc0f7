#!/usr/bin/env bash
# Make a Docker Engine answer on this machine, installing and starting it when missing.
#
# Idempotent: a running engine is left alone. Installs Debian's `docker.io` only when dockerd is
# absent and we are root on a Debian-like system (apt-get present); otherwise says what to do.
# dockerd is started in the background (this machine may have no systemd) and we wait until it
# answers `docker info`, so the next step can build the sandbox image straight away.
set -euo pipefail

WAIT_S="${GRADEBOOK_DOCKER_WAIT_S:-60}"
LOG="${GRADEBOOK_DOCKERD_LOG:-/var/log/gradebook-dockerd.log}"

say() { echo "ensure_docker: $*" >&2; }

engine_answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

if engine_answers; then
    say "Docker Engine already running ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [[ "$(id -u)" != 0 ]]; then
        say "dockerd is not installed and we are not root: install Docker Engine (Debian: sudo apt-get install -y docker.io) and start it, then re-run"
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "dockerd is not installed and apt-get is missing: install Docker Engine for this OS, start it, then re-run"
        exit 1
    fi
    say "installing docker.io with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # debootstrap builds the sandbox base image when no registry is reachable.
    apt-get install -y -qq docker.io debootstrap >/dev/null
fi

if [[ "$(id -u)" != 0 ]]; then
    say "dockerd is installed but not running and we are not root: start it (sudo systemctl start docker) and re-run"
    exit 1
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    say "starting dockerd in the background (log: $LOG)"
    # containerd is bundled by docker.io; dockerd starts its own when none is running.
    # its own session: it outlives the shell (and process group) that started it
    setsid nohup dockerd >"$LOG" 2>&1 </dev/null &
    disown || true
fi

for _ in $(seq 1 "$WAIT_S"); do
    if docker info >/dev/null 2>&1; then
        say "Docker Engine is up ($(docker version --format '{{.Server.Version}}'))"
        exit 0
    fi
    sleep 1
done
say "dockerd did not answer within ${WAIT_S}s: see $LOG"
exit 1
