//! `pagefold bench build --guest linux` as a user runs it: the flags it
//! needs, and on a host without VMX/SVM (this project's PVM machines) an
//! immediate refusal that says why, with exit code 4, before it touches
//! KSM or a file, and the command that runs it inside the emulated host
//! instead. The benchmark itself needs the image of
//! scripts/linux-build-bench.sh and a VMX/SVM host or the emulated host
//! (docs/benchmarks.md; its runs are on the results page).

mod common;

use std::time::{Duration, Instant};

use common::linux_host::hardware_virtualization;
use common::*;

#[test]
fn linux_form_needs_kernel_and_disk() {
    for args in [
        &["bench", "build", "--guest", "linux"][..],
        &["bench", "build", "--guest", "linux", "--kernel", "/k"],
        &["bench", "build", "--guest", "linux", "--disk", "/d"],
    ] {
        let o = run(args, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--guest linux needs --kernel and --disk"),
            "{args:?}: {}",
            text(&o)
        );
    }
}

#[test]
fn linux_flags_are_refused_in_the_workload_form() {
    let o = run(
        &["bench", "build", "--kernel", "/k", "--disk", "/d"],
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("are for --guest linux"),
        "{}",
        text(&o)
    );
}

#[test]
fn linux_form_refuses_at_once_without_vmx_or_svm() {
    if hardware_virtualization() {
        eprintln!(
            "SKIPPED linux_form_refuses_at_once_without_vmx_or_svm: this host has VMX/SVM, \
             where the Linux form runs"
        );
        return;
    }
    let dir = TempDir::new("linux-bench-refusal");
    let disk = dir.path("build.ext4");
    std::fs::write(&disk, b"not an image").unwrap();
    let start = Instant::now();
    let o = run(
        &[
            "bench",
            "build",
            "--guest",
            "linux",
            "--kernel",
            "/nonexistent/vmlinux",
            "--disk",
            disk.to_str().unwrap(),
            "--runs",
            "1",
        ],
        Duration::from_secs(30),
    );
    let took = start.elapsed();
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "pagefold bench build --guest linux needs a host with hardware virtualization (VMX/SVM)"
        ),
        "{}",
        text(&o)
    );
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(
            err.contains("PVM"),
            "the reason must name PVM: {}",
            text(&o)
        );
    }
    assert!(
        err.contains("scripts/emulated-host.sh --scratch"),
        "the refusal must say how to run it here: {}",
        text(&o)
    );
    assert!(!err.contains("panicked"), "{}", text(&o));
    assert!(o.stdout.is_empty(), "no table on refusal: {}", text(&o));
    // Refused before anything: not even the work directory beside the disk.
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("build.ext4")]);
    // At once: no boot attempt, no emulator (a process start plus a few
    // file reads; the bound allows for a loaded machine).
    assert!(took < Duration::from_secs(5), "refusal took {took:?}");
}
