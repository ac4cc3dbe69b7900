//! The KSM assist on a scattered layout: region B holds region A's distinct
//! pages in a random order, so every engine merge would be its own VMA. The
//! engine hands the group to kernel KSM, and every pair ends up on one frame
//! (checked on PFNs, not on the engine's word), with the VMA count bounded,
//! the contents intact, the figures matching the kernel, and KSM's knobs
//! restored afterwards.

mod common;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::*;
use pagefold_dedup::ksm::{self, KsmSysfs, KSM_SYSFS};
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::testing::{ksm_pace, CONVERGE_BOOST};
use pagefold_dedup::{AssistConfig, AssistMode, DedupBackend, Engine, EngineConfig, Knobs, Mode};

const N: usize = 6000;

fn engine(assist: AssistMode, lock_held: bool) -> Engine {
    engine_at(assist, lock_held, 4096, 5)
}

fn engine_at(assist: AssistMode, lock_held: bool, pages_to_scan: u64, sleep_ms: u64) -> Engine {
    engine_with(assist_cfg(assist, lock_held), pages_to_scan, sleep_ms)
}

/// The assist as these tests want it: a group is judged scattered after
/// 256 new VMAs in a pass, whatever its size, and handed to KSM then (its
/// groups are far smaller than the VMA budget). The scattered test holds
/// the KSM lock (`lock_held`); the other one must find it taken.
fn assist_cfg(mode: AssistMode, lock_held: bool) -> AssistConfig {
    AssistConfig {
        mode,
        flip_vmas: 256,
        flip_group_den: 0,
        flip_pass_vmas: Some(0),
        lock_held,
        ..AssistConfig::default()
    }
}

fn engine_with(assist: AssistConfig, pages_to_scan: u64, sleep_ms: u64) -> Engine {
    Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan,
            sleep_millisecs: sleep_ms,
            max_page_sharing: 256,
        },
        assist,
        ..EngineConfig::default()
    })
    .unwrap()
}

/// How many of the scattered pairs (page i of a, page `perm[i]` of b)
/// share one frame. Reading both touches them: pool-mapped pages are
/// absent until used.
fn pairs_sharing(a: &Mem, b: &Mem, perm: &[usize], pm: &Pagemap) -> usize {
    (0..N)
        .filter(|&i| {
            let (x, y) = (a.pfn(pm, i), b.pfn(pm, perm[i]));
            x != 0 && x == y
        })
        .count()
}

