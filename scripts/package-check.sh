#!/usr/bin/env bash
# The operator's path, on the installed Debian package (scripts/deb.sh):
# install it with dpkg -i; check the unit (systemd-analyze verify), the man
# pages and the bash completion it ships; start the daemon without dedup
# flags and with a metrics-only listener; turn dedup on and create two
# workload VMs with the CLI; scrape /metrics from the metrics listener and
# check it with promtool (no report allowed); stop the daemon with SIGTERM:
# exit status 0, socket removed, KSM knobs as found; remove the package.
# Needs root, /dev/kvm, curl, man, systemd-analyze.
#   scripts/package-check.sh [DEB]     # default: builds it with scripts/deb.sh
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "package-check: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

DEB=${1:-$(scripts/deb.sh | tail -n1)}
PROMTOOL=$(scripts/promtool.sh)
installed() { [[ $(dpkg-query -W -f='${Status}' pagefold 2>/dev/null) == "install ok installed" ]]; }
if installed; then
    fail "a pagefold package is installed already; this check installs and removes its own"
fi
WORK=$(mktemp -d /tmp/pagefold-package-check.XXXXXX)
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        # What the killed daemon left changed (docs/global-state.md).
        /usr/bin/pagefold ksm restore >/dev/null 2>&1 || true
    fi
    installed && dpkg -P pagefold >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

log "dpkg -i $DEB"
dpkg -i "$DEB" >/dev/null
PF=/usr/bin/pagefold
[[ -x $PF ]] || fail "$PF missing after dpkg -i"
$PF --version | grep -q "commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
    || fail "--version: $($PF --version)"
man -w pagefold-serve >/dev/null || fail "no man page pagefold-serve"
systemd-analyze verify /lib/systemd/system/pagefold.service || fail "systemd-analyze verify"
bash -c 'source /usr/share/bash-completion/completions/pagefold && complete -p pagefold' >/dev/null \
    || fail "bash completion"

ksm_knobs() { (cd /sys/kernel/mm/ksm && grep -H . run pages_to_scan sleep_millisecs max_page_sharing 2>/dev/null); }
knobs_before=$(ksm_knobs)
SOCK=$WORK/api.sock
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PAGEFOLD_API_SOCK=$SOCK
log "pagefold serve (no dedup flags), metrics on 127.0.0.1:$PORT"
$PF serve --metrics-addr "127.0.0.1:$PORT" >"$WORK/serve.out" 2>"$WORK/serve.err" &
pid=$!
for _ in $(seq 200); do [[ -S $SOCK ]] && break; sleep 0.1; done
[[ -S $SOCK ]] || fail "no API socket: $(cat "$WORK/serve.err")"

$PF dedup set mode=on >/dev/null || fail "dedup set mode=on"
for vm in vm0 vm1; do
    cat <<TOML
[[vm]]
name = "$vm"
memory = "128M"
serial = "null"
dedup = { group = "g" }
[vm.workload]
seed = 3
shared = "64M"
private = "16M"
phases = ["fill", "wait"]

TOML
done >"$WORK/vms.toml"
$PF vm create --config "$WORK/vms.toml" >/dev/null || fail "vm create"
sharing=0
for _ in $(seq 120); do
    sharing=$($PF status -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["dedup"]["pages_sharing"])')
    ((sharing > 8000)) && break
    sleep 0.5
done
((sharing > 8000)) || fail "only $sharing pages sharing after 60 s"
log "merged: $sharing pages sharing"

curl -sf "http://127.0.0.1:$PORT/metrics" >"$WORK/metrics" || fail "scraping the metrics listener"
grep -q '^pagefold_dedup_pages_sharing ' "$WORK/metrics" || fail "no pages_sharing in the metrics"
report=$("$PROMTOOL" check metrics <"$WORK/metrics" 2>&1) || fail "promtool check metrics: $report"
[[ -z $report ]] || fail "promtool check metrics reports: $report"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/v1/vms")
[[ $code == 404 ]] || fail "the metrics listener answered /api/v1/vms with $code"
"$PROMTOOL" check rules /usr/share/pagefold/prometheus/pagefold.rules.yml >/dev/null \
    || fail "promtool check rules"

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
((status == 0)) || fail "serve exited $status on SIGTERM: $(tail -5 "$WORK/serve.err")"
[[ ! -e $SOCK ]] || fail "the socket outlived the daemon"
[[ $(ksm_knobs) == "$knobs_before" ]] || fail "KSM knobs changed: before $knobs_before, after $(ksm_knobs)"

# Purged, not only removed: a removed package with maintainer scripts
# stays in dpkg's database ("config-files") until it is purged.
dpkg -P pagefold >/dev/null
[[ ! -e $PF ]] || fail "$PF left after dpkg -P"
! installed || fail "still installed after dpkg -P"
log "ok: installed, scraped ($(grep -c '^# TYPE' "$WORK/metrics") families, promtool clean), stopped (exit 0), purged"
