//! Linux guests on pagefold with the Debian cloud kernel from
//! `scripts/guest-image.sh` (ELF vmlinux, initrd, ext4 test disk).
//!
//! On every KVM host: the kernel reads pagefold's boot data and ACPI tables
//! and says so on the serial console. On hosts without VMX/SVM (PVM, where
//! kernel-mode code is emulated) it then stops in KVM's instruction emulator,
//! which pagefold must report as a guest error (exit code 3), not a crash.
//! On VMX/SVM hosts it boots to the initrd, reads the virtio-blk disk and
//! powers off; two such VMs in one dedup group share pages. Those tests skip,
//! with a printed reason, where hardware virtualization is missing.
//!
//! The image: `PAGEFOLD_GUEST_DIR` if set, else `scripts/guest-image.sh`
//! builds it under `target/guest-img` (cached; reruns do not download).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;

/// About 60 s on an idle machine of this project's kind; the emulated boot
/// is CPU-bound, so a loaded machine needs the headroom.
const PVM_LIMIT: Duration = Duration::from_secs(300);
const HW_LIMIT: Duration = Duration::from_secs(120);

/// The guest image directory, built once per test process.
fn guest_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("PAGEFOLD_GUEST_DIR") {
            return PathBuf::from(d);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = root.join("target").join("guest-img");
        let start = Instant::now();
        let o = Command::new(root.join("scripts").join("guest-image.sh"))
            .arg(&dir)
            .output()
            .expect("run scripts/guest-image.sh");
        assert!(
            o.status.success(),
            "scripts/guest-image.sh {} failed (set PAGEFOLD_GUEST_DIR to an existing image):\n{}",
            dir.display(),
            text(&o)
        );
        eprintln!(
            "guest image ready in {:?}: {}",
            start.elapsed(),
            dir.display()
        );
        dir
    })
}

fn image(name: &str) -> String {
    let p = guest_dir().join(name);
    assert!(p.is_file(), "guest image file missing: {}", p.display());
    p.to_str().unwrap().to_string()
}

/// VMX or SVM in the CPU flags: kernel-mode guest code runs natively.
fn hardware_virtualization() -> bool {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

fn skip_without_hardware_virtualization(test: &str) -> bool {
    if hardware_virtualization() {
        return false;
    }
    eprintln!(
        "SKIPPED {test}: this host has no VMX/SVM (no vmx/svm in /proc/cpuinfo flags); \
         under PVM kernel-mode guest code is emulated and Linux cannot boot to user space"
    );
    true
}

#[test]
fn debian_kernel_reads_our_acpi_tables_then_stops_as_a_guest_error() {
    require_kvm();
    let kernel = image("vmlinux");
    let disk = format!("{},ro", image("rootfs.ext4"));
    let start = Instant::now();
    let o = run(
        &[
            "run",
            "--kernel",
            &kernel,
            "--cmdline",
            "console=ttyS0 panic=-1",
            "--memory",
            "512M",
            "--disk",
            &disk,
        ],
        PVM_LIMIT,
    );
    eprintln!("pagefold ran {:?}", start.elapsed());
    let out = String::from_utf8_lossy(&o.stdout);
    for line in ["Linux version", "ACPI: RSDP", "ACPI: DSDT", "ACPI: APIC"] {
        assert!(
            out.contains(line),
            "no {line:?} on the console:\n{}",
            text(&o)
        );
    }
    if hardware_virtualization() {
        // The kernel runs on; without an initrd it cannot mount the disk
        // (virtio_blk is a module) and panics, and panic=-1 reboots: the
        // VM ends on its own either way.
        return;
    }
    // PVM: the emulator stops the kernel. A guest error: exit code 3, with
    // KVM's reason, and no sign of a VMM crash.
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(out.contains("KVM internal error"), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{}", text(&o));
}

#[test]
fn boots_to_the_initrd_reads_the_disk_and_powers_off() {
    if skip_without_hardware_virtualization("boots_to_the_initrd_reads_the_disk_and_powers_off") {
        return;
    }
    require_kvm();
    let disk = format!("{},ro", image("rootfs.ext4"));
    let o = run(
        &[
            "run",
            "--kernel",
            &image("vmlinux"),
            "--initrd",
            &image("initrd.img"),
            "--cmdline",
            "console=ttyS0 panic=-1",
            "--memory",
            "512M",
            "--vcpus",
            "2",
            "--disk",
            &disk,
        ],
        HW_LIMIT,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("PAGEFOLD-DISK: hello from the pagefold test disk"),
        "the initrd did not read the virtio-blk disk:\n{}",
        text(&o)
    );
    assert!(out.contains("PAGEFOLD-INITRD-OK"), "{}", text(&o));
    assert_eq!(
        o.status.code(),
        Some(0),
        "the guest did not power off cleanly:\n{}",
        text(&o)
    );
}

#[test]
fn two_linux_vms_in_one_group_share_pages() {
    if skip_without_hardware_virtualization("two_linux_vms_in_one_group_share_pages") {
        return;
    }
    require_kvm();
    let dir = TempDir::new("linux-two");
    let vm = |name: &str| {
        format!(
            r#"
            [[vm]]
            name = "{name}"
            memory = "512M"
            dedup = {{ group = "linux" }}
            [vm.kernel]
            path = {kernel:?}
            initrd = {initrd:?}
            cmdline = "console=ttyS0 panic=-1"
            disks = [{{ path = {disk:?}, readonly = true }}]
            "#,
            kernel = image("vmlinux"),
            initrd = image("initrd.img"),
            disk = image("rootfs.ext4"),
        )
    };
    let cfg = dir.path("two.toml");
    std::fs::write(
        &cfg,
        format!(
            "[dedup]\nmode = \"on\"\npages_to_scan = 10000\nsleep_millisecs = 0\n{}{}",
            vm("one"),
            vm("two")
        ),
    )
    .unwrap();
    let json = dir.path("report.json");
    let o = run_config(&cfg, &json, HW_LIMIT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = read_json(&json);
    for name in ["one", "two"] {
        assert_eq!(
            common::vm(&r, name)["outcome"]["kind"],
            "guest_power_off",
            "{r}"
        );
    }
    // Both guests hold the same kernel image (text, rodata) at the same
    // guest addresses: thousands of identical pages the engine merges while
    // they boot.
    let merges = r["dedup"]["merges"].as_u64().unwrap_or(0);
    assert!(
        merges >= 1000,
        "only {merges} merges between two identical Linux VMs: {}",
        r["dedup"]
    );
}
