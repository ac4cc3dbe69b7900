//! Per-thread seccomp filters, with the real binary: a forbidden syscall
//! from each kind of thread (made on purpose through the hidden
//! `PAGEFOLD_SECCOMP_SELFTEST` hook; the main thread with and without the
//! API, the KSM backend's driver included) ends the process with a message
//! naming the thread and the syscall and exit status 159 (128 + SIGSYS); with
//! `--no-seccomp` or `seccomp = false` nothing is filtered; in log mode the
//! syscall fails and the run goes on.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};

const LIMIT: Duration = Duration::from_secs(60);

/// A short workload run with `args` added, `selftest` (if any) naming the
/// thread that misbehaves, `log` the log mode's file.
fn command(selftest: Option<&str>, args: &[&str], log: Option<&str>) -> Command {
    let mut c = pagefold();
    c.args([
        "run",
        "--name",
        "sc",
        "--memory",
        "32M",
        "--shared",
        "8M",
        "--private",
        "4M",
        "--phases",
        "fill,verify",
    ])
    .args(args)
    .env_remove("PAGEFOLD_SECCOMP_LOG")
    .env_remove("PAGEFOLD_SECCOMP_SELFTEST")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(s) = selftest {
        c.env("PAGEFOLD_SECCOMP_SELFTEST", s);
    }
    if let Some(l) = log {
        c.env("PAGEFOLD_SECCOMP_LOG", l);
    }
    c
}

/// A short workload run with the engine and the API on.
fn run_with(selftest: Option<&str>, extra: &[&str], log: Option<&str>) -> std::process::Output {
    // One directory (and API socket) per run: tests run in parallel.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = TempDir::new(&format!("seccomp{}", RUNS.fetch_add(1, Ordering::SeqCst)));
    let sock = dir.path("api.sock");
    let mut args = vec!["--dedup", "on", "--api-sock", sock.to_str().unwrap()];
    args.extend_from_slice(extra);
    wait_bounded(
        command(selftest, &args, log)
            .spawn()
            .expect("spawn pagefold"),
        LIMIT,
    )
}

/// Asserts that `o` ended for `thread`'s forbidden `syscall`.
fn assert_killed_for(o: &Output, kind: &str, thread: &str, syscall: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    let want = format!("pagefold: seccomp: thread {thread} made forbidden syscall {syscall}");
    assert!(err.contains(&want), "{kind}: want {want:?}\n{}", text(o));
    assert_eq!(o.status.code(), Some(159), "{kind}\n{}", text(o));
}

#[test]
fn a_forbidden_syscall_from_each_thread_ends_the_process_with_a_clear_message() {
    require_kvm();
    let cases = [
        ("vcpu", "sc-vcpu0", "41 (socket)"),
        ("api", "pagefold-api", "101 (ptrace)"),
        ("engine", "pagefold-scan", "101 (ptrace)"),
        ("fault", "pagefold-uffd", "101 (ptrace)"),
        ("main", "main", "101 (ptrace)"),
    ];
    for (kind, thread, syscall) in cases {
        let o = run_with(Some(kind), &[], None);
        assert_killed_for(&o, kind, thread, syscall);
    }
    // Without the API the main thread's filter is the narrower one (no VM
    // creation after set-up); it ends the process the same way.
    let o = wait_bounded(
        command(Some("main"), &["--dedup", "on"], None)
            .spawn()
            .expect("spawn pagefold"),
        LIMIT,
    );
    assert_killed_for(&o, "main without the API", "main", "101 (ptrace)");
}

/// The KSM backend's auto-mode driver (`ksm-auto`) is filtered too. It has
/// changed the host's KSM knobs when it dies without cleanup, so the run
/// holds the KSM lock, keeps its journal in a runtime directory of its own,
/// and `pagefold ksm restore` must then put every knob back.
#[test]
fn a_forbidden_syscall_from_the_ksm_driver_ends_the_process_too() {
    require_kvm();
    assert!(
        Path::new(KSM_SYSFS).join("run").exists(),
        "this machine has KSM; the test needs it"
    );
    let _lock = ksm_exclusive().unwrap();
    let before = snapshot_tunables(Path::new(KSM_SYSFS));
    let dir = TempDir::new("seccomp-ksm");
    let runtime = dir.path("runtime");
    let mut c = command(
        Some("ksm"),
        &["--dedup-backend", "ksm", "--dedup", "auto"],
        None,
    );
    c.env("PAGEFOLD_RUNTIME_DIR", &runtime);
    let o = wait_bounded(c.spawn().expect("spawn pagefold"), LIMIT);

    let restore = wait_bounded(
        pagefold()
            .args(["ksm", "restore"])
            .env("PAGEFOLD_RUNTIME_DIR", &runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pagefold ksm restore"),
        LIMIT,
    );
    assert_killed_for(&o, "ksm", "ksm-auto", "101 (ptrace)");
    assert!(restore.status.success(), "{}", text(&restore));
    assert_eq!(snapshot_tunables(Path::new(KSM_SYSFS)), before);
}

#[test]
fn a_clean_run_passes_every_filter() {
    require_kvm();
    let o = run_with(None, &[], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("forbidden syscall"),
        "{}",
        text(&o)
    );
}

#[test]
fn no_seccomp_flag_and_config_turn_the_filters_off() {
    require_kvm();
    let o = run_with(Some("vcpu"), &["--no-seccomp"], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("forbidden"),
        "{}",
        text(&o)
    );

    let dir = TempDir::new("seccomp-cfg");
    let cfg = dir.path("vm.toml");
    std::fs::write(
        &cfg,
        "seccomp = false\n\n[[vm]]\nname = \"sc\"\nmemory = \"32M\"\n\
         [vm.workload]\nshared = \"8M\"\nprivate = \"4M\"\nphases = [\"fill\", \"verify\"]\n",
    )
    .unwrap();
    let o = pagefold()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("PAGEFOLD_SECCOMP_SELFTEST", "main")
        .env_remove("PAGEFOLD_SECCOMP_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pagefold");
    let o = wait_bounded(o, LIMIT);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn log_mode_reports_and_goes_on() {
    require_kvm();
    let dir = TempDir::new("seccomp-log");
    let log = dir.path("seccomp.log");
    let o = run_with(Some("vcpu"), &[], Some(log.to_str().unwrap()));
    assert!(o.status.success(), "{}", text(&o));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("thread sc-vcpu0 made forbidden syscall 41 (socket); log mode"),
        "{logged}"
    );
}
