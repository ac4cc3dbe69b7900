//! The settle time (`scanner/settle.rs`): a scan whose merges the guest
//! keeps undoing waits longer between passes and merges nothing at first
//! sight; once its merges last, it goes back to full pace.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pagefold_dedup::testing::Core;
use pagefold_dedup::RecordedWrites as Recorded;
use pagefold_dedup::RegionId;
use pagefold_dedup::{DedupBackend, DedupSettings, Engine, Mode, Stats};

const N: usize = 1024;

/// Registers `m` with `core` as owner `owner` of group "g".
fn register(core: &mut Core, m: &Mem, owner: &str) -> RegionId {
    // SAFETY: `m` is a private anonymous mapping that the test keeps
    // mapped for as long as it uses the core (declared before it, so
    // dropped after).
    unsafe { core.register(m.addr, m.pages * PS, owner.into(), "g".into()) }.unwrap()
}

/// Registers `a` and `b` as owners "a" and "b", each with a write log the
/// test records its writes in.
fn register_logged(core: &mut Core, a: &Mem, b: &Mem) -> [Arc<Recorded>; 2] {
    let logs = [Arc::new(Recorded::default()), Arc::new(Recorded::default())];
    for ((m, owner), log) in [(a, "a"), (b, "b")].into_iter().zip(&logs) {
        let id = register(core, m, owner);
        core.set_write_log(id, Some(log.clone()));
    }
    logs
}

/// Three regions of `N` pages with the same content page by page: a and
/// b to merge together, c to join their slots later.
fn three_alike() -> (Mem, Mem, Mem) {
    let m = [Mem::new(N), Mem::new(N), Mem::new(N)];
    for x in &m {
        x.fill_from(1);
    }
    let [a, b, c] = m;
    (a, b, c)
}

fn merged(core: &Core, owner: &str) -> u64 {
    core.stats().per_owner[owner].pages_merged
}

#[test]
fn undone_merges_slow_the_passes_and_stop_first_sight_merges() {
    let (a, b, c) = three_alike();
    let mut core = driven_core();
    register(&mut core, &a, "a");
    register(&mut core, &b, "b");
    core.run_passes(2);
    let s = core.stats();
    assert_eq!(s.pages_sharing, N as u64, "{s:?}");
    assert_eq!(s.settle_ms, 0, "merges that last: {s:?}");

    // The guest writes every page of a: copy-on-write undoes N merges,
    // noticed in the next pass, which then settles the scan.
    a.fill_from(1 << 20);
    core.run_passes(1);
    let s = core.stats();
    assert_eq!(s.cow_breaks, N as u64, "{s:?}");
    assert_eq!(s.settle_ms, 2000, "{s:?}");

    // The next pass waits for the settle time since the last one started.
    let rep = core.run_batch(1 << 20, true);
    assert_eq!((rep.spent, rep.merges), (0, 0), "{rep:?}");

    // c holds b's content, which the pool has: with the scan settled, it
    // merges on its second sight, not at its first (whole passes, which
    // do not wait).
    register(&mut core, &c, "c");
    core.run_passes(1);
    assert_eq!(merged(&core, "c"), 0, "{:?}", core.stats());
    core.run_passes(1);
    assert_eq!(merged(&core, "c"), N as u64, "{:?}", core.stats());
    assert_eq!(core.stats().settle_ms, 2000, "not held for its length yet");

    // Once the settle time has passed the next pass runs, and the merges
    // that lasted bring the scan back to full pace.
    std::thread::sleep(Duration::from_millis(2100));
    let rep = core.run_batch(1 << 20, true);
    assert!(rep.spent > 0, "{rep:?}");
    while !core.run_batch(1 << 20, true).pass_completed {}
    assert_eq!(core.stats().settle_ms, 0, "{:?}", core.stats());
    for i in 0..N {
        assert_eq!(a.read(i), pattern((1 << 20) + i as u64), "a page {i}");
        assert_eq!(c.read(i), pattern(1 + i as u64), "c page {i}");
    }
    core.check_consistency().unwrap();
}

#[test]
fn without_undone_merges_a_new_region_merges_at_first_sight() {
    // The same content as above, no copy-on-write: c joins the pool's
    // slots in its first pass.
    let (a, b, c) = three_alike();
    let mut core = driven_core();
    register(&mut core, &a, "a");
    register(&mut core, &b, "b");
    core.run_passes(2);
    register(&mut core, &c, "c");
    core.run_passes(1);
    assert_eq!(core.stats().settle_ms, 0);
    assert_eq!(merged(&core, "c"), N as u64, "{:?}", core.stats());
}