#[test]
fn scattered_pairs_all_share_a_frame_through_ksm() {
    let _ksm = ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(KSM_SYSFS);
    let before = ksm::snapshot_tunables(root);
    let (a, b, perm) = scattered_pair(N);
    let e = engine(AssistMode::Auto, true);
    let ra = a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    let q = std::sync::Arc::new(CountingQuiescer::default());
    e.set_quiesce(ra, Some(q.clone()));
    let vmas0 = pagefold_dedup::mm::vma_count().unwrap();
    e.set_mode(Mode::On).unwrap();

    let pm = Pagemap::open().unwrap();
    let shared = || pairs_sharing(&a, &b, &perm, &pm);
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(90) {
        n = shared();
        if n == N {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = e.stats();
    assert_eq!(
        n,
        N,
        "only {n} of {N} pairs share a frame after {:?}: {s:?}",
        t.elapsed()
    );
    assert!(s.ksm_assist.starts_with("engaged: group g"), "{s:?}");
    // The engine made at most ~flip_vmas single-page VMAs before handing
    // over; KSM made none.
    let vmas = pagefold_dedup::mm::vma_count().unwrap();
    assert!(vmas < vmas0 + 600, "VMAs {vmas0} -> {vmas}");
    // Figures: every pair saves one page (engine pool pages + KSM frames),
    // once the next census (at most every few seconds) has counted them.
    let counted = wait_sharing(&e, N as u64, Duration::from_secs(30));
    let s = e.stats();
    assert!(counted.is_some(), "{s:?}");
    assert_eq!(s.pages_sharing, N as u64, "{s:?}");
    assert!(
        s.ksm_pages_sharing > 0 && s.ksm_pages_sharing < N as u64,
        "{s:?}"
    );
    assert!(s.ksm_cpu_seconds > 0.0, "ksmd's CPU not counted: {s:?}");
    assert_eq!(s.per_owner["a"].pages_merged, N as u64, "{s:?}");
    assert_eq!(s.per_owner["b"].pages_merged, N as u64, "{s:?}");
    for i in (0..N).step_by(97) {
        assert_eq!(a.read(i), pattern(i as u64 + 1));
        assert_eq!(b.read(perm[i]), pattern(i as u64 + 1));
    }
    // A guest write to a KSM-merged page lands and leaves the partner alone.
    let k = (0..N).find(|&i| !a.entry(&pm, i).file()).unwrap();
    a.fill(k, 999_999);
    assert_eq!(a.read(k), pattern(999_999));
    assert_eq!(b.read(perm[k]), pattern(k as u64 + 1));

    // Giving back a range of the assisted region (a balloon's pages) drops
    // its mappings of KSM's and the pool's pages without a copy: the range
    // is absent, the partners keep their content, and the engine's pool
    // VMAs there become the region's anonymous memory again.
    let (d0, dn) = (N / 2, 512);
    // SAFETY: nothing reads a's pages d0..d0 + dn as data again below; they
    // are expected to read zeros.
    let given = unsafe { e.discard(a.addr + d0 * PS, dn * PS) }.unwrap();
    assert_eq!(given, dn as u64);
    assert!((d0..d0 + dn).all(|i| !a.entry(&pm, i).present()));
    assert_eq!(ksm::count_ksm_pages(a.addr + d0 * PS, dn * PS).unwrap(), 0);
    assert!(mappings_in(a.addr + d0 * PS, dn * PS)
        .iter()
        .all(|(_, _, line)| !line.contains("memfd")));
    for i in (d0..d0 + dn).step_by(7) {
        assert_eq!(a.read(i), pattern(0));
        assert_eq!(b.read(perm[i]), pattern(i as u64 + 1));
    }
    assert_eq!(e.stats().per_owner["a"].pages_reported, dn as u64);
    e.check_consistency().unwrap();

    // Unmerge takes the group back from KSM first: nothing shared after.
    // The guests are parked for each 16 MiB given back (a copy-on-write
    // fault and TLB flush per KSM page): two steps per region here.
    let parks = || q.requests.load(std::sync::atomic::Ordering::SeqCst);
    let parks0 = parks();
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(60)));
    let steps = 2 * (N * PS).div_ceil(16 << 20);
    assert!(
        parks() - parks0 >= steps,
        "{} parks for {steps} take-back steps",
        parks() - parks0
    );
    assert_eq!(ksm::count_ksm_pages(a.addr, N * PS).unwrap(), 0);
    assert_eq!(ksm::count_ksm_pages(b.addr, N * PS).unwrap(), 0);
    assert_eq!(shared(), 0);
    for i in (1..N).step_by(89) {
        assert_eq!(b.read(perm[i]), pattern(i as u64 + 1));
    }
    assert_eq!(
        ksm::snapshot_tunables(root),
        before,
        "KSM knobs not restored"
    );
    e.shutdown();
}

