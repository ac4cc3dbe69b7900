#!/usr/bin/env bash
# Prints the path of a `promtool` (Prometheus' checker of expositions and
# rule files): the one on PATH if there is one, else the one in Debian's
# `prometheus` package, downloaded once and unpacked into
# target/tools/prometheus without installing the package (no daemon, no
# service, no root needed once apt knows the package).
#
#   scripts/promtool.sh            # prints the path
#   "$(scripts/promtool.sh)" check rules scripts/prometheus/pagefold.rules.yml
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v promtool >/dev/null; then
    command -v promtool
    exit 0
fi
CACHE=target/tools/prometheus
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
if [[ ! -x $CACHE/root/usr/bin/promtool ]]; then
    DK_NAME=promtool
    # shellcheck source=scripts/lib/debian-kernel.sh
    . scripts/lib/debian-kernel.sh
    if ! apt-cache show prometheus >/dev/null 2>&1; then
        dk_log "apt does not know prometheus; running apt-get update"
        apt-get update -qq
    fi
    deb=$(dk_fetch prometheus "$CACHE")
    dk_unpack "$deb" "$CACHE/root"
fi
echo "$CACHE/root/usr/bin/promtool"
