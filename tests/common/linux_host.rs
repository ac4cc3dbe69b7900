//! Where the Linux-guest tests run: on this host when it has hardware
//! virtualization (VMX/SVM), else inside the emulated host of
//! scripts/emulated-host.sh (QEMU TCG with SVM and nested paging, a stock
//! Debian kernel with kvm_amd), which re-runs the calling test there.
//! They never skip: a host that can run neither fails them.
//!
//! A test starts with
//! ```ignore
//! if !linux_host::run_here("name_of_this_test", &Emulation::default()) {
//!     return; // it ran, and passed, inside the emulated host
//! }
//! ```
//! and its body then runs on a host that boots Linux guests: this one, or
//! the emulated one, where this same test binary runs with
//! `PAGEFOLD_HOST_KIND=emulated-svm`, the pagefold binary at
//! `PAGEFOLD_BIN` and the guest image at `PAGEFOLD_GUEST_DIR`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::text;

pub use pagefold_vmm::host_kind::{host_kind, HostKind};
use pagefold_vmm::host_kind::{host_kvm_kind, KvmKind};

/// KVM with VMX or SVM here (the emulated host's CPU included).
pub fn hardware_virtualization() -> bool {
    matches!(host_kvm_kind(), KvmKind::Hardware(_))
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The guest image directory (scripts/guest-image.sh), built once per test
/// process: `PAGEFOLD_GUEST_DIR` if set, else target/guest-img (cached:
/// a rerun downloads and rebuilds nothing).
pub fn guest_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("PAGEFOLD_GUEST_DIR") {
            return PathBuf::from(d);
        }
        let dir = root().join("target").join("guest-img");
        let start = Instant::now();
        let o = Command::new(root().join("scripts").join("guest-image.sh"))
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

/// A file of the guest image, as a string path.
pub fn image(name: &str) -> String {
    let p = guest_dir().join(name);
    assert!(p.is_file(), "guest image file missing: {}", p.display());
    p.to_str().unwrap().to_string()
}

/// How to start the emulated host for a test.
#[derive(Debug, Clone)]
pub struct Emulation {
    /// Its RAM (QEMU syntax).
    pub memory: &'static str,
    /// Longest the whole emulated run may take.
    pub timeout: Duration,
    /// The test changes host-wide state (sysctls, the host's free memory):
    /// it runs in the emulated host, which is thrown away afterwards, even
    /// where this host could run it.
    pub disposable: bool,
    /// The emulated host's CPUs; None: scripts/emulated-host.sh's default
    /// (this machine's CPUs). Tests of two guests or more take three or
    /// four: their VMs then keep off the first CPU, where every guest
    /// crash and host panic of the emulated host struck with two CPUs
    /// ([`pagefold_vmm::host_kind::linux_vm_cpu`], docs/linux-guests.md).
    pub cpus: Option<u32>,
}

impl Default for Emulation {
    fn default() -> Self {
        Self {
            memory: "4G",
            timeout: Duration::from_secs(900),
            disposable: false,
            cpus: None,
        }
    }
}

/// The emulated host's kernel: Debian 12's 6.1 unless
/// `PAGEFOLD_EMULATED_KERNEL` names another (`6.12`, or a package).
pub fn emulated_kernel() -> String {
    std::env::var("PAGEFOLD_EMULATED_KERNEL").unwrap_or_else(|_| "6.1".into())
}

/// True: run the test's body in this process (this host runs Linux
/// guests). False: the test ran inside the emulated host and passed there
/// (a failure there fails it here, with the emulated console's tail).
pub fn run_here(test: &str, emu: &Emulation) -> bool {
    let kind = host_kind();
    if kind == HostKind::EmulatedSvm || (kind.runs_linux() && !emu.disposable) {
        eprintln!(
            "{test}: host kind {} (Linux {})",
            kind.name(),
            kernel_release()
        );
        super::require_kvm();
        return true;
    }
    eprintln!(
        "{test}: host kind {}{}; running it inside the emulated SVM host (kernel {})",
        kind.name(),
        if kind.runs_linux() {
            " runs Linux guests, but the test changes host-wide state"
        } else {
            " cannot boot Linux guests"
        },
        emulated_kernel()
    );
    for attempt in 1..=HOST_ATTEMPTS {
        let (code, console, log) = emulate(test, emu);
        eprintln!(
            "{test}: emulated host (attempt {attempt}) exit {code:?}; its console:\n{console}"
        );
        // The emulated host's kernel died (or QEMU did) before the test
        // gave its verdict, or its CPU refused to enter a guest: the
        // emulator's fault, not the test's (docs/linux-guests.md, "The
        // emulated host"). Run it again.
        let emulator_fault = if code == Some(HOST_FAILED) {
            Some("the emulated host failed before the test ended")
        } else if code == Some(TEST_FAILED) && emulated_entry_refused(&console) {
            Some("the emulated CPU refused a VMRUN of the emulated host's KVM")
        } else {
            None
        };
        if let Some(why) = emulator_fault.filter(|_| attempt < HOST_ATTEMPTS) {
            eprintln!("{test}: {why}; running it again");
            continue;
        }
        assert!(
            console.contains("test result: ok. 1 passed") && code == Some(0),
            "{test} failed inside the emulated host (exit {code:?}):\n{log}\n--- console tail\n{}",
            tail(&console, 80)
        );
        return false;
    }
    unreachable!("the last attempt asserts")
}

/// Runs for a test whose emulated host died before the test ended
/// (scripts/emulated-host.sh's exit 125): a kernel panic of the emulated
/// host under two nested guests, which nox2apic made rare but not
/// impossible; and for a test that failed because the emulated CPU
/// refused to enter a guest ([`emulated_entry_refused`]). Any other
/// failure or hang (exit 101, 124) is not rerun.
const HOST_ATTEMPTS: u32 = 3;

/// A test's exit code when it failed (`cargo test`'s harness).
const TEST_FAILED: i32 = 101;

/// Did a guest stop because the emulated CPU refused to enter it: the
/// emulated host's KVM ran VMRUN and TCG's SVM emulation answered with
/// `SVM_EXIT_ERR` (reason 0xffffffff, an invalid VMCB) after the guest had
/// run? pagefold sets a vCPU's registers only before its first entry, so
/// a refusal later is the emulator's (or the emulated host's KVM's) fault:
/// the run says nothing of pagefold, and such a test is run again, as one
/// whose emulated host died. On a host with VMX/SVM the tests run
/// directly and nothing is rerun.
fn emulated_entry_refused(console: &str) -> bool {
    console.contains("KVM_EXIT_FAIL_ENTRY: hardware entry failure reason 0xffffffff")
}

/// scripts/emulated-host.sh: the host ended without the command's status.
const HOST_FAILED: i32 = 125;

/// One run of `test` inside scripts/emulated-host.sh: its exit code, the
/// host's console and the script's own output.
fn emulate(test: &str, emu: &Emulation) -> (Option<i32>, String, String) {
    let exe = std::env::current_exe().expect("test binary path");
    let exe_name = exe.file_name().unwrap().to_str().unwrap().to_string();
    let out = tempfile::Builder::new()
        .prefix("pagefold-emulated-")
        .tempdir()
        .unwrap();
    let start = Instant::now();
    let o = Command::new(root().join("scripts").join("emulated-host.sh"))
        .args(["--kernel", &emulated_kernel(), "--memory", emu.memory])
        .args(["--timeout", &emu.timeout.as_secs().to_string()])
        .args(
            emu.cpus
                .iter()
                .flat_map(|n| ["--cpus".to_string(), n.to_string()]),
        )
        .arg("--bin")
        .arg(&exe)
        .arg("--bin")
        .arg(super::bin())
        .arg("--guest")
        .arg(guest_dir())
        .arg("--out")
        .arg(out.path())
        .arg("--quiet")
        .args(["--", "env"])
        .args(forwarded_env())
        .args([
            "PAGEFOLD_BIN=/in/.bin/pagefold",
            "PAGEFOLD_GUEST_DIR=/guest",
            "RUST_BACKTRACE=1",
            &exe_name,
            "--exact",
            test,
            // The test runs here, so it runs there: an ignored one was
            // asked for (`--ignored`).
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .expect("run scripts/emulated-host.sh");
    let console = std::fs::read_to_string(out.path().join("console.log")).unwrap_or_default();
    eprintln!("{test}: the emulated host ran {:.0?}", start.elapsed());
    (o.status.code(), console, text(&o))
}

/// `PAGEFOLD_TEST_*` variables (a test's own overrides, such as
/// `PAGEFOLD_TEST_DEDUP`) and the engine's `PAGEFOLD_QUIESCE_MIN_OPS` go
/// along into the emulated host.
fn forwarded_env() -> Vec<String> {
    std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("PAGEFOLD_TEST_") || k == "PAGEFOLD_QUIESCE_MIN_OPS" || k == "RUST_LOG"
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod entry_refusal_tests {
    use super::emulated_entry_refused;

    #[test]
    fn only_the_emulated_cpus_refusal_to_enter_is_the_emulators_fault() {
        let refused = "two: the guest stopped before replying to command 1: VmmError { message: \
                       \"KVM_EXIT_FAIL_ENTRY: hardware entry failure reason 0xffffffff on CPU 2\" }";
        assert!(emulated_entry_refused(refused));
        // Another entry failure reason, and a test's own failures, are not.
        assert!(!emulated_entry_refused(
            "KVM_EXIT_FAIL_ENTRY: hardware entry failure reason 0x21 on CPU 0"
        ));
        assert!(!emulated_entry_refused(
            "assertion `left == right` failed: hashes differ after the take-back"
        ));
    }
}
