#!/usr/bin/env bash
# Runs every test of pagefold: unit tests, integration tests that boot real
# workload VMs and real Linux guests (in the emulated SVM host where this
# host has no VMX/SVM), the dedup torture test, the kernel-KSM tests, and
# the engine's suite again on Linux 6.1.
# Needs root (or the kvm group plus userfaultfd and KSM sysfs access) and /dev/kvm.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -e /dev/kvm ]]; then
    echo "error: /dev/kvm is missing: the VM tests need KVM (they fail rather than skip)" >&2
fi

# The binary the integration tests drive, with the benchmarks (the `bench`
# feature) so that the tests of `pagefold bench` run too.
cargo build --workspace --all-targets --features bench
# Tests that touch global state (KSM sysfs) serialise themselves with a lock
# file; everything else runs in parallel.
cargo test --workspace --all-targets --features bench "$@"
# The production build (no benchmarks): `pagefold bench` says how to get them.
cargo test -p pagefold --bin pagefold --test workload_build bench
# The engine's tests on Debian 12's kernel, the oldest host kernel pagefold
# supports, inside the emulated host (docs/host-kernels.md): the suite above
# ran on this machine's kernel only.
scripts/engine-suite-on-kernel.sh 6.1
