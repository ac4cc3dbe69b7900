//! Write logs (`pagefold_dedup::writelog`): a page nobody wrote since its
//! last visit is neither hashed nor read from pagemap again; a logged write
//! to a merged page is noticed at the next pass; a write the log missed
//! (a device's) is found by the periodic full check, and no write is lost
//! either way.

mod common;

use std::sync::Arc;

use common::*;
use pagefold_dedup::testing::Core;
use pagefold_dedup::testing::VERIFY_PASSES;
use pagefold_dedup::RecordedWrites as Recorded;
use pagefold_dedup::{Knobs, RegionId};

const N: usize = 256;

/// A scanner core (the test drives its passes) over `a` and `b`, both in
/// group "g"; with `logs`, each region gets a write log.
fn core_over(a: &Mem, b: &Mem, logs: Option<(&Arc<Recorded>, &Arc<Recorded>)>) -> Core {
    let mut core = driven_core();
    let ids: Vec<RegionId> = [a, b]
        .iter()
        .zip(["a", "b"])
        .map(|(m, o)| {
            // SAFETY: `m` is a private anonymous mapping that the caller's
            // `Mem` keeps mapped for as long as it uses the returned core
            // (declared before it, so dropped after).
            unsafe { core.register(m.addr, m.pages * PS, o.into(), "g".into()) }.unwrap()
        })
        .collect();
    if let Some((la, lb)) = logs {
        core.set_write_log(ids[0], Some(la.clone()));
        core.set_write_log(ids[1], Some(lb.clone()));
    }
    core
}

/// Two regions of `N` pages filled from `from_a` and `from_b` (equal
/// values: the same content at the same offsets).
fn filled(from_a: u64, from_b: u64) -> (Mem, Mem) {
    let (a, b) = (Mem::new(N), Mem::new(N));
    a.fill_from(from_a);
    b.fill_from(from_b);
    (a, b)
}

/// Write logs for `a` and `b` (read by the core only when `logged`), and a
/// core over both that has run `passes` passes.
fn logged_core(
    a: &Mem,
    b: &Mem,
    logged: bool,
    passes: u64,
) -> (Arc<Recorded>, Arc<Recorded>, Core) {
    let (la, lb) = (Arc::new(Recorded::default()), Arc::new(Recorded::default()));
    let mut core = core_over(a, b, logged.then_some((&la, &lb)));
    core.run_passes(passes);
    (la, lb, core)
}

/// Pages hashed over `passes` passes of a settled pair of regions whose
/// pages are all distinct.
fn hashes_while_settled(logged: bool) -> (u64, u64) {
    let (a, b) = filled(1_000, 5_000);
    let (_, _, mut core) = logged_core(&a, &b, logged, 4);
    let (h0, c0) = (core.counters().pages_hashed, core.counters().clean_visits);
    core.run_passes(16);
    (
        core.counters().pages_hashed - h0,
        core.counters().clean_visits - c0,
    )
}

#[test]
fn pages_nobody_wrote_are_not_hashed_again() {
    let (with_log, clean) = hashes_while_settled(true);
    let (without, no_clean) = hashes_while_settled(false);
    // Without a log, unique pages climb to smart-scan level 3 and are hashed
    // once every 8 passes: 16 passes hash each page about twice.
    assert!(without >= N as u64 * 2 * 16 / 8 / 2, "{without}");
    assert_eq!(no_clean, 0);
    // With it, only the periodic check hashes them: each page once in
    // VERIFY_PASSES passes.
    let verify = (2 * N as u64 * 16).div_ceil(VERIFY_PASSES);
    assert!(
        with_log <= verify + 8,
        "{with_log} hashed, check allows {verify}"
    );
    assert!(with_log * 4 < without, "{with_log} vs {without}");
    assert!(clean > 0, "no visit was answered by the log");
}