/// A scattered group whose merges all fit the VMA budget stays the
/// engine's. Judged scattered (256 new runs in a pass, one page each), a
/// sample of the pages ahead projects about 2 x 6,000 VMAs for the pass,
/// well within what the budget has left (half of
/// `vm.max_map_count`): merged, the pairs cost nothing more, whereas KSM
/// would scan all of the group's pages for as long as it had them.
#[test]
fn a_scattered_group_that_fits_the_vma_budget_stays_the_engines() {
    let _ksm = ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(KSM_SYSFS);
    let before = ksm::snapshot_tunables(root);
    let (a, b, perm) = scattered_pair(N);
    // The lock held: the assist could engage if the rule said so. The
    // allowance is the default one: what the VMA budget has left.
    let assist = AssistConfig {
        flip_pass_vmas: None,
        ..assist_cfg(AssistMode::Auto, true)
    };
    let e = engine_with(assist, 4096, 5);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    let vmas0 = pagefold_dedup::mm::vma_count().unwrap();
    e.set_mode(Mode::On).unwrap();
    let pm = Pagemap::open().unwrap();
    let shared = || pairs_sharing(&a, &b, &perm, &pm);
    let done = wait_until(
        liveness_bound(Duration::from_secs(90)),
        Duration::from_millis(200),
        || shared() == N,
    );
    assert!(
        done.is_some(),
        "only {} of {N} pairs share a frame: {:?}",
        shared(),
        e.stats()
    );
    // The pagemap shows a merge at once, the stats at the end of the
    // wake-up that made it.
    let counted = wait_sharing(&e, N as u64, liveness_bound(Duration::from_secs(10)));
    let s = e.stats();
    assert!(counted.is_some(), "{s:?}");
    assert!(!s.ksm_assist.starts_with("engaged"), "{s:?}");
    assert_eq!(s.ksm_pages_sharing, 0, "{s:?}");
    assert_eq!(ksm::count_ksm_pages(a.addr, N * PS).unwrap(), 0);
    assert_eq!(ksm::count_ksm_pages(b.addr, N * PS).unwrap(), 0);
    // The engine's own merges (KSM's add no VMA): a's halves of the pairs
    // are at random places, a VMA each or two where the kernel splits
    // around them, one for two where neighbours landed on consecutive
    // slots (6.1: 54 -> 6,053 for 6,000 pairs).
    let vmas = pagefold_dedup::mm::vma_count().unwrap();
    assert!(vmas >= vmas0 + N as u64 * 9 / 10, "VMAs {vmas0} -> {vmas}");
    for i in (0..N).step_by(97) {
        assert_eq!(a.read(i), pattern(i as u64 + 1));
        assert_eq!(b.read(perm[i]), pattern(i as u64 + 1));
    }
    e.check_consistency().unwrap();
    e.shutdown();
    assert_eq!(
        ksm::snapshot_tunables(root),
        before,
        "KSM knobs not restored"
    );
}

/// Waits until the engine reports `want` pages sharing; returns how long
/// that took, or None after `limit`.
fn wait_sharing(e: &Engine, want: u64, limit: Duration) -> Option<Duration> {
    wait_until(limit, Duration::from_millis(50), || {
        e.stats().pages_sharing == want
    })
}

#[test]
fn the_census_keeps_up_with_ksm_while_the_engine_idles() {
    // A slow engine (64 pages a wake-up) that has backed off to 1 s
    // wake-ups: the census of KSM's 12,000 pages must still come within
    // seconds of a change. Paced like a scan (256 pagemap visits a
    // wake-up) it took ~47 wake-ups, i.e. most of a minute, and every
    // figure KSM reached in between went unreported.
    let _ksm = ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(KSM_SYSFS);
    let before = ksm::snapshot_tunables(root);
    let (a, b, perm) = scattered_pair(N);
    let e = engine_at(AssistMode::Auto, true, 64, 20);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.set_mode(Mode::On).unwrap();
    let first = wait_sharing(&e, N as u64, Duration::from_secs(90));
    let s = e.stats();
    assert!(first.is_some(), "not converged: {s:?}");
    assert!(s.ksm_assist.starts_with("engaged: group g"), "{s:?}");
    // Let KSM find nothing more for a while and the engine back off.
    std::thread::sleep(Duration::from_secs(6));
    // A guest write to a KSM-merged page of A: the pair no longer shares.
    let pm = Pagemap::open().unwrap();
    let k = (0..N)
        .find(|&i| !a.entry(&pm, i).file() && a.pfn(&pm, i) == b.pfn(&pm, perm[i]))
        .expect("a pair KSM merged");
    a.fill(k, 777_777);
    let lag = wait_sharing(&e, N as u64 - 1, Duration::from_secs(60));
    let s = e.stats();
    assert!(
        lag.is_some_and(|d| d < Duration::from_secs(8)),
        "a KSM copy-on-write break took {lag:?} to show: {s:?}"
    );
    assert_eq!(b.read(perm[k]), pattern(k as u64 + 1));
    e.shutdown();
    assert_eq!(
        ksm::snapshot_tunables(root),
        before,
        "KSM knobs not restored"
    );
}

