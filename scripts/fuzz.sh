#!/usr/bin/env bash
# Builds and runs every cargo-fuzz target (fuzz/fuzz_targets) for
# SECONDS_PER_TARGET seconds each (default 60); fails on the first crash,
# leak, timeout or out-of-memory. Installs cargo-fuzz if it is missing.
# The build is cargo-fuzz's default (optimised, AddressSanitizer, debug
# assertions and overflow checks), except with --quick: unoptimised
# (`cargo fuzz build --dev`, the same sanitizer, assertions and checks,
# line tables for the reports) for CI's short smoke run, where building
# is most of the time (cold, build and six 12-s runs: 2:38 wall and 229
# CPU-s with --quick, 3:49 and 369 CPU-s optimised; docs/fuzzing.md).
# libFuzzer needs nightly flags: RUSTC_BOOTSTRAP=1 lets the stable
# toolchain take them. Builds go to fuzz/target (never the main target
# dir); new corpus entries go to fuzz/target/corpus/<target> (the seeds in
# fuzz/corpus stay as committed); crashes to fuzz/artifacts/<target>.
# Usage: scripts/fuzz.sh [--quick] [SECONDS_PER_TARGET] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Build options, the same for `cargo fuzz build` and `cargo fuzz run` (run
# builds first: other options would build everything again).
build_opts=()
if [[ ${1:-} == --quick ]]; then
    shift
    build_opts=(--dev)
    export CARGO_PROFILE_DEV_DEBUG=line-tables-only
fi

secs=${1:-60}
shift || true
if ! [[ $secs =~ ^[0-9]+$ ]] || ((secs < 1)); then
    echo "usage: $0 [--quick] [SECONDS_PER_TARGET] [TARGET...]" >&2
    exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
# The fuzz crate is its own workspace; its builds stay in fuzz/target.
target_dir="$PWD/fuzz/target"

if (($#)); then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

# Per target: the largest input worth trying.
max_len() {
    case $1 in
        kernel_loader) echo 131072 ;;
        virtio_blk | virtio_net | virtio_balloon | virtio_mmio | workload_mailbox) echo 32768 ;;
        *) echo 8192 ;;
    esac
}

echo "=== building ${#targets[@]} fuzz targets ${build_opts[*]}"
# One invocation for every target: the instrumented dependencies build once.
cargo fuzz build "${build_opts[@]}" --target-dir "$target_dir"

for t in "${targets[@]}"; do
    work="$target_dir/corpus/$t"
    log="$target_dir/$t.log"
    mkdir -p "$work" "fuzz/artifacts/$t"
    echo "=== fuzzing $t for ${secs} s"
    # libFuzzer adds new inputs to the first corpus dir only (the scratch
    # one): the committed seeds are read, never written.
    rc=0
    cargo fuzz run "${build_opts[@]}" --target-dir "$target_dir" "$t" "$work" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -max_len="$(max_len "$t")" \
        -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
        -print_final_stats=1 >"$log" 2>&1 || rc=$?
    grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" || true
    if ((rc != 0)) || grep -qE 'Test unit written|SUMMARY: |deadly signal' "$log"; then
        tail -n 40 "$log" >&2
        echo "error: fuzz target $t failed (exit $rc); full log $log, input in fuzz/artifacts/$t" >&2
        exit 1
    fi
done
echo "=== ${#targets[@]} fuzz targets ran ${secs} s each without a crash"