#[test]
fn a_logged_write_is_seen_at_once_and_an_unlogged_one_by_the_check() {
    let (a, b) = filled(1_000, 1_000);
    let (_, lb, mut core) = logged_core(&a, &b, true, 3);
    assert_eq!(merged(&core), 2 * N as u64, "identical regions not merged");
    let breaks = core.counters().origins.cow_breaks.total();

    // A logged user-mode write to a merged page: copy-on-write, noticed at
    // the next pass whatever the page's smart-scan level.
    core.run_passes(8); // every merged page climbs to the top level
    b.fill(6, 77);
    lb.record(6);
    core.run_passes(1);
    assert_eq!(core.counters().origins.cow_breaks.total(), breaks + 1);
    assert_eq!(b.read(6), pattern(77));

    // A kernel-mode write the log does not see (a device's): the share
    // stays counted until the periodic check, then it is noticed.
    let fd = {
        // SAFETY: plain syscalls on our own memfd.
        let fd = unsafe { libc::memfd_create(c"write-log-src".as_ptr(), 0) };
        assert!(fd >= 0);
        let p = pattern(88);
        // SAFETY: `p` is a page-sized buffer.
        let n = unsafe { libc::pwrite(fd, p.as_ptr() as *const libc::c_void, PS, 0) };
        assert_eq!(n, PS as isize);
        fd
    };
    // SAFETY: page 9 of `a` is ours; pread writes PS bytes into it.
    let n = unsafe { libc::pread(fd, a.page_ptr(9) as *mut libc::c_void, PS, 0) };
    assert_eq!(n, PS as isize);
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    assert_eq!(a.read(9), pattern(88), "the device's write landed");
    let mut passes = 0;
    while core.counters().origins.cow_breaks.total() == breaks + 1 && passes <= VERIFY_PASSES {
        core.run_passes(1);
        passes += 1;
    }
    assert_eq!(
        core.counters().origins.cow_breaks.total(),
        breaks + 2,
        "an unlogged copy-on-write was not noticed in {passes} passes"
    );
    core.check_consistency().unwrap();
    // Every other page is still merged, with the contents it had.
    assert_eq!(merged(&core), 2 * N as u64 - 2);
    for i in (0..N).filter(|&i| i != 6 && i != 9) {
        assert_eq!(a.read(i), pattern(1_000 + i as u64), "a[{i}]");
        assert_eq!(b.read(i), pattern(1_000 + i as u64), "b[{i}]");
    }
}

/// Pages merged in `core`'s regions.
fn merged(core: &Core) -> u64 {
    core.regions().iter().map(|r| r.merged).sum()
}

/// Writes the same new content into one page of each region and records
/// the writes in their logs (which `core` may or may not read), runs the
/// pass that sees them (logged pages are due at once), then one wake-up
/// visiting a single page of the scan. Returns the pages merged before
/// and after that wake-up.
fn write_pair_then_wake_up(
    core: &mut Core,
    (a, la, pa): (&Mem, &Recorded, usize),
    (b, lb, pb): (&Mem, &Recorded, usize),
) -> (u64, u64) {
    a.fill(pa, 9_999);
    b.fill(pb, 9_999);
    la.record(pa);
    lb.record(pb);
    core.run_passes(1);
    let before = merged(core);
    core.run_batch(1, true);
    core.check_consistency().unwrap();
    assert_eq!(a.read(pa), pattern(9_999));
    assert_eq!(b.read(pb), pattern(9_999));
    (before, merged(core))
}

/// Identical content written into a page of each region (both writes
/// logged): the pass that hashes them finds them changed (KSM's rule: not
/// candidates yet); with a write log their second look comes at the next
/// wake-up, however small its budget, not a pass later.
#[test]
fn content_written_merges_at_the_next_wake_up() {
    let merged_after = |logged: bool| {
        let (a, b) = filled(1_000, 5_000);
        let (la, lb, mut core) = logged_core(&a, &b, logged, 3);
        assert_eq!(merged(&core), 0);
        write_pair_then_wake_up(&mut core, (&a, &la, 200), (&b, &lb, 17))
    };
    assert_eq!(
        merged_after(true),
        (0, 2),
        "logged: merged at the next wake-up"
    );
    assert_eq!(
        merged_after(false).1,
        0,
        "without a log it waits for a pass"
    );
}

/// How a test reports a device's write to the engine.
#[derive(Clone, Copy, PartialEq)]
enum Report {
    /// Not at all.
    Unreported,
    /// As an I/O hint, with hints off.
    HintWithHintsOff,
    /// As a plain device write (`device_wrote`: a received frame), hints on.
    DeviceWrote,
}

