//! `pagefold serve` under a service manager: it says when it is ready
//! (`$NOTIFY_SOCKET`, systemd's `Type=notify`), ignores SIGHUP, and
//! stops cleanly on SIGTERM: exit status 0, its VMs stopped, its socket
//! removed, the host's KSM knobs as it found them.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{api_client, pagefold, require_kvm, text, wait_bounded, Daemon, TempDir};
use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};
use serde_json::json;

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// `pagefold serve` on `dir`'s api.sock with `args` after it, its runtime
/// directory in `dir`, `NOTIFY_SOCKET` if given, its output captured; killed
/// if the test fails before waiting for it.
fn serve(dir: &TempDir, args: &[&str], notify: Option<&Path>) -> Daemon {
    let mut c = pagefold();
    c.args([
        "serve",
        "--api-sock",
        dir.path("api.sock").to_str().unwrap(),
    ])
    .args(args)
    .env("PAGEFOLD_RUNTIME_DIR", dir.path("runtime"))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(n) = notify {
        c.env("NOTIFY_SOCKET", n);
    }
    Daemon::new(c.spawn().expect("spawn pagefold serve"))
}

/// A small workload VM that fills its memory and waits to be stopped.
fn vm_body() -> serde_json::Value {
    json!({"memory": "64M", "serial": "null",
           "workload": {"shared": "16M", "private": "8M", "phases": ["fill", "wait"]}})
}

#[test]
fn serve_tells_systemd_ignores_sighup_and_stops_cleanly_on_sigterm() {
    require_kvm();
    let dir = TempDir::new("serve-signals");
    let sock = dir.path("api.sock");
    let notify = dir.path("notify");
    let rx = UnixDatagram::bind(&notify).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let child = serve(&dir, &[], Some(&notify));
    let mut buf = [0u8; 256];
    let n = rx
        .recv(&mut buf)
        .expect("no readiness datagram within 30 s");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(ready.contains(&format!("STATUS=API on {}", sock.display())));
    // Ready means the API answers now.
    assert!(sock.exists());
    let c = api_client(&sock);
    let r = c.call("PUT", "/vms/vm0", Some(&vm_body())).unwrap();
    assert_eq!(r.status, 201, "{r:?}");

    signal(&child, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    let h = c.call("GET", "/vms/vm0", None).unwrap();
    assert_eq!(h.status, 200, "{h:?}");
    assert!(
        String::from_utf8_lossy(&h.body).contains("\"running\""),
        "after SIGHUP: {h:?}"
    );

    signal(&child, libc::SIGTERM);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "socket left behind");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("SIGHUP ignored"), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("[vm0] stopped: SIGTERM received"),
        "{}",
        text(&o)
    );
}

/// `--log-file` with `--log-format json`: every line is a JSON object in
/// the file, none on stderr; after the file is moved away (as logrotate
/// does), SIGHUP makes the daemon write to a new file at the path, its
/// VMs running on; SIGTERM still stops it cleanly.
#[test]
fn sighup_reopens_the_log_file() {
    require_kvm();
    let dir = TempDir::new("serve-logfile");
    let sock = dir.path("api.sock");
    let log = dir.path("pagefold.log");
    let rotated = dir.path("pagefold.log.1");
    let child = serve(
        &dir,
        &[
            "--log",
            "info",
            "--log-format",
            "json",
            "--log-file",
            log.to_str().unwrap(),
        ],
        None,
    );
    let c = api_client(&sock);
    let r = c.call("PUT", "/vms/vm0", Some(&vm_body())).unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let lines = |p: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect()
    };
    let has = |v: &[serde_json::Value], needle: &str| {
        v.iter()
            .any(|l| l["msg"].as_str().is_some_and(|m| m.contains(needle)))
    };
    let first = lines(&log);
    assert!(has(&first, "API on"), "{first:?}");
    assert!(first
        .iter()
        .all(|l| l["ts"].is_string() && l["target"].is_string()));

    std::fs::rename(&log, &rotated).unwrap();
    signal(&child, libc::SIGHUP);
    let start = std::time::Instant::now();
    while !log.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = lines(&log);
    assert!(has(&after, "reopened the log file"), "{after:?}");
    assert!(!has(&after, "API on"), "{after:?}");
    assert!(!has(&after, "SIGHUP ignored"), "{after:?}");
    let h = c.call("GET", "/vms/vm0", None).unwrap();
    assert!(
        String::from_utf8_lossy(&h.body).contains("\"running\""),
        "after SIGHUP: {h:?}"
    );

    signal(&child, libc::SIGTERM);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(has(&lines(&log), "SIGTERM received"), "{:?}", lines(&log));
    assert!(has(&lines(&rotated), "API on"));
    assert!(o.stderr.is_empty(), "{}", text(&o));
}

/// Runs `pagefold ksm restore` on the test's journal when dropped, so a
/// failed test (a killed daemon) leaves the host's knobs as found too.
struct RestoreOnDrop(std::path::PathBuf);

impl Drop for RestoreOnDrop {
    fn drop(&mut self) {
        let _ = pagefold()
            .args(["ksm", "restore"])
            .env("PAGEFOLD_RUNTIME_DIR", &self.0)
            .output();
    }
}

/// SIGTERM on a daemon driving kernel KSM: the knobs it changed go back.
/// Serialised with every other KSM user by the KSM lock.
#[test]
fn sigterm_puts_the_ksm_knobs_back() {
    require_kvm();
    let _lock = ksm_exclusive().unwrap();
    let before = snapshot_tunables(Path::new(KSM_SYSFS));
    assert_ne!(before["pages_to_scan"], "777", "{before:?}");
    let dir = TempDir::new("serve-sigterm-ksm");
    let _back = RestoreOnDrop(dir.path("runtime"));
    let sock = dir.path("api.sock");
    let child = serve(
        &dir,
        &[
            "--dedup",
            "on",
            "--dedup-backend",
            "ksm",
            "--pages-to-scan",
            "777",
        ],
        None,
    );
    let c = api_client(&sock);
    let r = c.call("PUT", "/vms/vm0", Some(&vm_body())).unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let knobs = snapshot_tunables(Path::new(KSM_SYSFS));
    assert_eq!(knobs["pages_to_scan"], "777", "{knobs:?}");
    assert_eq!(knobs["run"], "1", "{knobs:?}");
    signal(&child, libc::SIGTERM);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "socket left behind");
    assert_eq!(snapshot_tunables(Path::new(KSM_SYSFS)), before);
}

/// The shipped unit file is one systemd accepts (`systemd-analyze verify`,
/// with ExecStart pointing at this build's binary).
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/systemd/pagefold.service"),
    )
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/pagefold serve "));
    let dir = TempDir::new("unit");
    let path = dir.path("pagefold.service");
    let bin = common::bin();
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/pagefold", bin.to_str().unwrap()),
    )
    .unwrap();
    let o = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("this test needs systemd-analyze (Debian: systemd)");
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stderr.is_empty(), "{}", text(&o));
}
