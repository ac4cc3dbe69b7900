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

start=$SECONDS
# Where a run's time goes, in CI's log.
step() { echo "=== test.sh: $* ($((SECONDS - start)) s)"; }

# The binary the integration tests drive, with the benchmarks (the `bench`
# feature) so that the tests of `pagefold bench` run too.
step "build"
cargo build --workspace --all-targets --features bench
# Tests that touch global state (KSM sysfs) serialise themselves with a lock
# file; everything else runs in parallel.
step "cargo test"
cargo test --workspace --all-targets --features bench "$@"
# The production build (no benchmarks): `pagefold bench` says how to get them.
# `--workspace`, not `-p pagefold`: features are unified over the packages
# selected, so with only the binary's package every dependency was built
# again with other features (38 s of a CI run); this way only the
# binary's own crate is.
step "the binary without the bench feature"
cargo test --workspace --bin pagefold --test workload_build bench
# The engine's tests on Debian 12's kernel, the oldest host kernel pagefold
# supports, inside the emulated host (docs/host-kernels.md): the suite above
# ran on this machine's kernel only.
step "the engine's suite on Linux 6.1"
scripts/engine-suite-on-kernel.sh 6.1
step "done"