/// A device's reported write reaches the write log (KVM does not log it),
/// whether as an I/O hint while hints are off or as a plain device write
/// (a received frame): the copy-on-write it caused is noticed at the next
/// pass, not at the periodic check; a plain device write is no hint.
/// Unreported, it is not noticed in the same time (the page written lies
/// in the block whose periodic check is furthest away).
#[test]
fn a_reported_device_write_is_seen_at_the_next_pass() {
    use pagefold_dedup::testing::{VERIFY_BLOCK, VERIFY_PASSES};
    use pagefold_dedup::{DedupBackend, Engine, EngineConfig, Mode};
    use std::time::{Duration, Instant};

    const M: usize = 8 * VERIFY_BLOCK;
    let noticed_within = |report: Report, limit: Duration| -> bool {
        let (a, b) = (Mem::new(M), Mem::new(M));
        a.fill_from(1_000);
        b.fill_from(1_000);
        // A pass over 2 x 4096 pages at 64 (x4 clean visits) per 20 ms
        // wake-up: ~0.6 s, so `limit` is a handful of passes.
        let e = Engine::new(EngineConfig {
            knobs: Knobs {
                pages_to_scan: 64,
                sleep_millisecs: 20,
                max_page_sharing: 256,
            },
            adaptive: false,
            boost_max: 1,
            io_hints: report != Report::DeviceWrote,
            ..EngineConfig::default()
        })
        .unwrap();
        let (la, lb) = (Arc::new(Recorded::default()), Arc::new(Recorded::default()));
        let ia = a.register(&e, "a", "g");
        let ib = b.register(&e, "b", "g");
        e.set_write_log(ia, Some(la.clone()));
        e.set_write_log(ib, Some(lb.clone()));
        e.set_mode(Mode::On).unwrap();
        let t = Instant::now();
        while e.stats().pages_sharing < M as u64 {
            assert!(t.elapsed() < Duration::from_secs(60), "{:?}", e.stats());
            std::thread::sleep(Duration::from_millis(50));
        }
        let before = e.stats();
        // The block whose periodic check (pass + block = 0 mod 64) is
        // furthest from the current pass.
        let passes = before.full_scans;
        let block = (0..8u64)
            .max_by_key(|k| (2 * VERIFY_PASSES - (passes + k) % VERIFY_PASSES) % VERIFY_PASSES)
            .unwrap() as usize;
        let page = block * VERIFY_BLOCK + 5;
        // The device writes it (kernel-mode, as virtio-blk's pread).
        // SAFETY: plain syscalls on our own memfd; the page is ours.
        unsafe {
            let fd = libc::memfd_create(c"device".as_ptr(), 0);
            assert!(fd >= 0);
            let p = pattern(4_242);
            assert_eq!(libc::pwrite(fd, p.as_ptr().cast(), PS, 0), PS as isize);
            assert_eq!(libc::pread(fd, b.page_ptr(page).cast(), PS, 0), PS as isize);
            libc::close(fd);
        }
        match report {
            Report::Unreported => {}
            Report::HintWithHintsOff => e.hint(b.addr + page * PS, PS),
            Report::DeviceWrote => e.device_wrote(b.addr + page * PS, PS),
        }
        let t = Instant::now();
        let mut seen = false;
        while t.elapsed() < limit && !seen {
            std::thread::sleep(Duration::from_millis(20));
            seen = e.stats().cow_breaks > before.cow_breaks;
        }
        let s = e.stats();
        assert!(
            s.full_scans < passes + 32,
            "the test assumes a handful of passes: {s:?}"
        );
        assert_eq!(b.read(page), pattern(4_242));
        if report == Report::DeviceWrote {
            assert_eq!(s.hints, before.hints, "a device write is no hint: {s:?}");
        }
        e.check_consistency().unwrap();
        e.shutdown();
        seen
    };
    assert!(noticed_within(
        Report::HintWithHintsOff,
        Duration::from_secs(3)
    ));
    assert!(noticed_within(Report::DeviceWrote, Duration::from_secs(3)));
    assert!(!noticed_within(Report::Unreported, Duration::from_secs(3)));
}

/// A page its log saw written is mapped (a write maps a private page), so
/// its visit hashes it without a pagemap read; guests write scattered
/// pages, and each was a read of its own. A page marked for want of
/// knowledge (a new log, lost device ranges) may never have been touched,
/// and is still read first.
#[test]
fn written_pages_are_hashed_without_a_pagemap_read() {
    let (a, b) = filled(1_000, 5_000);
    let (la, _, mut core) = logged_core(&a, &b, true, 4);
    // Every 16th page of `a` rewritten with new distinct content: too far
    // apart for one read to bridge them.
    let written: Vec<usize> = (0..N).step_by(16).collect();
    for &p in &written {
        a.fill(p, 20_000 + p as u64);
        la.record(p);
    }
    let (reads, hashed) = (core.pagemap().reads(), core.counters().pages_hashed);
    core.run_passes(1);
    assert_eq!(
        core.counters().pages_hashed - hashed,
        written.len() as u64,
        "each written page hashed once, nothing else"
    );
    assert_eq!(core.pagemap().reads() - reads, 0, "no pagemap read");

    // Marked without a recorded write: read first, then visited.
    core.mark_all_written();
    let (reads, hashed) = (core.pagemap().reads(), core.counters().pages_hashed);
    core.run_passes(1);
    assert!(
        core.pagemap().reads() > reads,
        "marks of unknown writes read"
    );
    assert_eq!(core.counters().pages_hashed - hashed, 2 * N as u64);
    core.check_consistency().unwrap();
    for &p in &written {
        assert_eq!(a.read(p), pattern(20_000 + p as u64));
    }
}

