#!/usr/bin/env bash
# Runs the dedup engine's test suite (pagefold-dedup: its unit tests and
# its tests/*.rs) on another host kernel, inside the emulated host of
# scripts/emulated-host.sh: the engine relies on kernel behaviour
# (userfaultfd write-protection, pagemap, mmap over guest RAM, KSM) that
# differs between kernels, and users bring Debian 12's 6.1.
#
#   scripts/engine-suite-on-kernel.sh [KERNEL] [-- TEST-ARGS...]
#
# KERNEL: 6.1 (default), 6.12, or a linux-image package (emulated-host.sh's
# --kernel). TEST-ARGS go to every test binary (e.g. a name filter).
# Exit status: 0 when every binary passed inside.
set -euo pipefail
cd "$(dirname "$0")/.."
KERNEL=${1:-6.1}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift

# The dedup crate's test binaries, as scripts/test.sh's `cargo test`
# builds and runs them natively: the same files, so nothing is built
# again after it. (`-p pagefold-dedup` would unify features over that
# package alone, and build it and its dependencies a second time.)
mapfile -t bins < <(cargo test --workspace --all-targets --features bench --no-run \
    --message-format=json 2>/dev/null |
    python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["profile"]["test"] and m["target"]["kind"] != ["bench"]
            and os.path.basename(os.path.dirname(m["manifest_path"])) == "dedup"):
        print(m["executable"])
')
((${#bins[@]})) || { echo "engine-suite-on-kernel: no test binaries built" >&2; exit 1; }

# Liveness bounds (an unmerge must finish within 30 s natively) are
# stretched 5 times here (PAGEFOLD_TEST_TIME_SCALE, dedup/tests/common):
# the same torture took 200-650 s from run to run in the emulated host,
# and its unmerges then missed the native bound.
# Tests whose bounds are times measured on a native host: under emulation
# everything runs 5-10x slower, so they would measure the emulator
# (docs/linux-guests.md: times compare only within one run). They run
# natively in scripts/test.sh.
# The pause tests (`scanner::pause::tests`) park a fake quiescer, no
# kernel in it, under pause budgets of 0.5-3 ms of real time: under
# emulation a step between two checkpoints can outlast them (a park
# ended "within the budget" in a rehearsal on 6.1).
TIMED=(
    registering_memory_waits_for_a_span_not_for_the_scanners_whole_batch
    scanner::pause::tests::
)
skips=()
for t in "${TIMED[@]}"; do skips+=(--skip "$t"); done
set -- "${skips[@]}" "$@"

# Tests that run after all the others, alone. The THP torture backs its
# regions with huge pages and splits them by the thousand; after it, the
# emulated host ran every later test several times slower (scanner
# wake-ups 8-30 s apart), so that torture_vm_churn, _write_log, _xxh3 and
# _long_runs_in_full_windows missed their 30 s unmerge deadline. In a
# fresh emulated host they pass (7 of 7 without it), with it running
# alongside (it and the longest: 2 of 2), and natively after it; with it
# in a process of its own they still failed after it: a slowdown of the
# emulated host as a whole, not of the engine's process.
LAST=torture_transparent_huge_pages

args=()
# shellcheck disable=SC2016
runner=(sh -c '
status=0
for b in $BINS; do
    echo "=== $b on $(uname -r)"
    if ! "$b" --test-threads=2 --skip "$LAST" "$@"; then
        echo "=== FAILED: $b"
        status=1
    fi
done
for b in $BINS; do
    # Only where the filters given select it.
    "$b" --list --format terse "$@" 2>/dev/null | grep -qx "$LAST: test" || continue
    echo "=== $b --exact $LAST on $(uname -r), last"
    if ! "$b" --exact "$LAST"; then
        echo "=== FAILED: $b $LAST"
        status=1
    fi
done
exit $status
' sh)
for b in "${bins[@]}"; do args+=(--bin "$b"); done
names=$(for b in "${bins[@]}"; do basename "$b"; done | tr '\n' ' ')
echo "engine-suite-on-kernel: ${#bins[@]} binaries on $KERNEL: $names" >&2
exec scripts/emulated-host.sh --kernel "$KERNEL" --memory 8G --timeout 2400 "${args[@]}" \
    -- env BINS="$names" LAST="$LAST" PAGEFOLD_TEST_TIME_SCALE=5 RUST_BACKTRACE=1 \
    "${runner[@]}" "$@"
