//! Auto mode and run-time mode changes on live workload VMs, with the
//! pagefold engine and with the kernel's KSM.

mod common;

use std::time::{Duration, Instant};

use common::dedup::*;
use common::linux_host::{self, Emulation};
use common::Hog;
use pagefold_dedup::auto::{MemSample, ScriptedSource};
use pagefold_dedup::Mode;

const T: Duration = Duration::from_secs(90);
const GIB: u64 = 1 << 30;
const TOTAL: u64 = 16 * GIB;

fn sample(free: u64) -> MemSample {
    ScriptedSource::sample(TOTAL, free)
}

fn config(mode: &str, backend: &str, dedup_extra: &str, phases: &str, extra: &str) -> String {
    let vm = |name: &str| {
        format!(
            r#"
            [[vm]]
            name = "{name}"
            memory = "64M"
            serial = "null"
            dedup = {{ group = "g" }}
            [vm.workload]
            seed = 11
            shared = "24M"
            private = "8M"
            zero_permille = 50
            phases = [{phases}]
            {extra}
            "#
        )
    };
    format!(
        "[dedup]\nmode = \"{mode}\"\nbackend = \"{backend}\"\n{dedup_extra}\n{}{}",
        vm("a"),
        vm("b")
    )
}

fn auto_status(r: &pagefold_vmm::runner::Runner) -> pagefold_dedup::auto::AutoStatus {
    r.handle().auto().expect("auto handle").status()
}

