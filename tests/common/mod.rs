//! Helpers for integration tests that run the real `pagefold` binary.
#![allow(dead_code)]

pub mod dedup;
pub mod linux_host;
pub mod linux_net;
pub mod linux_vms;
pub mod pagemap_audit;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A client of the API served on `sock`, once `GET /health` answers there
/// (fails after 20 s).
pub fn api_client(sock: &Path) -> pagefold_api::client::Client {
    use pagefold_api::client::{Client, Target};
    let client = Client::new(Target::Unix(sock.to_path_buf())).unwrap();
    let start = Instant::now();
    while !(sock.exists() && client.call("GET", "/health", None).is_ok()) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "API never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    client
}

/// Fails (never skips) when KVM is unusable: these tests exist to boot VMs.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!(
            "this test boots VMs and needs /dev/kvm, which cannot be opened: {e} \
             (run on a KVM host as root or as a member of the kvm group)"
        );
    }
}

/// The pagefold binary under test: cargo's, or `PAGEFOLD_BIN` where the
/// test runs elsewhere (inside the emulated host, see `linux_host`).
pub fn bin() -> PathBuf {
    std::env::var_os("PAGEFOLD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pagefold")))
}

pub fn pagefold() -> Command {
    let mut c = Command::new(bin());
    c.stdin(Stdio::null());
    c
}

/// A scratch directory (tempfile's: a unique name, removed at drop); the
/// tag in its name tells which test left it if a crash keeps it.
pub struct TempDir(pub PathBuf, tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = tempfile::Builder::new()
            .prefix(&format!("pagefold-test-{tag}-"))
            .tempdir()
            .unwrap();
        TempDir(d.path().to_path_buf(), d)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

/// A spawned pagefold daemon, killed (SIGKILL) and reaped if the test
/// ends without taking it back with [`Daemon::into_child`]: a failing
/// assertion must not leave a daemon running on the machine.
pub struct Daemon(Option<Child>);

impl Daemon {
    pub fn new(child: Child) -> Daemon {
        Daemon(Some(child))
    }

    /// The child, no longer killed at drop (to wait for it).
    pub fn into_child(mut self) -> Child {
        self.0.take().expect("a live daemon")
    }
}

impl std::ops::Deref for Daemon {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("a live daemon")
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("a live daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for `child` at most `limit`, killing it (and failing) past that.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if let Some(_status) = child.try_wait().unwrap() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let mut out = String::new();
            if let Some(mut s) = child.stdout.take() {
                let _ = s.read_to_string(&mut out);
            }
            panic!("pagefold did not finish within {limit:?}; output so far:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs pagefold with `args`, bounded in time.
pub fn run(args: &[&str], limit: Duration) -> Output {
    let child = pagefold()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pagefold");
    wait_bounded(child, limit)
}

/// Runs the VMs of config file `cfg`, writing the JSON report to `json`.
pub fn run_config(cfg: &Path, json: &Path, limit: Duration) -> Output {
    run(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--json-file",
            json.to_str().unwrap(),
        ],
        limit,
    )
}

pub fn text(o: &Output) -> String {
    format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn read_json(p: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&s).unwrap()
}

/// The report of VM `name` in a `--json-file` report.
pub fn vm<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no VM {name} in report {report}"))
}

/// The phases named `phase` of a VM report.
pub fn phases<'a>(vm: &'a serde_json::Value, phase: &str) -> Vec<&'a serde_json::Value> {
    vm["phases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["phase"] == phase)
        .collect()
}

/// Anonymous memory this process has faulted in for writing
/// (`MAP_POPULATE` on a private writable mapping), so that the host counts
/// it used; unmapped on drop. Auto-mode tests take the host's memory with
/// it.
pub struct Hog {
    addr: *mut u8,
    len: usize,
}

impl Hog {
    pub fn take(len: usize) -> Hog {
        let addr = pagefold_dedup::mm::map_anon_populated(len)
            .unwrap_or_else(|e| panic!("take {len} bytes: {e}"));
        Hog { addr, len }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        // SAFETY: exactly what `take` mapped; nothing else refers to it.
        unsafe { pagefold_dedup::mm::unmap(self.addr, self.len) };
    }
}