#[test]
fn logged_writes_to_merged_pages_are_taken_back_at_the_next_collection() {
    let (a, b, _) = three_alike();
    let mut core = driven_core();
    let logs = register_logged(&mut core, &a, &b);
    core.run_passes(2);
    // A wake-up collects the logs after the merges (as the engine does
    // every second).
    core.run_batch(1, true);
    let s = core.stats();
    assert_eq!((s.pages_sharing, s.settle_ms), (N as u64, 0), "{s:?}");

    // The guest writes every page of a, and the log records it. A wake-up
    // that visits one page collects the log and takes the broken shares
    // back at once, which settles the scan: not a pass later.
    a.fill_from(1 << 20);
    for p in 0..N {
        logs[0].record(p);
    }
    core.run_batch(1, true);
    let s = core.stats();
    assert_eq!((s.cow_breaks, s.settle_ms), (N as u64, 2000), "{s:?}");
    assert_eq!(merged(&core, "a"), 0, "{s:?}");
    assert_eq!(s.per_owner["a"].cow_breaks, Some(N as u64), "{s:?}");
    // The scan's later visits find those pages unmerged: the breaks are
    // not counted twice (which would settle the scan one step further).
    // Two passes: the current one started at the wake-ups above.
    core.run_passes(2);
    let s = core.stats();
    assert_eq!((s.cow_breaks, s.settle_ms), (N as u64, 2000), "{s:?}");
    for i in 0..N {
        assert_eq!(a.read(i), pattern((1 << 20) + i as u64), "a page {i}");
        assert_eq!(b.read(i), pattern(1 + i as u64), "b page {i}");
    }
    core.check_consistency().unwrap();
}

#[test]
fn a_write_logged_before_its_page_merged_is_no_break() {
    // Pages written after the collection before their visit, then merged:
    // the next collection reports the writes, which the merge's compare
    // already saw.
    let (a, b, _) = three_alike();
    let mut core = driven_core();
    let logs = register_logged(&mut core, &a, &b);
    core.run_passes(1);
    for p in 0..N {
        logs[0].record(p);
        logs[1].record(p);
    }
    core.run_passes(1);
    assert_eq!(core.stats().pages_sharing, N as u64, "{:?}", core.stats());
    core.run_batch(1, true);
    let s = core.stats();
    assert_eq!((s.cow_breaks, s.settle_ms), (0, 0), "{s:?}");
}

/// Applies `settle` to the engine, as `PATCH /dedup {"settle": ...}` and
/// the config file's `[dedup]` do.
fn apply_settle(e: &Engine, on: bool) {
    let s = DedupSettings {
        settle: Some(on),
        ..DedupSettings::default()
    };
    e.apply(&s.validate().unwrap()).unwrap();
}

/// Waits (up to 30 s) until the engine's statistics satisfy `done`.
fn wait_for(e: &Engine, what: &str, done: impl Fn(&Stats) -> bool) {
    let waited = wait_until(Duration::from_secs(30), Duration::from_millis(5), || {
        done(&e.stats())
    });
    assert!(waited.is_some(), "{what}: {:?}", e.stats());
}

#[test]
fn settle_off_applied_to_a_running_engine_keeps_its_full_pace() {
    let (a, b, _) = three_alike();
    let e = engine(256);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.set_mode(Mode::On).unwrap();
    wait_for(&e, "a and b merged", |s| s.pages_sharing == N as u64);
    assert_eq!(e.stats().settle, Some(true), "on by default");

    // The guest undoes every merge: the scanner settles.
    a.fill_from(1 << 20);
    wait_for(&e, "settled", |s| s.settle_ms > 0);

    // Off while it runs: the scanner's next wake-up hands it to the core,
    // whose settle time drops to 0.
    apply_settle(&e, false);
    wait_for(&e, "settle off", |s| {
        s.settle == Some(false) && s.settle_ms == 0
    });

    // The guest merges and undoes as before; the time stays 0 meanwhile
    // (the undone merges would settle the scan again).
    let breaks = e.stats().cow_breaks;
    let mut seen = Vec::new();
    a.fill_from(1);
    wait_until(Duration::from_secs(30), Duration::from_millis(2), || {
        let s = e.stats();
        seen.push(s.settle_ms);
        s.pages_sharing == N as u64
    })
    .expect("merged again");
    a.fill_from(2 << 20);
    let scans = e.stats().full_scans;
    wait_until(Duration::from_secs(30), Duration::from_millis(2), || {
        let s = e.stats();
        seen.push(s.settle_ms);
        s.cow_breaks >= breaks + N as u64 && s.full_scans >= scans + 3
    })
    .expect("merges undone again, and passes after");
    assert!(seen.iter().all(|&ms| ms == 0), "settle_ms {seen:?}");
    assert_eq!(e.stats().settle, Some(false));

    // On again, the merges the guest undid meanwhile settle the scan.
    apply_settle(&e, true);
    wait_for(&e, "settled again", |s| {
        s.settle == Some(true) && s.settle_ms > 0
    });
    e.shutdown();
    for i in 0..N {
        assert_eq!(a.read(i), pattern((2 << 20) + i as u64), "a page {i}");
        assert_eq!(b.read(i), pattern(1 + i as u64), "b page {i}");
    }
    e.check_consistency().unwrap();
}