#[test]
fn assist_stays_off_while_another_process_drives_ksm() {
    // Take the lock file as another process would (another open file
    // description, not this process's `KsmExclusive`).
    let _order = ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(KSM_SYSFS);
    let before = ksm::snapshot_tunables(root);
    drop(_order);
    let other = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(ksm::KSM_LOCK_PATH)
        .unwrap();
    // SAFETY: flock on our own descriptor.
    assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX) }, 0);
    let (a, b, _) = scattered_pair(N);
    let e = engine(AssistMode::Auto, false);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    // Smart scan meets every pair within 8 passes.
    e.scan_now(10);
    let s = e.stats();
    assert!(
        s.ksm_assist
            .starts_with("unavailable: another process drives KSM"),
        "{s:?}"
    );
    assert_eq!(ksm::snapshot_tunables(root), before, "KSM touched anyway");
    // Without KSM the engine merges every pair itself (one VMA each: the
    // VMA budget allows 2 x 6000 here).
    assert_eq!(s.pages_sharing, N as u64, "{s:?}");
    assert_eq!(s.ksm_pages_sharing, 0, "{s:?}");
    e.shutdown();
    drop(other);
}

/// Waits until KSM has finished `n` more full scans; false after `limit`.
fn wait_full_scans(sysfs: &KsmSysfs, n: u64, limit: Duration) -> bool {
    let scans = || sysfs.read_u64("full_scans").unwrap();
    let start = scans();
    wait_until(limit, Duration::from_millis(20), || scans() >= start + n).is_some()
}

#[test]
fn a_region_mapped_where_an_assisted_one_was_merges_as_soon_as_a_fresh_one() {
    // The sequence of a VM deleted and another created: region C, assisted
    // long enough for KSM's smart scan to age its unique pages, is
    // unregistered and unmapped; new memory at the same address (where the
    // kernel puts the next VM's RAM) holds pairs of identical pages. KSM
    // keeps the process's rmap items, ages included, after the unmap until
    // ksmd rescans the process, and the new memory inherits them: with smart
    // scan on, none of its pairs merged in eight full scans
    // (scripts/probes/ksm_stale_rmap.c). Fresh memory merges in KSM's second
    // full scan; the new region must too, give or take a scan in flight.
    let _ksm = ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(KSM_SYSFS);
    let before = ksm::snapshot_tunables(root);
    // Reads only: the engine's assist is what writes KSM's knobs here.
    let sysfs = KsmSysfs::open().unwrap();
    let (a, b, _) = scattered_pair(N);
    let c = Mem::new(N);
    c.fill_from(10_000_000);
    // One KSM full scan of the group per engine wake-up once KSM idles.
    let e = engine_at(AssistMode::Auto, true, 3 * N as u64, 5);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    let cid = c.register(&e, "c", "g");
    e.set_mode(Mode::On).unwrap();
    let s = wait_sharing(&e, N as u64, Duration::from_secs(90));
    assert!(s.is_some(), "A and B not merged: {:?}", e.stats());
    // C's pages are unique: every scan that visits one ages it.
    assert!(
        wait_full_scans(&sysfs, 6, Duration::from_secs(120)),
        "KSM stalled: {:?}",
        e.stats()
    );
    // SAFETY: C stays mapped until the engine has let go of it.
    unsafe { e.unregister_unmapping(cid).unwrap() };
    let addr = c.addr;
    drop(c);
    let d = Mem::new_at(addr, N);
    let half = N / 2;
    let perm2 = permutation(half, 0xD1B5_4A32_D192_ED03);
    for (i, &j) in perm2.iter().enumerate() {
        d.fill(i, 20_000_000 + i as u64);
        d.fill(half + j, 20_000_000 + i as u64);
    }
    // KSM found nothing more for a while: it has backed off. New memory in
    // the group brings it back to its converging pace (CONVERGE_BOOST times
    // the engine's pages every 5 ms, in batches of at most KSM_BATCH_MAX)
    // at the engine's next wake-up, before it has merged any of it (it used
    // to speed up only once its slow scans had merged some).
    let (fast_pages, fast_sleep) = ksm_pace(3 * N as u64 * CONVERGE_BOOST, 5);
    let sleep_ms = || sysfs.read_u64("sleep_millisecs").unwrap();
    let pages_to_scan = || sysfs.read_u64("pages_to_scan").unwrap();
    let merging = || {
        ksm::self_ksm_stat()
            .and_then(|s| s.merging_pages)
            .unwrap_or(0)
    };
    let idle = sleep_ms();
    // Well above the engine's 5 ms (the converging pace's sleep is less).
    assert!(idle > 5, "KSM did not back off: sleep {idle} ms");
    let m0 = merging();
    d.register(&e, "d", "g");
    wait_until(Duration::from_secs(10), Duration::from_millis(1), || {
        (pages_to_scan(), sleep_ms()) == (fast_pages, fast_sleep)
    });
    let m1 = merging();
    assert_eq!(
        (pages_to_scan(), sleep_ms()),
        (fast_pages, fast_sleep),
        "KSM still at its idle pace (sleep {idle} ms)"
    );
    assert_eq!(
        m1,
        m0,
        "KSM merged {} pages of the new region at its idle pace ({idle} ms) before speeding up",
        m1 - m0
    );
    assert!(
        wait_full_scans(&sysfs, 4, Duration::from_secs(60)),
        "KSM stalled: {:?}",
        e.stats()
    );
    let pm = Pagemap::open().unwrap();
    let merged = (0..half)
        .filter(|&i| {
            let x = d.pfn(&pm, i);
            x != 0 && x == d.pfn(&pm, half + perm2[i])
        })
        .count();
    assert_eq!(
        merged,
        half,
        "only {merged} of {half} pairs in the new region merged in four KSM full scans; \
         KSM skipped {} pages in all: {:?}",
        sysfs.read_u64("pages_skipped").unwrap_or(0),
        e.stats()
    );
    e.shutdown();
    assert_eq!(
        ksm::snapshot_tunables(root),
        before,
        "KSM knobs not restored"
    );
}