/// If something other than a write changes a written page's mapping before
/// its visit (here the page is dropped, as a balloon would), the presumed
/// mapping costs a read fault, never content: the page reads zero, the
/// merge path checks it under protection as any other, and the next write
/// is the guest's.
#[test]
fn a_written_page_dropped_before_its_visit_stays_correct() {
    let (a, b) = filled(1_000, 5_000);
    let (la, _, mut core) = logged_core(&a, &b, true, 4);
    a.fill(40, 7);
    la.record(40);
    // SAFETY: pages 40.. of `a` are ours; dropping one is what a balloon
    // does to guest RAM.
    unsafe { libc::madvise(a.page_ptr(40).cast(), PS, libc::MADV_DONTNEED) };
    core.run_passes(3);
    core.check_consistency().unwrap();
    assert_eq!(a.read(40), vec![0u8; PS]);
    a.fill(40, 8);
    la.record(40);
    core.run_passes(3);
    core.check_consistency().unwrap();
    assert_eq!(a.read(40), pattern(8));
    for i in (0..N).filter(|&i| i != 40) {
        assert_eq!(a.read(i), pattern(1_000 + i as u64), "a[{i}]");
        assert_eq!(b.read(i), pattern(5_000 + i as u64), "b[{i}]");
    }
}

/// A page written for the first time (never hashed before) gets its second
/// look at the next wake-up where the group's merges are scattered (each a
/// VMA of its own whatever the order); where they make runs it waits for
/// the scan's next pass, so that two guests filling memory still pair in
/// runs.
#[test]
fn first_written_pages_merge_at_the_next_wake_up_where_merges_are_scattered() {
    let merged_after = |scattered: bool| {
        let (a, b) = (Mem::new(N), Mem::new(N));
        // Pages 0..128 hold content both regions have: at the same
        // offsets, or b's page 37 * i % 128 holds a's page i. The rest is
        // never touched.
        for i in 0..128 {
            let j = if scattered { (37 * i) % 128 } else { i };
            a.fill(i, 1_000 + i as u64);
            b.fill(j, 1_000 + i as u64);
        }
        let (la, lb) = (Arc::new(Recorded::default()), Arc::new(Recorded::default()));
        let mut core = core_over(&a, &b, Some((&la, &lb)));
        core.run_passes(2);
        assert_eq!(merged(&core), 256, "shared content not merged");
        // The pass that sees the writes hashes both pages for the first
        // time.
        write_pair_then_wake_up(&mut core, (&a, &la, 200), (&b, &lb, 170))
    };
    assert_eq!(merged_after(true), (256, 258), "scattered: next wake-up");
    assert_eq!(merged_after(false), (256, 256), "runs: the next pass");
}

/// The logs are collected once per interval (`LOG_INTERVAL`), and a
/// written page's second look waits for the collection after its visit:
/// no wake-up before it merges the page, and a write in between (the
/// guest still using the page) keeps it unmerged.
#[test]
fn a_written_page_merges_only_if_the_next_collection_finds_it_unwritten() {
    use std::time::Duration;
    let merged_after = |rewrite: bool| {
        let (a, b) = filled(1_000, 5_000);
        let (la, lb, mut core) = logged_core(&a, &b, true, 3);
        a.fill(200, 9_999);
        b.fill(17, 9_999);
        la.record(200);
        lb.record(17);
        // The pass that sees the writes hashes both pages: changed.
        core.run_passes(1);
        let hashed = merged(&core);
        core.set_log_interval(Duration::from_secs(3600));
        core.run_batch(1, true);
        let before_collection = merged(&core);
        if rewrite {
            a.fill(200, 9_999);
            la.record(200);
        }
        core.set_log_interval(Duration::ZERO);
        core.run_batch(1, true);
        core.check_consistency().unwrap();
        assert_eq!(a.read(200), pattern(9_999));
        assert_eq!(b.read(17), pattern(9_999));
        (hashed, before_collection, merged(&core))
    };
    assert_eq!(
        merged_after(false),
        (0, 0, 2),
        "merged after the collection"
    );
    assert_eq!(merged_after(true), (0, 0, 0), "written again: not merged");
}
