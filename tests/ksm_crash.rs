//! Global state survives `kill -9`: the real `pagefold` binary drives the
//! host's KSM, is killed with SIGKILL while its knobs are changed, and the
//! next pagefold (or `pagefold ksm restore`) puts them back, saying so on
//! stderr. Serialised with every other KSM user by the KSM lock; the knobs
//! are put back as found even if the test fails. Each child gets its own
//! runtime directory (`PAGEFOLD_RUNTIME_DIR`), so the host's journal under
//! /run/pagefold is not involved.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{pagefold, require_kvm, text, wait_bounded, TempDir};
use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};

/// Puts every KSM tunable back as found when dropped (pass or fail).
struct KnobsBack {
    before: BTreeMap<String, String>,
}

impl KnobsBack {
    fn take() -> Self {
        Self {
            before: snapshot_tunables(Path::new(KSM_SYSFS)),
        }
    }
}

impl Drop for KnobsBack {
    fn drop(&mut self) {
        let now = snapshot_tunables(Path::new(KSM_SYSFS));
        // `run` after the scan knobs, as pagefold itself restores.
        let mut order: Vec<&String> = self.before.keys().filter(|k| *k != "run").collect();
        order.extend(self.before.keys().filter(|k| *k == "run"));
        for k in order {
            let v = &self.before[k];
            if now.get(k) == Some(v) {
                continue;
            }
            // Choice files (advisor_mode) read "[none] scan-time".
            let v = match (v.find('['), v.find(']')) {
                (Some(a), Some(b)) if a < b => &v[a + 1..b],
                _ => v.as_str(),
            };
            if let Err(e) = std::fs::write(Path::new(KSM_SYSFS).join(k), v) {
                eprintln!("ksm_crash: could not put KSM {k} back to {v}: {e}");
            }
        }
    }
}

fn ksm_knob(name: &str) -> String {
    std::fs::read_to_string(Path::new(KSM_SYSFS).join(name))
        .unwrap()
        .trim()
        .to_string()
}

fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A scratch runtime directory and the pagefold processes run against it.
struct Env {
    tmp: TempDir,
}

impl Env {
    fn runtime(&self) -> PathBuf {
        self.tmp.path("runtime")
    }

    fn journal(&self) -> PathBuf {
        self.runtime().join("global-state.json")
    }

    fn cmd(&self) -> std::process::Command {
        let mut c = pagefold();
        c.env("PAGEFOLD_RUNTIME_DIR", self.runtime());
        c
    }

    /// A KSM-backed VM that sets `pages_to_scan` 777, fills its memory and
    /// then sleeps: it holds the knobs until it is killed.
    fn start_holder(&self, tag: &str) -> Child {
        self.start_holder_with(tag, "777")
    }

    fn start_holder_with(&self, tag: &str, pages_to_scan: &str) -> Child {
        let err = File::create(self.tmp.path(&format!("{tag}.stderr"))).unwrap();
        self.cmd()
            .args([
                "run",
                "--dedup-backend",
                "ksm",
                "--dedup",
                "on",
                "--pages-to-scan",
                pages_to_scan,
                "--memory",
                "64M",
                "--shared",
                "16M",
                "--private",
                "8M",
                "--phases",
                "fill,sleep:300000",
                "--serial",
                "null",
            ])
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn pagefold")
    }

    fn records(&self) -> Vec<serde_json::Value> {
        match std::fs::read_to_string(self.journal()) {
            Ok(s) => serde_json::from_str::<serde_json::Value>(&s).unwrap()["entries"]
                .as_array()
                .unwrap()
                .clone(),
            Err(_) => Vec::new(),
        }
    }

    /// The journal's record of KSM knob `name`, if any.
    fn record(&self, name: &str) -> Option<serde_json::Value> {
        let path = Path::new(KSM_SYSFS).join(name);
        self.records()
            .into_iter()
            .find(|e| e["path"] == path.to_str().unwrap())
    }

