//! Builds the workload guest (guest/workload) into OUT_DIR, for
//! `src/workload/image.rs` to embed.
//!
//! The guest is a freestanding static ELF with its own flags (static
//! relocation model, no libc, its own linker script), so it gets its own cargo
//! invocation, target dir and environment: nothing of the outer build (its
//! RUSTFLAGS, wrappers such as clippy-driver, --target, target dir, profile
//! settings) may reach it, and none of its flags may reach the host crates.
//! The jobserver is kept on purpose: the inner cargo then takes its job slots
//! from the outer build's pool instead of starting `nproc` more jobs.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Name of the guest binary (its Cargo package's bin).
const GUEST_BIN: &str = "pagefold-workload";

/// Environment variables the inner cargo keeps. Everything else that cargo
/// or rustc reads (CARGO_*, RUSTFLAGS, RUSTC_*WRAPPER, CLIPPY_*, ...) goes.
fn keep_var(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return true;
    };
    let drop = (name.starts_with("CARGO_") && !matches!(name, "CARGO_HOME" | "CARGO_MAKEFLAGS"))
        || name.starts_with("RUST")
            && !matches!(name, "RUSTUP_HOME" | "RUSTUP_TOOLCHAIN" | "RUSTC")
        || name.starts_with("CLIPPY_")
        || name.starts_with("__CARGO")
        || matches!(
            name,
            "TARGET" | "HOST" | "OUT_DIR" | "PROFILE" | "OPT_LEVEL" | "DEBUG" | "NUM_JOBS"
        );
    !drop
}

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let guest_root = manifest_dir.join("..").join("guest");
    let workload = guest_root.join("workload");
    let abi = guest_root.join("abi");
    for p in [
        workload.join("src"),
        workload.join("Cargo.toml"),
        workload.join("Cargo.lock"),
        workload.join("build.rs"),
        workload.join("link.ld"),
        workload.join(".cargo").join("config.toml"),
        abi.join("src"),
        abi.join("Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("workload-target");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workload)
        .arg("build")
        .arg("--release")
        .arg("--offline")
        .arg("--manifest-path")
        .arg(workload.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // Cargo's stdout is for our directives; the inner build's goes nowhere
        // (its diagnostics are on stderr, shown when it fails).
        .stdout(Stdio::null());
    for (name, _) in env::vars_os() {
        if !keep_var(&name) {
            cmd.env_remove(&name);
        }
    }
    // Set explicitly: env rustflags override any build.rustflags in parent
    // .cargo/config.toml files of this checkout.
    cmd.env("CARGO_ENCODED_RUSTFLAGS", "-Crelocation-model=static");

    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo for the workload guest: {e}"));
    assert!(
        status.success(),
        "building the workload guest failed ({status}); see the output above"
    );

    let built = target_dir.join("release").join(GUEST_BIN);
    copy(&built, &out_dir.join("pagefold-workload.elf"));
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}
