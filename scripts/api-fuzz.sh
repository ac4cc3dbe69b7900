#!/usr/bin/env bash
# Fuzzes pagefold's HTTP API against api/openapi.json (the spec generated
# from the server's code, api/src/openapi.rs) with schemathesis:
# starts `pagefold serve` with one workload VM on a loopback TCP port, runs
# every schemathesis check (5xx, schema conformance of status codes, headers
# and bodies, negative data rejected, 405 on unknown methods...) for a
# bounded time, stops the server. Exit status: schemathesis's (0 = clean).
#
# Not fuzzed: PUT /shutdown (would end the server) and PUT /vms/{name}
# (would create VMs of any size, with serial output to any path); both are
# covered by the route, spec and end-to-end tests.
#
#   scripts/api-fuzz.sh                   # builds target/release/pagefold
#   PAGEFOLD_BIN=path/to/pagefold API_FUZZ_SECONDS=60 scripts/api-fuzz.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${PAGEFOLD_SCHEMATHESIS_VENV:-$HOME/.cache/pagefold/schemathesis-venv}
SECONDS_BUDGET=${API_FUZZ_SECONDS:-75}

if ! "$VENV/bin/schemathesis" --version >/dev/null 2>&1; then
    echo "api-fuzz: installing schemathesis into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet 'schemathesis>=4,<5'
fi

BIN=${PAGEFOLD_BIN:-}
if [ -z "$BIN" ]; then
    (cd "$ROOT" && cargo build --release --bin pagefold)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/pagefold
fi

PORT=${API_FUZZ_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
WORK=$(mktemp -d /tmp/pagefold-api-fuzz.XXXXXX)
PID=
cleanup() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID"
        wait "$PID" || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/vm.toml" <<'TOML'
[dedup]
mode = "on"

[[vm]]
name = "fuzz-vm"
memory = "64M"
serial = "null"

# A slow churn keeps the guest running guest code, so pausing it is quick
# (a guest blocked in a `wait` phase takes the VMM 10 s to pause).
[vm.workload]
shared = "24M"
private = "8M"
churn_permille = 100
churn_rate = 2000
churn_ms = 3600000
phases = ["fill", "churn"]
TOML

"$BIN" serve --config "$WORK/vm.toml" --api-sock "$WORK/api.sock" \
    --api-tcp "127.0.0.1:$PORT" >"$WORK/server.log" 2>&1 &
PID=$!

URL="http://127.0.0.1:$PORT/api/v1"
for _ in $(seq 100); do
    if curl -sf "$URL/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "api-fuzz: pagefold serve exited:"; cat "$WORK/server.log"; exit 1
    fi
    sleep 0.2
done
curl -sf "$URL/health" >/dev/null

status=0
"$VENV/bin/schemathesis" run "$ROOT/api/openapi.json" \
    --url "$URL" \
    --checks all \
    --max-time "$SECONDS_BUDGET" \
    --request-timeout 40 \
    --exclude-operation-id shutdown \
    --exclude-operation-id createVm \
    --no-color || status=$?

if ! kill -0 "$PID" 2>/dev/null; then
    echo "api-fuzz: pagefold serve died during the run:"; cat "$WORK/server.log"
    status=1
fi
exit "$status"