    /// Waits until `cond`; on timeout kills `child` and shows its stderr.
    fn wait_child(&self, child: &mut Child, tag: &str, mut cond: impl FnMut() -> bool) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until("pagefold to start KSM", Duration::from_secs(120), &mut cond)
        }));
        if let Err(p) = r {
            let _ = child.kill();
            let _ = child.wait();
            let err = std::fs::read_to_string(self.tmp.path(&format!("{tag}.stderr")));
            eprintln!("pagefold stderr: {err:?}");
            std::panic::resume_unwind(p);
        }
    }

    /// Whether the journal names `pid` as a holder of KSM knob `name`.
    fn held_by(&self, name: &str, pid: u32) -> bool {
        self.record(name).is_some_and(|r| {
            r["holders"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["pid"] == pid)
        })
    }

    /// Starts a holder, waits until it changed the knobs, SIGKILLs it and
    /// checks that the knobs stayed changed and the journal names it.
    fn crash(&self, tag: &str, before: &BTreeMap<String, String>) -> u32 {
        let mut child = self.start_holder(tag);
        let pid = child.id();
        self.wait_child(&mut child, tag, || {
            ksm_knob("pages_to_scan") == "777" && ksm_knob("run") == "1" && self.held_by("run", pid)
        });
        // Child::kill sends SIGKILL: no destructor, no signal handler runs.
        child.kill().unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

        // The kill left the host's KSM changed...
        assert_eq!(ksm_knob("pages_to_scan"), "777");
        assert_eq!(ksm_knob("run"), "1");
        // ...and the journal says what it was and who changed it.
        for name in ["pages_to_scan", "run"] {
            let rec = self
                .record(name)
                .unwrap_or_else(|| panic!("no record of {name}"));
            assert_eq!(rec["original"], before[name].as_str(), "{rec}");
            let holders = rec["holders"].as_array().unwrap();
            assert_eq!(holders.len(), 1, "{rec}");
            assert_eq!(holders[0]["pid"], pid, "{rec}");
        }
        pid
    }
}