/// Free memory follows a script: no merging while it is plentiful (only a
/// slow checksum scan), merging once it falls below the threshold, no stop
/// between the two lines, and no more merging after it recovers.
#[test]
fn auto_mode_merges_only_while_memory_is_short() {
    let src = ScriptedSource::new(sample(15 * GIB));
    let script = src.handle();
    let mut r = start_with_source(
        &config("auto", "pagefold", "", r#""fill", "wait", "verify""#, ""),
        Box::new(src),
    );
    wait_phases(&mut r, 1, T);
    std::thread::sleep(Duration::from_millis(1500));
    let s = stats(&r);
    let a = auto_status(&r);
    assert!(!a.auto_triggered, "{a:?}");
    assert_eq!(a.triggered_times, 0);
    assert!(
        a.rounds > 10,
        "the untriggered controller should keep planning slow rounds: {a:?}"
    );
    assert_eq!(
        (s.merges, s.pages_sharing),
        (0, 0),
        "merged while memory was plentiful: {s:?}"
    );

    // Below the threshold (20% of 16 GiB = 3.2 GiB): merging starts.
    script.set(sample(2 * GIB));
    wait_for(&mut r, "merging after the trigger", T, |r| {
        stats(r).pages_sharing > 1000
    });
    let a = auto_status(&r);
    assert!(a.auto_triggered && a.triggered_times == 1, "{a:?}");
    assert_eq!(a.trigger_bytes, TOTAL / 5);
    assert_eq!(a.stop_bytes, TOTAL / 5 + TOTAL / 16);

    // Between the trigger and the stop line: still triggered (hysteresis).
    script.set(sample(TOTAL / 5 + TOTAL / 32));
    std::thread::sleep(Duration::from_millis(500));
    assert!(auto_status(&r).auto_triggered);

    // Above the stop line: merging stops, merged pages stay merged.
    script.set(sample(10 * GIB));
    wait_for(&mut r, "auto mode to stop", T, |r| {
        !auto_status(r).auto_triggered
    });
    let m = stats(&r).merges;
    std::thread::sleep(Duration::from_millis(1000));
    let s = stats(&r);
    assert_eq!(s.merges, m, "merged after memory recovered: {s:?}");
    assert!(s.pages_sharing > 0);
    assert_eq!(auto_status(&r).triggered_times, 1);
    finish_ok(r);
}

/// Auto mode on the host's own memory, not a script: inside a throwaway
/// emulated host of 2 GiB (its free memory is host-wide state), a process
/// takes memory until `MemAvailable` is below the trigger line; the engine
/// starts merging the two VMs; once that memory is given back and
/// available memory is above the stop line again, it stops merging and
/// what it merged stays merged.
#[test]
fn auto_mode_follows_the_hosts_own_available_memory() {
    let test = "auto_mode_follows_the_hosts_own_available_memory";
    if !linux_host::run_here(
        test,
        &Emulation {
            memory: "2G",
            disposable: true,
            timeout: Duration::from_secs(600),
            ..Emulation::default()
        },
    ) {
        return;
    }
    let mut r = start(&config(
        "auto",
        "pagefold",
        "auto_threshold = 40",
        r#""fill", "wait", "verify""#,
        "",
    ));
    wait_phases(&mut r, 1, T);
    std::thread::sleep(Duration::from_millis(1500));
    let a = auto_status(&r);
    assert!(
        !a.auto_triggered && a.available_bytes > a.stop_bytes,
        "{a:?}"
    );
    assert_eq!(stats(&r).merges, 0, "merged with memory to spare: {a:?}");

    // Take memory until 256 MiB under the trigger line.
    let take = a.available_bytes - (a.trigger_bytes - 256 * MIB);
    let hog = Hog::take(take as usize);
    wait_for(&mut r, "merging once memory is short", T, |r| {
        stats(r).pages_sharing > 1000
    });
    let a = auto_status(&r);
    assert!(a.auto_triggered && a.triggered_times == 1, "{a:?}");
    assert!(a.available_bytes < a.trigger_bytes, "{a:?}");
    eprintln!(
        "{test}: took {} MiB; merging at {} MiB available (trigger {} MiB)",
        take / MIB,
        a.available_bytes / MIB,
        a.trigger_bytes / MIB
    );

    // Given back: above the stop line, merging stops; merged pages stay.
    drop(hog);
    wait_for(&mut r, "auto mode to stop", T, |r| {
        !auto_status(r).auto_triggered
    });
    let m = stats(&r).merges;
    std::thread::sleep(Duration::from_millis(1000));
    let s = stats(&r);
    assert_eq!(s.merges, m, "merged after memory recovered: {s:?}");
    assert!(s.pages_sharing > 1000, "{s:?}");
    finish_ok(r);
}

const MIB: u64 = 1 << 20;

/// on -> auto -> unmerge -> off while the guests rewrite memory: no write
/// is lost (every verify phase passes).
#[test]
fn mode_changes_while_guests_write_lose_nothing() {
    let src = ScriptedSource::new(sample(GIB)); // short of memory: auto merges
    let mut r = start_with_source(
        &config(
            "on",
            "pagefold",
            "pages_to_scan = 10000\nsleep_millisecs = 0",
            r#""fill", "churn:3000", "verify", "churn:3000", "verify", "wait", "verify""#,
            "churn_permille = 500",
        ),
        Box::new(src),
    );
    wait_phases(&mut r, 1, T);
    let t0 = Instant::now();
    wait_for(&mut r, "merges in mode on", T, |r| stats(r).merges > 0);
    std::thread::sleep(Duration::from_millis(500));
    set_mode(&r, Mode::Auto);
    wait_for(&mut r, "auto to trigger", T, |r| {
        auto_status(r).auto_triggered
    });
    std::thread::sleep(Duration::from_millis(700));
    set_mode(&r, Mode::Unmerge);
    wait_for(&mut r, "unmerge to finish", T, |r| {
        let s = stats(r);
        s.mode == Mode::Off && s.pages_sharing == 0
    });
    set_mode(&r, Mode::Off);
    assert!(t0.elapsed() < Duration::from_secs(60));
    wait_phases(&mut r, 5, T);
    finish_ok(r);
}

/// The kernel-KSM backend on live VMs: merges the guests' identical pages,
/// unmerges them, and leaves every KSM knob as it found it.
#[test]
fn ksm_backend_merges_guest_memory_and_restores_knobs() {
    let _lock = pagefold_dedup::ksm::ksm_exclusive().expect("KSM test lock");
    let root = std::path::Path::new(pagefold_dedup::ksm::KSM_SYSFS);
    let before = pagefold_dedup::ksm::snapshot_tunables(root);
    {
        let mut r = start(&config(
            "on",
            "ksm",
            "pages_to_scan = 10000\nsleep_millisecs = 0",
            r#""fill", "wait", "verify""#,
            "",
        ));
        wait_phases(&mut r, 1, T);
        let e = {
            let (a, b) = (&r.vms()[0], &r.vms()[1]);
            expectation(&[a, b])
        };
        wait_for(&mut r, "KSM to merge the guests' duplicates", T, |r| {
            stats(r).merges >= e.sharing_pages
        });
        set_mode(&r, Mode::Unmerge);
        wait_for(&mut r, "KSM unmerge", T, |r| stats(r).merges == 0);
        finish_ok(r);
    }
    let after = pagefold_dedup::ksm::snapshot_tunables(root);
    assert_eq!(before, after, "KSM knobs not restored");
}
