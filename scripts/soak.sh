#!/usr/bin/env bash
# Soak test of `pagefold serve`: VMs created and deleted through the
# API, dedup mode/knob changes, auto-threshold flapping and concurrent API load
# for DURATION, then checks for guest mismatches, leaked pool pages, fds and
# mappings, RSS, engine stalls, 5xx answers and crashes.
#
#   scripts/soak.sh DURATION [soak.py options]     # DURATION: 300, 300s, 30m, 1h
#
# Uses target/release/pagefold of this tree (built if missing; set PAGEFOLD to
# use another binary). Progress goes to stderr every ~10 s, a summary table at
# the end; the server's log, the guests' serial logs of failed VMs and
# summary.json stay in $SOAK_DIR (default: a new directory under /tmp).
# Exit status: 0 pass, 1 a check failed, 2 bad usage.
set -euo pipefail

usage() { echo "usage: $0 DURATION (e.g. 300s, 30m, 1h) [soak.py options]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dur=$1; shift
case $dur in
  *h) secs=$(( ${dur%h} * 3600 )) ;;
  *m) secs=$(( ${dur%m} * 60 )) ;;
  *s) secs=${dur%s} ;;
  *) secs=$dur ;;
esac
[[ $secs =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || usage

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${PAGEFOLD:-$root/target/release/pagefold}
if [ -z "${PAGEFOLD:-}" ] && [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release)
fi
[ -x "$bin" ] || { echo "soak: no pagefold binary at $bin" >&2; exit 2; }
[ -w /dev/kvm ] || { echo "soak: /dev/kvm is not usable" >&2; exit 2; }

dir=${SOAK_DIR:-$(mktemp -d /tmp/pagefold-soak.XXXXXX)}
mkdir -p "$dir"
exec python3 "$root/scripts/soak.py" --bin "$bin" --duration "$secs" --workdir "$dir" "$@"