#[test]
fn knobs_left_by_a_killed_pagefold_are_restored_by_the_next_one() {
    require_kvm();
    assert!(
        Path::new(KSM_SYSFS).join("run").exists(),
        "this machine has KSM; the test needs it"
    );
    let _lock = ksm_exclusive().unwrap();
    let back = KnobsBack::take();
    let before = back.before.clone();
    // The test needs to see both knobs change.
    assert_ne!(before["pages_to_scan"], "777", "{before:?}");
    assert_ne!(before["run"], "1", "KSM is already running: {before:?}");
    let env = Env {
        tmp: TempDir::new("ksm-crash"),
    };

    // 1. Killed, then restored by hand.
    let pid = env.crash("first", &before);
    let status = wait_bounded(
        env.cmd()
            .args(["ksm", "status"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert!(status.status.success(), "{}", text(&status));
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(
        out.contains(&format!(
            "KSM pages_to_scan: original {}, now 777, held by pid {pid} (",
            before["pages_to_scan"]
        )),
        "{}",
        text(&status)
    );
    assert!(out.contains(", dead)"), "{}", text(&status));

    let restore = wait_bounded(
        env.cmd()
            .args(["ksm", "restore"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert!(restore.status.success(), "{}", text(&restore));
    // `pagefold ksm restore` reports each restore as its output.
    let out = String::from_utf8_lossy(&restore.stdout);
    for (name, was) in [("pages_to_scan", "777"), ("run", "1")] {
        let line = format!(
            "restored KSM {name}={} (was {was}) left by pid {pid} (killed?)\n",
            before[name]
        );
        assert!(out.contains(&line), "no {line:?} in\n{}", text(&restore));
    }
    assert_eq!(snapshot_tunables(Path::new(KSM_SYSFS)), before);
    assert!(!env.journal().exists(), "records cleared");

    // 2. Killed, then restored by the next pagefold that uses KSM: it says
    // so, takes the restored values as the host's, and restores them again
    // when it ends normally.
    let pid = env.crash("second", &before);
    let next = wait_bounded(
        env.cmd()
            .args([
                "run",
                "--dedup-backend",
                "ksm",
                "--dedup",
                "on",
                "--memory",
                "64M",
                "--shared",
                "16M",
                "--private",
                "8M",
                "--phases",
                "fill,verify",
                "--serial",
                "null",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(180),
    );
    assert!(next.status.success(), "{}", text(&next));
    // Any other command logs the restores it made as warnings.
    let err = String::from_utf8_lossy(&next.stderr);
    let line = format!(
        "pagefold: warn: restored KSM run={} (was 1) left by pid {pid} (killed?)",
        before["run"]
    );
    assert!(err.contains(&line), "no {line:?} in\n{}", text(&next));
    assert!(
        err.contains(&format!(
            "pagefold: warn: restored KSM pages_to_scan={} (was 777) left by pid {pid} (killed?)",
            before["pages_to_scan"]
        )),
        "{}",
        text(&next)
    );
    assert_eq!(snapshot_tunables(Path::new(KSM_SYSFS)), before);
    assert!(!env.journal().exists(), "records cleared");
    drop(back);
}

/// Two pagefolds hold the knobs at once. The second must keep the first
/// one's original (not the value the first one set); when the first is
/// killed, recovery must leave the knobs to the second, which restores the
/// true originals when it ends normally.
#[test]
fn a_killed_holder_does_not_take_the_knobs_from_a_live_one() {
    require_kvm();
    assert!(
        Path::new(KSM_SYSFS).join("run").exists(),
        "this machine has KSM; the test needs it"
    );
    let _lock = ksm_exclusive().unwrap();
    let back = KnobsBack::take();
    let before = back.before.clone();
    assert_ne!(before["pages_to_scan"], "777", "{before:?}");
    assert_ne!(before["pages_to_scan"], "555", "{before:?}");
    assert_ne!(before["run"], "1", "KSM is already running: {before:?}");
    let env = Env {
        tmp: TempDir::new("ksm-two"),
    };
    let mut a = env.start_holder_with("a", "777");
    let pid_a = a.id();
    env.wait_child(&mut a, "a", || {
        ksm_knob("pages_to_scan") == "777" && env.held_by("run", pid_a)
    });
    let mut b = env.start_holder_with("b", "555");
    let pid_b = b.id();
    env.wait_child(&mut b, "b", || {
        ksm_knob("pages_to_scan") == "555" && env.held_by("run", pid_b)
    });
    for name in ["pages_to_scan", "run"] {
        let rec = env.record(name).unwrap();
        assert_eq!(rec["original"], before[name].as_str(), "{rec}");
        assert!(
            env.held_by(name, pid_a) && env.held_by(name, pid_b),
            "{rec}"
        );
    }

    a.kill().unwrap();
    a.wait().unwrap();
    let restore = wait_bounded(
        env.cmd()
            .args(["ksm", "restore"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert!(restore.status.success(), "{}", text(&restore));
    let out = String::from_utf8_lossy(&restore.stdout);
    assert!(!out.contains("restored"), "{}", text(&restore));
    assert!(
        out.contains(&format!(
            "KSM pages_to_scan left as is: held by running pid {pid_b}"
        )),
        "{}",
        text(&restore)
    );
    assert_eq!(ksm_knob("pages_to_scan"), "555");
    assert_eq!(ksm_knob("run"), "1");
    // The dead holder was dropped from the records, the live one kept.
    assert!(!env.held_by("run", pid_a) && env.held_by("run", pid_b));

    // SIGTERM: pagefold stops its VMs and shuts the backend down cleanly.
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid_b as i32, libc::SIGTERM) }, 0);
    let out = wait_bounded(b, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(143), "{:?}", out.status);
    assert_eq!(snapshot_tunables(Path::new(KSM_SYSFS)), before);
    assert!(!env.journal().exists(), "records cleared");
    drop(back);
}
