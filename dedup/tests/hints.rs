//! I/O hints: pages a device just filled (two VMs reading the same file into
//! their page caches, at unrelated addresses) merge at the next wake-up,
//! long before the regular scan would have visited them twice.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::{DedupBackend, Engine, EngineConfig, Knobs, Mode};

const N: usize = 4096;
const FILE: usize = 256;

fn slow_engine() -> Engine {
    // A regular pass over 2 x 4096 pages at 64 pages per 200 ms takes ~25 s
    // and merging needs two visits: anything merged within a second came
    // from the hints.
    Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 64,
            sleep_millisecs: 200,
            max_page_sharing: 256,
        },
        adaptive: false,
        ..EngineConfig::default()
    })
    .unwrap()
}

#[test]
fn device_filled_pages_merge_at_the_next_wake_up() {
    let (a, b) = (Mem::new(N), Mem::new(N));
    let e = slow_engine();
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.set_mode(Mode::On).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // VM a reads a 1 MiB file into pages 1000.., VM b into pages 3000..
    // (in two requests, as a driver splitting a read would).
    for i in 0..FILE {
        a.fill(1000 + i, 77_000 + i as u64);
        b.fill(3000 + i, 77_000 + i as u64);
    }
    let t0 = Instant::now();
    e.hint(a.addr + 1000 * PS, FILE * PS);
    std::thread::sleep(Duration::from_millis(50));
    e.hint(b.addr + 3000 * PS, FILE / 2 * PS);
    e.hint(b.addr + (3000 + FILE / 2) * PS, FILE / 2 * PS);
    let pm = Pagemap::open().unwrap();
    let all_shared = || (0..FILE).all(|i| a.pfn(&pm, 1000 + i) == b.pfn(&pm, 3000 + i));
    while !all_shared() {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "hinted duplicates not merged after {:?}: {:?}",
            t0.elapsed(),
            e.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The pagemap shows a merge as soon as it is made; the stats are
    // published at the end of the wake-up that made it (seen lagging under
    // the emulated host).
    wait_until(
        liveness_bound(Duration::from_secs(1)),
        Duration::from_millis(10),
        || e.stats().hint_merges >= FILE as u64,
    );
    let s = e.stats();
    assert_eq!(
        s.full_scans, 0,
        "a regular pass did it, not the hints: {s:?}"
    );
    // Three calls (b's two adjacent ranges are queued as one).
    assert_eq!(s.hints, 3, "{s:?}");
    assert!(s.hint_merges >= FILE as u64, "{s:?}");
    assert!(
        s.hint_merge_delay_ms < 1000.0,
        "mean hint-to-merge delay {} ms",
        s.hint_merge_delay_ms
    );
    // Contents intact, and a later write still lands privately.
    for i in (0..FILE).step_by(17) {
        assert_eq!(b.read(3000 + i), pattern(77_000 + i as u64));
    }
    b.fill(3000, 5);
    assert_eq!(a.read(1000), pattern(77_000));
    e.check_consistency().unwrap();
    e.shutdown();
}

#[test]
fn hints_outside_regions_or_while_off_are_harmless() {
    let a = Mem::new(64);
    let e = slow_engine();
    a.register(&e, "a", "g");
    // Off: hints queue up but nothing merges; unknown addresses are skipped.
    e.hint(0x1000, PS);
    e.hint(a.addr + 10 * PS, 4 * PS);
    std::thread::sleep(Duration::from_millis(300));
    let s = e.stats();
    assert_eq!((s.merges, s.hint_merges), (0, 0), "{s:?}");
    e.set_mode(Mode::On).unwrap();
    e.hint(usize::MAX - PS, PS);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(e.stats().merges, 0);
    e.shutdown();
}

/// A scanner core (no engine thread: the test drives it) over all 256 pages
/// of `m`, registered as owner "a" in group "g".
fn core_over(m: &Mem) -> pagefold_dedup::testing::Core {
    let mut core = driven_core();
    assert_eq!(m.pages, 256);
    // SAFETY: `m` is a private anonymous mapping that the caller keeps
    // mapped for as long as it uses the returned core (declared before it,
    // so dropped after).
    unsafe { core.register(m.addr, 256 * PS, "a".into(), "g".into()) }.unwrap();
    core
}

/// A hinted page pairs, later in the same pass, with a page *before* it in
/// the region: the regular span plans both, and must not take the hinted
/// page's provisional merge for a copy-on-write break when it reaches it
/// (that dropped its pool reference twice: the soak's mapper-count
/// underflow at VM deletion).
#[test]
fn a_hinted_partner_ahead_in_the_span_keeps_exact_refcounts() {
    use pagefold_dedup::testing::Hint;

    let m = Mem::new(256);
    for i in 0..256 {
        m.fill(i, 5000 + i as u64);
    }
    m.fill(10, 42);
    m.fill(100, 42);
    let mut core = core_over(&m);
    // Pass 1 hashes everything (no page is a candidate yet).
    assert!(core.run_batch(1 << 20, true).pass_completed);
    // A device refills page 100 (same content): hinted first, no partner
    // in this pass's index yet.
    let mut hints = vec![Hint {
        addr: m.addr + 100 * PS,
        len: PS,
        at: Instant::now(),
    }];
    core.run_hints(&mut hints, 1 << 20);
    // Pass 2: page 10 finds page 100 in the index.
    assert!(core.run_batch(1 << 20, true).pass_completed);
    assert!(core.run_batch(1 << 20, true).pass_completed);
    core.check_consistency().unwrap();
    let pm = Pagemap::open().unwrap();
    assert_eq!(m.pfn(&pm, 10), m.pfn(&pm, 100), "the pair never merged");
    // SAFETY: with unmerge the region keeps its content.
    unsafe { core.unregister(core.regions()[0].id, true) }.unwrap();
    core.check_consistency().unwrap();
}

/// Two hinted ranges of one wake-up overlap (a page read twice): the
/// merges a wake-up's hints plan are executed together at its end, so the
/// second visit would meet the first one's merges still planned, and would
/// take them for copy-on-write breaks. The overlap runs what is planned
/// first.
#[test]
fn overlapping_hints_in_one_wake_up_keep_exact_refcounts() {
    use pagefold_dedup::testing::Hint;

    let m = Mem::new(256);
    for i in 0..256 {
        m.fill(i, 9000 + (i as u64 % 128));
    }
    let mut core = core_over(&m);
    // Pass 1 hashes everything.
    assert!(core.run_batch(1 << 20, true).pass_completed);
    let now = Instant::now();
    // The first copy's read, the second copy's, then part of it again.
    let mut hints = vec![
        Hint {
            addr: m.addr,
            len: 64 * PS,
            at: now,
        },
        Hint {
            addr: m.addr + 128 * PS,
            len: 64 * PS,
            at: now,
        },
        Hint {
            addr: m.addr + 150 * PS,
            len: 20 * PS,
            at: now,
        },
    ];
    let rep = core.run_hints(&mut hints, 1 << 20);
    assert!(hints.is_empty());
    assert!(rep.merges >= 64, "{rep:?}");
    core.check_consistency().unwrap();
    let pm = Pagemap::open().unwrap();
    for i in 128..192 {
        assert_eq!(m.pfn(&pm, i), m.pfn(&pm, i - 128), "page {i} not merged");
        assert_eq!(m.read(i), pattern(9000 + (i as u64 % 128)));
    }
    // SAFETY: with unmerge the region keeps its content.
    unsafe { core.unregister(core.regions()[0].id, true) }.unwrap();
    core.check_consistency().unwrap();
}

/// A hinted page pairs with a page an earlier wake-up's hint left in the
/// index, behind it in the region; the same wake-up's next hint covers
/// that partner, whose merge is still planned. The partner lies outside
/// every range this wake-up visited, so only the planned pages tell that
/// the plan must run first: visited with its merge still planned, the
/// partner was taken for a copy-on-write break (its pool reference
/// dropped, then counted again by the merge; under writers, a slot freed
/// while a page mapped it). Found by `torture_io_hints_in_short_parks`.
#[test]
fn a_hint_over_a_partner_planned_by_an_earlier_range_runs_the_plan_first() {
    use pagefold_dedup::testing::Hint;

    let m = Mem::new(256);
    for i in 0..256 {
        m.fill(i, 7000 + i as u64);
    }
    m.fill(10, 42);
    m.fill(100, 42);
    let mut core = core_over(&m);
    assert!(core.run_batch(1 << 20, true).pass_completed);
    let hint = |page: usize| Hint {
        addr: m.addr + page * PS,
        len: PS,
        at: Instant::now(),
    };
    // A device refills page 10: no partner yet, remembered.
    let mut hints = vec![hint(10)];
    core.run_hints(&mut hints, 1 << 20);
    core.check_consistency().unwrap();
    // Then page 100 (pairs with page 10, planning both), then page 10
    // again, in one wake-up.
    let mut hints = vec![hint(100), hint(10)];
    core.run_hints(&mut hints, 1 << 20);
    assert!(hints.is_empty());
    core.check_consistency().unwrap();
    let pm = Pagemap::open().unwrap();
    assert_eq!(m.pfn(&pm, 10), m.pfn(&pm, 100), "the pair never merged");
    assert_eq!(m.read(10), pattern(42));
    // SAFETY: with unmerge the region keeps its content.
    unsafe { core.unregister(core.regions()[0].id, true) }.unwrap();
    core.check_consistency().unwrap();
}

/// A long hinted range whose pages all have partners (a guest reading a
/// file that another guest holds, its requests queued as one range) runs
/// its planned merges a span's worth at a time; past the wake-up's
/// deadline the visit stops after one such step, and the rest of the
/// range waits in the queue for the next wake-up, which merges it. Planned
/// whole, its merges took 10 s of one wake-up on an emulated CPU.
#[test]
fn a_long_hinted_range_runs_in_steps_and_stops_at_the_deadline() {
    use pagefold_dedup::testing::Hint;

    const LONG: usize = 3 * 4096;
    let (a, b) = (Mem::new(LONG), Mem::new(LONG));
    for i in 0..LONG {
        a.fill(i, 300_000 + i as u64);
        b.fill(i, 300_000 + i as u64);
    }
    let mut core = driven_core();
    // SAFETY: `a` and `b` are private anonymous mappings declared before
    // the core, so they stay mapped for as long as it lives.
    unsafe { core.register(a.addr, LONG * PS, "a".into(), "g".into()) }.unwrap();
    // SAFETY: as above.
    unsafe { core.register(b.addr, LONG * PS, "b".into(), "g".into()) }.unwrap();
    let range = |m: &Mem| Hint {
        addr: m.addr,
        len: LONG * PS,
        at: Instant::now(),
    };
    // VM a reads the file: no partner yet, its pages are remembered.
    let mut hints = vec![range(&a)];
    core.run_hints(&mut hints, 1 << 20);
    assert!(hints.is_empty());
    // VM b reads it in a wake-up whose time is up.
    core.set_deadline(Some(Instant::now()));
    let mut hints = vec![range(&b)];
    let rep = core.run_hints(&mut hints, 1 << 20);
    core.check_consistency().unwrap();
    assert!(
        (512..=4096).contains(&rep.merges),
        "one step of at most a span's merges: {rep:?}"
    );
    assert_eq!(hints.len(), 1, "the rest of the range is not queued");
    // At most a span's pages visited (a pair plans an op for each page).
    let visited = (hints[0].addr - b.addr) / PS;
    assert!((1..=4096).contains(&visited), "{visited} pages visited");
    assert_eq!(hints[0].addr + hints[0].len, b.addr + LONG * PS);
    // The next wake-ups (no deadline): the rest of the range, then the
    // second looks at what the step left, merge every page.
    core.set_deadline(None);
    core.run_hints(&mut hints, 1 << 20);
    assert!(hints.is_empty());
    core.run_batch(1 << 20, true);
    core.check_consistency().unwrap();
    let pm = Pagemap::open().unwrap();
    let apart = (0..LONG)
        .filter(|&i| a.pfn(&pm, i) != b.pfn(&pm, i))
        .count();
    assert_eq!(apart, 0, "pages of b not merged with a's");
    for i in (0..LONG).step_by(97) {
        assert_eq!(b.read(i), pattern(300_000 + i as u64));
    }
}
