#!/usr/bin/env bash
# Headless Chromium for the report rendering test (tests/test_report_render.py).
# Idempotent: does nothing when a chromium binary is already on PATH. Needs root on Debian;
# elsewhere it says what to install and exits 0 so `make services` still runs the rest
# (the test itself skips locally, and fails under CI, when chromium is missing).
set -euo pipefail

for bin in chromium chromium-browser google-chrome; do
    if command -v "$bin" >/dev/null 2>&1; then
        echo "chromium: found $(command -v "$bin")"
        exit 0
    fi
done

if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium: not installed; install Debian's 'chromium' package (apt-get install -y chromium) as root" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# `apt-get update` only when the package lists do not know chromium yet (a fresh image).
if ! apt-cache show chromium >/dev/null 2>&1; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
fi
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "chromium: installed $(command -v chromium)"
