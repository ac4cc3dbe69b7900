//! Tests on this machine's real KSM. Each takes the KSM lock (a process
//! mutex and an flock shared with other test binaries and the benchmark),
//! snapshots every KSM tunable, and checks after the backend is gone (also
//! when the test body failed) that every tunable is back as found. None
//! assumes that no other process uses KSM: host-wide counters get lower
//! bounds only, and our own pages are checked exactly via kpageflags.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;
use crate::auto::{ScriptHandle, ScriptedSource};
use crate::ksm::{count_ksm_pages, ksm_exclusive, self_ksm_stat, snapshot_tunables, KsmError};
use crate::settings::DedupSettings;

const PAGE: usize = 4096;

/// A private anonymous mapping, unmapped on drop.
struct Anon {
    ptr: *mut u8,
    len: usize,
}

impl Anon {
    fn new(pages: usize, byte: u8) -> Self {
        let len = pages * PAGE;
        let ptr = crate::mm::map_anon(len).expect("mmap");
        // SAFETY: ptr..ptr+len was just mapped read-write by us.
        unsafe { std::ptr::write_bytes(ptr, byte, len) };
        Self { ptr, len }
    }

    fn spec(&self, owner: &str) -> RegionSpec {
        RegionSpec {
            host_addr: self.ptr as usize,
            len: self.len,
            owner: owner.into(),
            group: "g".into(),
            security: Default::default(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped for self's lifetime, only written through &mut self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn write(&mut self, off: usize, b: u8) {
        assert!(off < self.len);
        // SAFETY: in bounds of our own mapping.
        unsafe { *self.ptr.add(off) = b };
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: exactly what new() mapped; `bytes` borrows self, so no
        // slice of it outlives the drop.
        unsafe { crate::mm::unmap(self.ptr, self.len) };
    }
}

/// Runs `body` holding the KSM lock; afterwards (pass or fail) checks that
/// every KSM tunable is back to what it was.
fn with_real_ksm(body: impl FnOnce() + std::panic::UnwindSafe) {
    let root = Path::new(KSM_SYSFS);
    assert!(root.exists(), "this machine has KSM; the tests need it");
    let _lock = ksm_exclusive().unwrap();
    // What a killed pagefold left changed goes back first (the backend
    // would do it anyway, after `before` was taken).
    crate::ksm::journal::recover();
    let before = snapshot_tunables(root);
    let result = std::panic::catch_unwind(body);
    let after = snapshot_tunables(root);
    if result.is_ok() {
        assert_eq!(after, before, "KSM tunables not restored");
    } else if after != before {
        eprintln!("KSM tunables not restored after a failure: {before:?} -> {after:?}");
    }
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

fn merging_pages() -> u64 {
    self_ksm_stat()
        .and_then(|s| s.merging_pages)
        .expect("this kernel has ksm_merging_pages")
}

impl Anon {
    /// Pages of this region that are KSM pages right now (exact).
    fn ksm_pages(&self) -> u64 {
        count_ksm_pages(self.ptr as usize, self.len).unwrap()
    }
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fast_knobs(b: &KsmBackend) {
    b.apply(
        &DedupSettings {
            pages_to_scan: Some(1000),
            sleep_millisecs: Some(10),
            ..Default::default()
        }
        .validate()
        .unwrap(),
    )
    .unwrap();
}

#[test]
fn merges_identical_pages_then_unmerges() {
    with_real_ksm(|| {
        let b = KsmBackend::new().unwrap();
        let mut region = Anon::new(64, 0x5a);
        // SAFETY: region is a private anonymous mapping alive past unregister.
        let id = unsafe { b.register(region.spec("vm0")) }.unwrap();
        fast_knobs(&b);
        b.set_mode(Mode::On).unwrap();
        assert_eq!(b.inner.sysfs.read_u64("run").unwrap(), 1);
        assert_eq!(b.inner.sysfs.read_u64("pages_to_scan").unwrap(), 1000);
        wait_for("64 merged pages", Duration::from_secs(30), || {
            region.ksm_pages() == 64
        });
        // The per-process counter includes at least our 64 pages (it may
        // still hold stale items of earlier, unmapped regions).
        wait_for("ksm_merging_pages", Duration::from_secs(30), || {
            merging_pages() >= 64
        });
        let s = b.stats();
        assert_eq!(s.backend, "ksm");
        assert_eq!(s.mode, Mode::On);
        assert!(s.pages_shared >= 1, "{s:?}");
        assert!(s.pages_sharing >= 63, "{s:?}");
        let o = &s.per_owner["vm0"];
        assert_eq!(o.pages_tracked, 64);
        assert!(o.pages_merged >= 64, "{o:?}");
        assert!(s.bytes_saved >= 64 * PAGE as u64);
        assert!(s.cpu_seconds >= 0.0);
        // Merged contents are unchanged, and a write breaks only one page.
        assert!(region.bytes().iter().all(|&x| x == 0x5a));
        region.write(5 * PAGE + 7, 1);
        assert_eq!(region.bytes()[5 * PAGE + 7], 1);
        assert!(region.bytes()[6 * PAGE..].iter().all(|&x| x == 0x5a));
        // max_page_sharing cannot change while KSM pages exist.
        let knobs_before = b.knobs();
        let mps = b.inner.sysfs.read_u64("max_page_sharing").unwrap();
        let e = b
            .apply(
                &DedupSettings {
                    max_page_sharing: Some(128),
                    ..Default::default()
                }
                .validate()
                .unwrap(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("unmerge first"), "{e}");
        assert_eq!(b.knobs(), knobs_before, "a refused update changes nothing");
        assert_eq!(b.inner.sysfs.read_u64("max_page_sharing").unwrap(), mps);
        // Unmerge: every page gets its own copy back, run ends at 0.
        b.set_mode(Mode::Unmerge).unwrap();
        assert_eq!(b.mode(), Mode::Unmerge);
        assert_eq!(b.inner.sysfs.read_u64("run").unwrap(), 0);
        assert_eq!(merging_pages(), 0);
        assert_eq!(region.ksm_pages(), 0);
        assert!(region.bytes()[6 * PAGE..].iter().all(|&x| x == 0x5a));
        b.unregister(id).unwrap();
        assert!(b.touched_knobs().contains(&"run".to_string()));
    });
}

#[test]
fn unregister_unmerges_the_region() {
    with_real_ksm(|| {
        let b = KsmBackend::new().unwrap();
        let region = Anon::new(32, 0x33);
        // SAFETY: region outlives the registration.
        let id = unsafe { b.register(region.spec("vm1")) }.unwrap();
        fast_knobs(&b);
        b.set_mode(Mode::On).unwrap();
        wait_for("32 merged pages", Duration::from_secs(30), || {
            region.ksm_pages() == 32
        });
        b.unregister(id).unwrap();
        // Unmerged at once; the counter follows at ksmd's next pass.
        assert_eq!(
            region.ksm_pages(),
            0,
            "region still merged after unregister"
        );
        wait_for("ksm_merging_pages to drop", Duration::from_secs(30), || {
            merging_pages() == 0
        });
        assert!(matches!(b.unregister(id), Err(Error::UnknownRegion(_))));
        assert!(region.bytes().iter().all(|&x| x == 0x33));
    });
}

#[test]
fn max_page_sharing_changes_when_nothing_is_shared_and_is_restored() {
    with_real_ksm(|| {
        let b = KsmBackend::new().unwrap();
        if b.inner.sysfs.read_u64("pages_shared").unwrap() > 0 {
            // Another process holds KSM pages: only the refusal is testable.
            let e = b
                .apply(
                    &DedupSettings {
                        max_page_sharing: Some(100),
                        ..Default::default()
                    }
                    .validate()
                    .unwrap(),
                )
                .unwrap_err();
            assert!(e.to_string().contains("max_page_sharing"), "{e}");
            return;
        }
        let orig = b.inner.sysfs.read_u64("max_page_sharing").unwrap();
        let want = if orig == 100 { 101 } else { 100 };
        let k = b
            .apply(
                &DedupSettings {
                    max_page_sharing: Some(want),
                    ..Default::default()
                }
                .validate()
                .unwrap(),
            )
            .unwrap();
        assert_eq!(k.max_page_sharing, want);
        assert_eq!(b.inner.sysfs.read_u64("max_page_sharing").unwrap(), want);
        b.shutdown();
        assert_eq!(b.inner.sysfs.read_u64("max_page_sharing").unwrap(), orig);
        // Idempotent, and the backend refuses further work.
        b.shutdown();
        assert!(b.set_mode(Mode::On).is_err());
    });
}

fn scripted_backend() -> (KsmBackend, ScriptHandle) {
    const TOTAL: u64 = 16 << 30;
    let src = ScriptedSource::new(ScriptedSource::sample(TOTAL, TOTAL / 2));
    let h = src.handle();
    let b = KsmBackend::with_options(KsmOptions {
        auto: AutoConfig {
            sample_interval_ms: 0,
            ..AutoConfig::default()
        },
        memory_source: Some(Box::new(src)),
        ..KsmOptions::default()
    })
    .unwrap();
    (b, h)
}

#[test]
fn auto_mode_runs_ksm_only_while_memory_is_low() {
    with_real_ksm(|| {
        const TOTAL: u64 = 16 << 30;
        let (b, h) = scripted_backend();
        let region = Anon::new(64, 0x77);
        // SAFETY: region outlives the registration.
        let id = unsafe { b.register(region.spec("vm2")) }.unwrap();
        fast_knobs(&b);
        b.set_mode(Mode::Auto).unwrap();
        let run = || b.inner.sysfs.read_u64("run").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(run(), 0, "plenty of memory: KSM must not run");
        assert_eq!(region.ksm_pages(), 0);
        assert!(!b.auto_handle().status().auto_triggered);
        // Free memory drops below 20 %: KSM runs and merges.
        h.set(ScriptedSource::sample(TOTAL, TOTAL / 10));
        wait_for("run = 1", Duration::from_secs(5), || run() == 1);
        wait_for("merges in auto mode", Duration::from_secs(30), || {
            region.ksm_pages() == 64
        });
        let st = b.auto_handle().status();
        assert!(st.auto_triggered);
        assert_eq!(st.triggered_times, 1);
        let pts = b.inner.sysfs.read_u64("pages_to_scan").unwrap();
        assert_eq!(pts % 1000, 0, "pages_to_scan = knob x factor, got {pts}");
        // Between the lines: keeps running.
        h.set(ScriptedSource::sample(TOTAL, TOTAL / 4));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(run(), 1);
        // Above threshold + total/16: stops.
        h.set(ScriptedSource::sample(TOTAL, TOTAL / 2));
        wait_for("run = 0", Duration::from_secs(5), || run() == 0);
        assert!(!b.auto_handle().status().auto_triggered);
        b.set_mode(Mode::Off).unwrap();
        b.unregister(id).unwrap();
    });
}

#[test]
fn rejects_bad_and_overlapping_regions() {
    with_real_ksm(|| {
        let b = KsmBackend::new().unwrap();
        let region = Anon::new(4, 0);
        let mut spec = region.spec("vm3");
        spec.host_addr += 1;
        assert!(matches!(
            // SAFETY: a misaligned range is rejected before any madvise.
            unsafe { b.register(spec) },
            Err(Error::BadRegion { .. })
        ));
        // SAFETY: region outlives the registration.
        let id = unsafe { b.register(region.spec("vm3")) }.unwrap();
        let mut half = region.spec("vm4");
        half.host_addr += 2 * PAGE;
        half.len = 2 * PAGE;
        assert!(matches!(
            // SAFETY: the overlap is rejected before any madvise.
            unsafe { b.register(half) },
            Err(Error::Overlap { .. })
        ));
        b.unregister(id).unwrap();
    });
}

#[test]
fn missing_ksm_is_a_clear_error() {
    let e = KsmBackend::with_options(KsmOptions {
        sysfs_root: "/nonexistent/mm/ksm".into(),
        ..KsmOptions::default()
    })
    .err()
    .unwrap();
    assert!(matches!(e, KsmError::Absent { .. }));
    let api: Error = e.into();
    assert!(api.to_string().contains("KSM is not available"), "{api}");
}
