#!/usr/bin/env bash
# Runs every test of pagefold: unit tests, integration tests that boot real
# workload VMs, the dedup torture test, and the kernel-KSM tests.
# Needs root (or the kvm group plus userfaultfd and KSM sysfs access) and /dev/kvm.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -e /dev/kvm ]]; then
    echo "error: /dev/kvm is missing: the VM tests need KVM (they fail rather than skip)" >&2
fi

# The binary the integration tests drive.
cargo build --workspace --all-targets
# Tests that touch global state (KSM sysfs) serialise themselves with a lock
# file; everything else runs in parallel.
cargo test --workspace --all-targets "$@"