/// The knobs an ended engagement set stay until its holder restores them:
/// the engine does so after releasing its core, since writing `run` waits
/// for ksmd's batch. An engagement that starts before the restore puts the
/// old knobs back first, so it never takes them for KSM's originals.
#[test]
fn an_ended_engagement_restores_its_knobs_when_told_or_before_the_next_one() {
    use pagefold_dedup::testing::KsmAssist;
    let _ksm = ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(KSM_SYSFS);
    let before = ksm::snapshot_tunables(root);
    let pace = |m: &std::collections::BTreeMap<String, String>| {
        ["run", "pages_to_scan", "sleep_millisecs"].map(|k| m[k].clone())
    };
    let mut a = KsmAssist::new(AssistConfig {
        mode: AssistMode::Auto,
        lock_held: true,
        ..AssistConfig::default()
    });
    a.engage(1).unwrap();
    a.drive(true, 3000, 7, Duration::ZERO, 0);
    let ours = ksm::snapshot_tunables(root);
    assert_ne!(pace(&ours), pace(&before), "the drive wrote nothing");
    a.disengage();
    assert_eq!(ksm::snapshot_tunables(root), ours, "restored at the end");
    a.take_retired().expect("the ended engagement").restore();
    assert_eq!(ksm::snapshot_tunables(root), before, "not restored");

    a.engage(2).unwrap();
    a.drive(true, 3000, 7, Duration::ZERO, 0);
    a.disengage();
    a.engage(3).unwrap();
    assert_eq!(
        pace(&ksm::snapshot_tunables(root)),
        pace(&before),
        "engaged over the last engagement's knobs"
    );
    a.drive(true, 3000, 7, Duration::ZERO, 0);
    drop(a);
    assert_eq!(
        ksm::snapshot_tunables(root),
        before,
        "KSM knobs not restored"
    );
}
