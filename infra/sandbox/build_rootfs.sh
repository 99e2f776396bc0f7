#!/usr/bin/env bash
# Build the sandbox root filesystem into DIR: a minimal Debian with python3 and two users.
#
# Usage: build_rootfs.sh DIR
#
# No registry is needed: debootstrap fetches .deb files from the machine's own apt mirror, so
# the image builds wherever `apt-get install` works. `gradebook sandbox build` calls this, then
# `docker import`s DIR. Every file in infra/sandbox/ is hashed into the image tag, so editing
# this script (or users.env) rebuilds the image and an unchanged recipe is reused.
set -euo pipefail

DIR="${1:?usage: build_rootfs.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=users.env
source "$HERE/users.env"
SUITE="${GRADEBOOK_SANDBOX_SUITE:-bookworm}"

say() { echo "build_rootfs: $*" >&2; }

if [[ "$(id -u)" != 0 ]]; then
    say "debootstrap needs root: run as root (or sudo) to build the sandbox image"
    exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    say "debootstrap is missing: apt-get install -y debootstrap"
    exit 1
fi

# The first http(s) Debian mirror in the apt sources (deb822 .sources files or one-line lists).
mirror_from_apt() {
    local f
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        grep -hoE 'https?://[^ ]+/debian/?( |$)' "$f" 2>/dev/null | grep -v security | head -n1 | tr -d ' ' && return 0
    done
    return 1
}
MIRROR="${GRADEBOOK_SANDBOX_MIRROR:-$(mirror_from_apt || true)}"
if [[ -z "$MIRROR" ]]; then
    say "no Debian mirror found in /etc/apt/sources*: set GRADEBOOK_SANDBOX_MIRROR=http://deb.debian.org/debian"
    exit 1
fi

say "debootstrap $SUITE from $MIRROR into $DIR (about 80 s)"
debootstrap --variant=minbase --include=python3 "$SUITE" "$DIR" "$MIRROR" >&2

# Two unprivileged users: the harness holds the tests, the submission runs as another uid so
# it can neither signal, ptrace nor read /proc of the harness.
echo "harness:x:${HARNESS_UID}:${HARNESS_UID}:gradebook harness:/nonexistent:/usr/sbin/nologin" >>"$DIR/etc/passwd"
echo "harness:x:${HARNESS_UID}:" >>"$DIR/etc/group"
echo "sandbox:x:${SANDBOX_UID}:${SANDBOX_UID}:gradebook submission:/work:/usr/sbin/nologin" >>"$DIR/etc/passwd"
echo "sandbox:x:${SANDBOX_UID}:" >>"$DIR/etc/group"
mkdir -p "$DIR/work"
# `python` as well as `python3`: Inspect scorers (inspect_evals' class_eval, humaneval, mbpp)
# run `python -c ...` in the sandbox a workspace is restored into (docs/concepts/workspaces.md).
ln -sf python3 "$DIR/usr/bin/python"

# Nothing in the image needs these at run time; smaller image, faster import.
rm -rf "$DIR/var/cache/apt/archives/"*.deb "$DIR/var/lib/apt/lists/"* "$DIR/usr/share/doc" \
    "$DIR/usr/share/man" "$DIR/usr/share/locale"
say "root filesystem ready in $DIR"
