//! Integration tests on host memory (root: userfaultfd and pagemap PFNs).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::{DedupBackend, DedupSettings, Engine, EngineConfig, Knobs, Mode};

#[test]
fn two_regions_same_group_reach_exact_sharing() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(64), Mem::new(64));
    a.fill_from(1000);
    b.fill_from(1000);
    let _ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    e.scan_now(2);
    let s = e.stats();
    assert_eq!(s.pages_sharing, 64, "{s:?}");
    assert_eq!(s.pages_shared, 64);
    assert_eq!(s.pool_pages, 64);
    assert_eq!(s.per_owner["vm-a"].pages_merged, 64);
    for i in 0..64 {
        assert_eq!(a.read(i), pattern(1000 + i as u64));
        assert_eq!(b.read(i), pattern(1000 + i as u64));
        let (pa, pb) = (a.pfn(&pm, i), b.pfn(&pm, i));
        assert!(pa != 0 && pa == pb, "page {i}: {pa:#x} vs {pb:#x}");
        assert!(a.entry(&pm, i).file());
    }
    e.check_consistency().unwrap();
    // Consecutive pool slots: each region is one VMA for the merged run.
    assert!(
        s.vmas_created <= 2 || e.stats().vmas_created <= 2,
        "{}",
        e.stats().vmas_created
    );
    // Stats vs kernel (docs/merge-races.md §21): distinct PFNs =
    // pages_shared.
    let mut pfns: HashMap<u64, u32> = HashMap::new();
    for i in 0..64 {
        *pfns.entry(a.pfn(&pm, i)).or_default() += 1;
        *pfns.entry(b.pfn(&pm, i)).or_default() += 1;
    }
    let sharing: u64 = pfns.values().map(|&n| n as u64 - 1).sum();
    assert_eq!(sharing, s.pages_sharing);
    e.shutdown();
}

#[test]
fn two_groups_share_nothing() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(32), Mem::new(32));
    for i in 0..32 {
        a.fill(i, 7 + (i as u64 % 4));
        b.fill(i, 7 + (i as u64 % 4));
    }
    a.register(&e, "a", "g1");
    b.register(&e, "b", "g2");
    e.scan_now(3);
    let pa: Vec<u64> = (0..32).map(|i| a.pfn(&pm, i)).collect();
    for i in 0..32 {
        let pb = b.pfn(&pm, i);
        assert!(!pa.contains(&pb), "b page {i} shares a frame with group g1");
        assert_eq!(b.read(i), pattern(7 + (i as u64 % 4)));
    }
    // Within each group the 4 contents do merge.
    assert!(e.stats().pages_sharing >= 2 * (32 - 4 * 32 / 32) as u64 / 2);
    e.check_consistency().unwrap();
}

#[test]
fn unmerge_returns_private_pages_with_contents_intact() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(200);
    for i in 0..200 {
        a.fill(i, 1 + (i as u64 % 5));
    }
    a.register(&e, "a", "g");
    e.scan_now(2);
    assert!(e.stats().pages_sharing > 150, "{:?}", e.stats());
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(20)));
    let s = e.stats();
    assert_eq!(
        (s.pages_sharing, s.pages_shared, s.pool_pages),
        (0, 0, 0),
        "{s:?}"
    );
    // The owner's figures too, with no pass after the unmerge.
    let o = &s.per_owner["a"];
    assert_eq!((o.pages_merged, o.bytes_saved), (0, 0), "{s:?}");
    for i in 0..200 {
        assert_eq!(a.read(i), pattern(1 + (i as u64 % 5)));
        let en = a.entry(&pm, i);
        assert!(en.present() && !en.file(), "page {i} not private: {en:?}");
    }
    // Writes after unmerge land as usual.
    a.fill(3, 99);
    assert_eq!(a.read(3), pattern(99));
    e.check_consistency().unwrap();
}

#[test]
fn unmerge_copies_each_page_from_where_its_content_is() {
    // Merged pages in three states when the unmerge comes, with no scan in
    // between to notice: never touched since the merge (not mapped in: read
    // from the pool slot), read since (the pool page mapped in), and
    // written since (a private copy-on-write page the engine still thinks
    // merged: its own content, not the slot's, must survive).
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, _) = merged_three_patterns(&e);
    let mut want: Vec<Vec<u8>> = (0..THREE_PATTERN_PAGES)
        .map(|i| pattern(three_pattern(i)))
        .collect();
    let (mut untouched, mut read, mut written) = (0, 0, 0);
    for (i, w) in want.iter_mut().enumerate() {
        let en = a.entry(&pm, i);
        if en.present() && !en.file() {
            continue; // a page kept private (a stripe's own)
        }
        match i % 3 {
            0 => untouched += 1,
            1 => {
                let _ = a.read(i);
                read += 1;
            }
            _ => {
                a.fill(i, 500 + i as u64);
                *w = pattern(500 + i as u64);
                written += 1;
            }
        }
    }
    assert!(
        untouched > 30 && read > 30 && written > 30,
        "{untouched} {read} {written}"
    );
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(20)));
    assert_eq!(e.stats().pool_pages, 0);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&a.read(i), w, "page {i}");
        let en = a.entry(&pm, i);
        assert!(en.present() && !en.file(), "page {i} not private: {en:?}");
    }
    e.check_consistency().unwrap();
}

/// Whether the host has swap space (`/proc/swaps` lists a device or file).
/// CI adds a swap file (.ci/run); elsewhere the test that needs it says
/// that it did not run.
fn swap_active() -> bool {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let active = swaps.lines().count() > 1;
    if !active && std::env::var_os("CI").is_some() {
        panic!(
            "CI runs this test with swap space (.ci/run adds a swap file); /proc/swaps lists none"
        );
    }
    active
}

#[test]
fn unmerge_keeps_a_written_page_that_went_to_swap() {
    // A merged page the guest wrote is a private copy-on-write page inside
    // the pool VMA. If reclaim swaps that copy out before a scan notices
    // the write, its PTE is a swap entry, not present: the unmerge must
    // read the page back from swap, not take its old content from the pool
    // slot (docs/merge-races.md §14).
    if !swap_active() {
        eprintln!("SKIPPED: no swap space on this host (swapon a file to run it)");
        return;
    }
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, _) = merged_three_patterns(&e);
    let mut want: Vec<Vec<u8>> = (0..THREE_PATTERN_PAGES)
        .map(|i| pattern(three_pattern(i)))
        .collect();
    let mut written = Vec::new();
    for (i, w) in want.iter_mut().enumerate() {
        let en = a.entry(&pm, i);
        if en.present() && !en.file() {
            continue; // a page kept private (a stripe's own)
        }
        if i % 2 == 0 {
            a.fill(i, 700 + i as u64);
            *w = pattern(700 + i as u64);
            written.push(i);
        }
    }
    assert!(written.len() > 50, "{} pages written", written.len());
    // SAFETY: the range is our own mapping; MADV_PAGEOUT only reclaims
    // pages (contents are kept, in swap or in the file).
    let rc = unsafe {
        libc::madvise(
            a.addr as *mut libc::c_void,
            a.pages * PS,
            libc::MADV_PAGEOUT,
        )
    };
    assert_eq!(rc, 0, "MADV_PAGEOUT: {}", std::io::Error::last_os_error());
    let swapped = written
        .iter()
        .filter(|&&i| {
            let en = a.entry(&pm, i);
            !en.present() && en.swap()
        })
        .count();
    assert!(
        swapped > written.len() / 2,
        "only {swapped} of {} written pages went to swap",
        written.len()
    );
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(20)));
    for (i, w) in want.iter().enumerate() {
        assert_eq!(
            &a.read(i),
            w,
            "page {i} ({swapped} written pages were in swap)"
        );
    }
    e.check_consistency().unwrap();
}

#[test]
fn max_page_sharing_is_respected() {
    let e = engine(10);
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(600);
    a.fill_all(42);
    a.register(&e, "a", "g");
    e.scan_now(3);
    let s = e.stats();
    let mut per: HashMap<u64, u64> = HashMap::new();
    for i in 0..600 {
        assert_eq!(a.read(i), pattern(42));
        *per.entry(a.pfn(&pm, i)).or_default() += 1;
    }
    assert!(
        per.values().all(|&n| n <= 10),
        "a pool page mapped > 10 times"
    );
    assert!(s.pages_sharing >= 500, "{s:?}");
    assert_eq!(s.pages_sharing + s.pool_pages, 600);
    e.check_consistency().unwrap();
    // Raising the knob lets later merges share more.
    let k = e
        .apply(
            &DedupSettings {
                max_page_sharing: Some(1000),
                ..Default::default()
            }
            .validate()
            .unwrap(),
        )
        .unwrap();
    assert_eq!(k.max_page_sharing, 1000);
    assert_eq!(e.knobs().max_page_sharing, 1000);
    // Below the range, the settings never reach the engine.
    assert!(DedupSettings {
        max_page_sharing: Some(1),
        ..Default::default()
    }
    .validate()
    .is_err());
}

#[test]
fn zero_pages_are_dropped_and_counted_apart() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(50);
    for i in 0..50 {
        a.fill(i, if i < 30 { 0 } else { 5 });
        // SAFETY: make the zero pages present (written).
        unsafe { std::ptr::write_volatile(a.page_ptr(i), 0) };
    }
    a.fill(40, 6);
    a.register(&e, "a", "g");
    e.scan_now(2);
    let s = e.stats();
    assert_eq!(s.zero_pages, 30, "{s:?}");
    // 19 pages of one content: all merged, onto a short stripe (sqrt rule).
    assert_eq!(s.pages_sharing + s.pool_pages, 19, "{s:?}");
    assert!(s.pages_sharing >= 14, "{s:?}");
    assert_eq!(s.bytes_saved, (30 + s.pages_sharing) * 4096);
    for i in 0..30 {
        assert!(!a.entry(&pm, i).present());
        assert_eq!(a.read(i), pattern(0));
    }
    a.fill(3, 77);
    e.scan_now(1);
    assert_eq!(e.stats().zero_pages, 29);
    assert_eq!(a.read(3), pattern(77));
    // Unmerge leaves dropped pages dropped (docs/engine.md, "Zero
    // pages"): nothing is shared, the owner's figures say so at once.
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(20)));
    let s = e.stats();
    assert_eq!((s.zero_pages, s.pages_sharing), (29, 0), "{s:?}");
    let o = &s.per_owner["a"];
    assert_eq!(
        (o.pages_merged, o.zero_pages, o.bytes_saved),
        (0, 29, 29 * 4096),
        "{s:?}"
    );
    e.check_consistency().unwrap();
}

/// `/proc/kpageflags` bits of a page frame (root only).
fn kpageflags(pfn: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/kpageflags").expect("open /proc/kpageflags (root)");
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, pfn * 8).expect("read kpageflags");
    u64::from_ne_bytes(b)
}

/// `KPF_THP`: the frame is part of a transparent huge page.
const KPF_THP: u64 = 1 << 22;

#[test]
fn pages_merged_out_of_a_huge_page_are_freed_at_once() {
    // Guest RAM backed by transparent huge pages, as on hosts whose THP
    // setting is `always` (Debian 12). A merge or zero drop unmaps 4 KiB of
    // a huge page; unless the huge page is split first, the kernel frees
    // that 4 KiB only at its deferred split, under memory pressure, and the
    // saving the engine counts is not made.
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new_thp(1024), Mem::new_thp(1024));
    // Even pages: the same in both regions (merged); pages 4k+1: zero
    // (dropped); pages 4k+3: each region's own.
    for (m, own) in [(&a, 5000u64), (&b, 9000)] {
        for i in 0..1024 {
            let v = match i % 4 {
                0 | 2 => 1000 + i as u64,
                1 => 0,
                _ => own + i as u64,
            };
            // Written, zero pages too: present, in the huge pages.
            m.fill(i, v);
        }
    }
    assert!(
        a.huge_bytes() > 0 && b.huge_bytes() > 0,
        "no transparent huge page backs the regions (THP off on this host?): \
         this test would test nothing"
    );
    let old: Vec<u64> = (0..1024).map(|i| a.pfn(&pm, i)).collect();
    assert!(old.iter().all(|&f| f != 0), "PFNs hidden: run as root");
    assert!(old.iter().all(|&f| kpageflags(f) & KPF_THP != 0));
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.scan_now(3);
    let s = e.stats();
    assert!(s.pages_sharing >= 500 && s.zero_pages >= 500, "{s:?}");
    assert!(s.huge_pages_split > 0, "{s:?}");
    // The frames the merged and dropped pages of `a` had are no longer part
    // of a huge page: split, and so freed (or in use again, as small pages).
    let replaced: Vec<u64> = (0..1024).filter(|i| i % 4 != 3).map(|i| old[i]).collect();
    let still_huge = replaced
        .iter()
        .filter(|&&f| kpageflags(f) & KPF_THP != 0)
        .count();
    assert!(
        still_huge * 20 < replaced.len(),
        "{still_huge} of the {} replaced frames still belong to a huge page",
        replaced.len()
    );
    for i in 0..1024 {
        let v = match i % 4 {
            0 | 2 => 1000 + i as u64,
            1 => 0,
            _ => 5000 + i as u64,
        };
        assert_eq!(a.read(i), pattern(v), "page {i}");
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// Copy-on-write breaks count against the owner whose page broke, pool
/// and zero-page merges alike.
#[test]
fn cow_breaks_count_per_owner() {
    let e = engine(256);
    let (a, b) = (Mem::new(16), Mem::new(16));
    a.fill_all(3);
    b.fill_all(3);
    for i in 8..12 {
        a.fill(i, 0);
    }
    let _ra = a.register(&e, "a", "g");
    let _rb = b.register(&e, "b", "g");
    e.scan_now(2);
    let before = e.stats();
    assert_eq!(before.per_owner["a"].cow_breaks, Some(0), "{before:?}");
    assert!(before.zero_pages >= 4, "{before:?}");
    // Two pool pages and two zero pages of a.
    for i in [0, 1, 8, 9] {
        a.fill(i, 100 + i as u64);
    }
    e.scan_now(1);
    let s = e.stats();
    assert_eq!(s.per_owner["a"].cow_breaks, Some(4), "{s:?}");
    assert_eq!(s.per_owner["b"].cow_breaks, Some(0), "{s:?}");
    assert_eq!(s.cow_breaks, 4, "{s:?}");
    // By origin: the breaks add up, two of them refills of zero pages.
    let o = s.origins;
    assert_eq!(o.cow_breaks.total(), 4, "{o:?}");
    assert_eq!(o.zero_refills, 2, "{o:?}");
    assert_eq!(o.merges.total(), s.merges, "{o:?}");
    assert_eq!(o.zero_merges, before.zero_pages, "{o:?}");
    e.shutdown();
}

#[test]
fn cow_break_is_noticed_and_counts_stay_exact() {
    let e = engine(256);
    let a = Mem::new(16);
    a.fill_all(3);
    a.register(&e, "a", "g");
    e.scan_now(2);
    let before = e.stats();
    assert_eq!(before.pages_sharing + before.pool_pages, 16);
    for i in 0..4 {
        a.fill(i, 100 + i as u64);
    }
    e.scan_now(1);
    let s = e.stats();
    assert_eq!(s.cow_breaks, 4);
    assert_eq!(s.pages_sharing + s.pool_pages, 12, "{s:?}");
    for i in 0..16 {
        assert_eq!(a.read(i), pattern(if i < 4 { 100 + i as u64 } else { 3 }));
    }
    e.check_consistency().unwrap();
}

#[test]
fn weak_hash_collisions_never_merge_different_pages() {
    // Every page hashes the same: only full compares tell them apart.
    let e = Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 1 << 16,
            sleep_millisecs: 0,
            max_page_sharing: 256,
        },
        hash_override: Some(|_p: &[u8]| 42),
        ..EngineConfig::default()
    })
    .unwrap();
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(96);
    for i in 0..96 {
        a.fill(i, 1 + (i as u64 % 3));
    }
    a.register(&e, "a", "g");
    e.scan_now(4);
    let mut by_pfn: HashMap<u64, u64> = HashMap::new();
    for i in 0..96 {
        let v = 1 + (i as u64 % 3);
        assert_eq!(a.read(i), pattern(v), "page {i} corrupted");
        let p = a.pfn(&pm, i);
        if let Some(&w) = by_pfn.get(&p) {
            assert_eq!(w, v, "pages of different content share frame {p:#x}");
        }
        by_pfn.insert(p, v);
    }
    assert!(
        e.stats().pages_sharing > 0,
        "collisions must not prevent merging"
    );
    e.check_consistency().unwrap();
}

#[test]
fn unregister_while_merging_leaves_memory_usable() {
    let e = engine(256);
    e.set_mode(Mode::On).unwrap();
    for round in 0..5 {
        let a = Mem::new(512);
        for i in 0..512 {
            a.fill(i, 1 + (i as u64 % 7));
        }
        let id = a.register(&e, "a", "g");
        std::thread::sleep(Duration::from_millis(5 + round * 7));
        e.unregister(id).unwrap();
        for i in 0..512 {
            assert_eq!(a.read(i), pattern(1 + (i as u64 % 7)));
        }
        // The memory is ours again: writes land, nothing is protected.
        a.fill(1, 1234);
        assert_eq!(a.read(1), pattern(1234));
        drop(a);
    }
    let s = e.stats();
    assert_eq!((s.pool_pages, s.pages_sharing), (0, 0), "{s:?}");
    e.shutdown();
}

/// Two VMs filling concurrently have their pages merged as both sides
/// appear, in no address order. Each merged page must still map the pool
/// offset next to its neighbours', or a linear layout costs a VMA per
/// merge: the same 8,252 merges of two workload VMs made 14 to 3,384 VMAs
/// when a new content's slot was the next free one.
#[test]
fn pages_merged_out_of_address_order_still_map_one_vma_per_region() {
    const N: usize = 4096;
    let e = engine(256);
    let a = Mem::new(N);
    let b = Mem::new(N);
    a.fill_from(1000);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.scan_now(1);
    // B gets A's content in eight rounds of random pages, each merged
    // before the next round is written.
    let order = permutation(N, 0x5eed_f01d);
    for (round, chunk) in order.chunks(N / 8).enumerate() {
        for &i in chunk {
            b.fill(i, 1000 + i as u64);
        }
        let want = (round + 1) * N / 8;
        let mut scans = 0;
        while (e.stats().pages_sharing as usize) < want && scans < 64 {
            e.scan_now(1);
            scans += 1;
        }
        assert_eq!(e.stats().pages_sharing as usize, want, "round {round}");
    }
    e.check_consistency().unwrap();
    for i in (0..N).step_by(97) {
        assert_eq!(b.read(i), pattern(1000 + i as u64));
    }
    let (va, vb) = (vmas_in(a.addr, N * PS), vmas_in(b.addr, N * PS));
    assert!(
        va <= 2 && vb <= 2,
        "{va} VMAs over A and {vb} over B for {N} merged pages each"
    );
}

#[test]
fn teardown_unregister_drops_pool_pages() {
    let e = engine(256);
    let a = Mem::new(64);
    let b = Mem::new(64);
    a.fill_all(9);
    b.fill_all(9);
    let ra = a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.scan_now(2);
    // SAFETY: `a` is unmapped right after (drop) and not used again.
    unsafe { e.unregister_unmapping(ra).unwrap() };
    drop(a);
    for i in 0..64 {
        assert_eq!(b.read(i), pattern(9));
    }
    e.check_consistency().unwrap();
    let s = e.stats();
    assert_eq!(s.per_owner.len(), 1);
    assert_eq!(s.pages_sharing + s.pool_pages, 64);
}

/// A region withdrawn for teardown leaves one anonymous mapping behind, not
/// a VMA per scattered merge still mapping the pool: the engine drops them
/// all in one unmap, so neither the uffd unregistration nor the hole
/// punches of its freed slots walk (and flush) each one. The partner keeps
/// its content, and the last teardown frees every pool page.
#[test]
fn teardown_unregister_of_a_scattered_region_drops_its_vmas_in_one_mapping() {
    const N: usize = 2048;
    let e = engine(256);
    let (a, b, _) = scattered_pair(N);
    let ra = a.register(&e, "a", "g");
    let rb = b.register(&e, "b", "g");
    let mut scans = 0;
    while (e.stats().pages_sharing as usize) < N && scans < 16 {
        e.scan_now(1);
        scans += 1;
    }
    assert_eq!(e.stats().pages_sharing as usize, N, "{:?}", e.stats());
    let (va, vb) = (vmas_in(a.addr, N * PS), vmas_in(b.addr, N * PS));
    assert!(
        va + vb > N / 2,
        "only {va} + {vb} VMAs: not a scattered merge"
    );
    let pool_maps = |addr: usize| {
        mappings_in(addr, N * PS)
            .iter()
            .filter(|(_, _, l)| l.contains("memfd"))
            .count()
    };
    assert!(pool_maps(a.addr) + pool_maps(b.addr) > 0);
    // SAFETY: `b` is unmapped right after (drop) and not used again; the
    // test only reads its maps line in between.
    unsafe { e.unregister_unmapping(rb).unwrap() };
    let left = mappings_in(b.addr, N * PS);
    assert_eq!(left.len(), 1, "B's range after teardown: {left:?}");
    assert!(!left[0].2.contains("memfd"), "{left:?}");
    drop(b);
    e.check_consistency().unwrap();
    for i in (0..N).step_by(7) {
        assert_eq!(a.read(i), pattern(i as u64 + 1), "A page {i}");
    }
    // SAFETY: as for `b`.
    unsafe { e.unregister_unmapping(ra).unwrap() };
    assert_eq!(vmas_in(a.addr, N * PS), 1);
    drop(a);
    let s = e.stats();
    assert_eq!((s.pages_sharing, s.pool_pages), (0, 0), "{s:?}");
}

#[test]
fn background_mode_on_converges_and_counts_scans() {
    let e = Engine::new(EngineConfig {
        mode: Mode::On,
        ..EngineConfig::default()
    })
    .unwrap();
    let a = Mem::new(2048);
    a.fill_all(11);
    a.register(&e, "a", "g");
    assert!(e.wait_full_scans(3, Duration::from_secs(20)));
    let s = e.stats();
    assert_eq!(s.pages_sharing + s.pool_pages, 2048, "{s:?}");
    assert!(s.cpu_seconds > 0.0);
    assert!(s.full_scans >= 3);
    assert!(s.metadata_bytes > 0 && s.profit_bytes > 0);
    // Same-content run: stripes keep the VMA count low.
    assert!(s.vmas_created <= 2048 / 4, "vmas {}", s.vmas_created);
    assert!(s.map_count_headroom > 1000);
    let per_page = e.metadata_per_page();
    assert!(per_page <= 16.0, "metadata {per_page} bytes per page");
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(20)));
    assert_eq!(e.stats().pool_pages, 0);
}

#[test]
fn bad_registrations_are_rejected() {
    let e = engine(256);
    let a = Mem::new(8);
    a.register(&e, "a", "g");
    let mut s = a.spec("b", "g");
    assert!(matches!(
        // SAFETY: `a` is live memory, and the overlap is refused before the
        // engine touches it.
        unsafe { e.register(s.clone()) },
        Err(pagefold_dedup::Error::Overlap { .. })
    ));
    s.host_addr += 1;
    assert!(matches!(
        // SAFETY: a misaligned range is refused before the engine touches it.
        unsafe { e.register(s) },
        Err(pagefold_dedup::Error::BadRegion { .. })
    ));
    assert!(matches!(
        e.unregister(pagefold_dedup::RegionId(999)),
        Err(pagefold_dedup::Error::UnknownRegion(999))
    ));
}

#[test]
fn join_without_rehash_never_merges_a_changed_page_and_rehashes_it() {
    let e = engine(256);
    let (a, b, c) = (Mem::new(8), Mem::new(8), Mem::new(8));
    a.fill_from(500);
    b.fill_from(500);
    c.fill_all(0);
    let _ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    e.scan_now(2);
    assert_eq!(e.stats().pages_sharing, 8);
    // c's pages are first seen zero (a first-seen zero page waits a pass),
    // then rewritten to the pool's content and hashed once more (changed,
    // so not merged: stored hash = the pool content's) ...
    let _rc = c.register(&e, "vm-c", "g");
    e.scan_now(1);
    for i in 0..8 {
        c.fill(i, 500 + i as u64);
    }
    e.scan_now(1);
    assert_eq!(e.stats().pages_sharing, 8, "{:?}", e.stats());
    // ... then half of them change before the next visit: pages 4 and 5
    // in one byte that no sampled line holds (only the final compare can
    // tell), pages 6 and 7 throughout.
    let poke = |i: usize| {
        // SAFETY: byte 100 of page i, inside c's mapping; no sampled line
        // (the first, the middle and the last) holds it.
        unsafe { *c.page_ptr(i).add(100) ^= 0xff };
    };
    poke(4);
    poke(5);
    for i in 6..8 {
        c.fill(i, 900 + i as u64);
    }
    let expect = |i: usize| {
        let mut v = pattern(if i < 6 { 500 } else { 900 } + i as u64);
        if (4..6).contains(&i) {
            v[100] ^= 0xff;
        }
        v
    };
    let (h0, ab0) = (e.pages_hashed(), e.abandoned());
    e.scan_now(1);
    // Unchanged pages joined by their stored hash (no hashing). The pages
    // that changed in one byte failed the final compare and were not
    // merged; those rewritten throughout disagreed on the sampled lines,
    // so they were hashed instead of tried (changed: not merged).
    assert_eq!(e.pages_hashed() - h0, 2, "only pages 6 and 7 hashed");
    assert_eq!(e.abandoned() - ab0, 2);
    assert_eq!(e.stats().pages_sharing, 12, "{:?}", e.stats());
    for i in 0..8 {
        assert_eq!(c.read(i), expect(i), "page {i}");
    }
    e.check_consistency().unwrap();
    // The failed pages are hashed at their next visit, not joined again by
    // their stale hash; pages 6 and 7 get their second look.
    let (h1, ab1) = (e.pages_hashed(), e.abandoned());
    e.scan_now(1);
    assert_eq!(e.pages_hashed() - h1, 4);
    assert_eq!(e.abandoned(), ab1);
    assert_eq!(e.stats().pages_sharing, 12);
    for i in 4..8 {
        assert_eq!(c.read(i), expect(i), "page {i}");
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// A region filled with one pattern merges in its first pass, whole: once a
/// run of eight identical first-seen pages is visited, its first seven are
/// placed too, and the rest pair, grow a stripe and join it at once, most
/// of them continuing the stripe without a hash. The same content in runs
/// shorter than eight (interleaved with unique pages) waits for its second
/// sight, as KSM's volatility rule asks.
#[test]
fn a_run_of_one_pattern_merges_at_first_sight_and_short_runs_wait() {
    let e = engine(256);
    let (a, b) = (Mem::new(512), Mem::new(64));
    a.fill_all(7);
    for i in 0..64 {
        b.fill(i, if i % 8 < 4 { 9 } else { 1000 + i as u64 });
    }
    let _ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    let (h0, ab0) = (e.pages_hashed(), e.abandoned());
    e.scan_now(1);
    let st = e.stats();
    // All of a's 512 pages merged, the run's first seven included; b's
    // runs of four wait.
    assert_eq!(st.pages_shared + st.pages_sharing, 512, "{st:?}");
    assert!(
        st.pages_shared > 1 && st.pages_shared <= 64,
        "a stripe: {st:?}"
    );
    // b (64) hashed, a's pages hashed only until the run was seeded and
    // where the stripe grows or wraps: far fewer than a's 512.
    let hashed = e.pages_hashed() - h0;
    assert!(hashed < 64 + 200, "hashed {hashed}");
    assert_eq!(e.abandoned(), ab0);
    // The second pass merges b's runs of four.
    e.scan_now(1);
    let st = e.stats();
    assert_eq!(st.pages_shared + st.pages_sharing, 512 + 32, "{st:?}");
    for i in 0..512 {
        assert_eq!(a.read(i), pattern(7), "a page {i}");
    }
    for i in 0..64 {
        let v = if i % 8 < 4 { 9 } else { 1000 + i as u64 };
        assert_eq!(b.read(i), pattern(v), "b page {i}");
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// Pages whose share copy-on-write broke are not seeded by a run again: a
/// guest that rewrites a pattern soon after writing it would churn merges.
/// They are merged on their second sight, as KSM's volatility rule asks.
#[test]
fn a_run_rewritten_after_its_merge_waits_for_a_second_sight() {
    let e = engine(256);
    let a = Mem::new(512);
    a.fill_all(7);
    let _ra = a.register(&e, "vm-a", "g");
    // Pages mapping a pool slot (one alone on its slot is not "sharing").
    let mapped = |e: &Engine| e.stats().per_owner["vm-a"].pages_merged;
    e.scan_now(1);
    assert_eq!(mapped(&e), 512);
    // The guest rewrites pages 100.. with another pattern: copy-on-write.
    for i in 100..512 {
        a.fill(i, 9);
    }
    // All 512 merged at first sight (a run of one pattern).
    assert_eq!(e.stats().origins.merges.first_sight, 512, "{:?}", e.stats());
    e.scan_now(1);
    assert_eq!(e.stats().cow_breaks, 412, "{:?}", e.stats());
    assert_eq!(e.stats().origins.cow_breaks.first_sight, 412);
    assert_eq!(mapped(&e), 100, "pages 0..100");
    // A run of one pattern again, first seen since the break: not seeded.
    e.scan_now(1);
    assert_eq!(mapped(&e), 100, "{:?}", e.stats());
    e.scan_now(1);
    assert_eq!(mapped(&e), 512, "{:?}", e.stats());
    // Merged again on their second sight, by KSM's rule: none at first
    // sight.
    let o = e.stats().origins;
    assert_eq!(o.merges.first_sight, 512, "{o:?}");
    assert_eq!(o.merges.total(), 512 + 412, "{o:?}");
    for i in 0..512 {
        assert_eq!(a.read(i), pattern(if i < 100 { 7 } else { 9 }), "page {i}");
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// Inside a run of one pattern, a page is guessed to continue the run's
/// stripe without hashing or sampling it: a page that ends the run (other
/// content) or differs in a single byte fails its final compare and keeps
/// its content, and is hashed at its next visit. The odd pages lie in the
/// second span, where the stripe's slots are already written (in the span
/// that creates them nothing could be sampled anyway).
#[test]
fn a_page_breaking_a_run_of_one_pattern_fails_its_compare_and_keeps_its_content() {
    use pagefold_dedup::testing::SPAN_PAGES;
    let e = engine(256);
    let n = SPAN_PAGES + 256;
    let (odd, flipped) = (SPAN_PAGES + 100, SPAN_PAGES + 200);
    let a = Mem::new(n);
    a.fill_all(7);
    a.fill(odd, 8);
    // SAFETY: in bounds of page `flipped`; no engine runs yet.
    unsafe { *a.page_ptr(flipped).add(100) ^= 0xff };
    let want_flipped = a.read(flipped);
    let _ra = a.register(&e, "vm-a", "g");
    let (h0, ab0) = (e.pages_hashed(), e.abandoned());
    e.scan_now(1);
    let st = e.stats();
    // Both were guessed (a sample would have caught `odd`, not `flipped`)
    // and failed; every other page merged, the run's first seven included.
    assert_eq!(e.abandoned() - ab0, 2, "{st:?}");
    assert_eq!(st.pages_shared + st.pages_sharing, n as u64 - 2, "{st:?}");
    assert_eq!(a.read(odd), pattern(8));
    assert_eq!(a.read(flipped), want_flipped);
    e.check_consistency().unwrap();
    // The next pass hashes them (unique: not merged).
    let h1 = e.pages_hashed();
    e.scan_now(1);
    assert!(e.pages_hashed() - h1 >= 2);
    assert!(
        e.pages_hashed() - h0 < n as u64 / 4,
        "hashed {}",
        e.pages_hashed() - h0
    );
    let st = e.stats();
    assert_eq!(st.pages_shared + st.pages_sharing, n as u64 - 2, "{st:?}");
    for i in (0..n).filter(|&i| i != odd && i != flipped) {
        assert_eq!(a.read(i), pattern(7), "page {i}");
    }
    assert_eq!(a.read(odd), pattern(8));
    assert_eq!(a.read(flipped), want_flipped);
    e.check_consistency().unwrap();
    e.shutdown();
}

/// A first-seen page whose two left neighbours merged onto consecutive
/// slots is planned onto the next slot without hashing; a page that differs
/// outside the sampled lines fails the final compare and keeps its content,
/// one that differs in a sampled line is hashed as usual.
#[test]
fn a_run_continues_without_hashing_and_a_wrong_guess_loses_nothing() {
    let e = engine(256);
    let (a, b, c) = (Mem::new(16), Mem::new(16), Mem::new(16));
    for m in [&a, &b, &c] {
        m.fill_from(500);
    }
    // SAFETY: in bounds of c's page 10 and 12; no engine runs yet.
    unsafe {
        *c.page_ptr(10).add(100) ^= 0xff; // between sampled lines
        *c.page_ptr(12) ^= 0xff; // in the first line
    }
    let (want10, want12) = (c.read(10), c.read(12));
    let _ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    e.scan_now(2);
    assert_eq!(e.stats().pages_sharing, 16);
    // c is new, and the pool holds its content: its first pass joins.
    let _rc = c.register(&e, "vm-c", "g");
    let (h0, ab0) = (e.pages_hashed(), e.abandoned());
    e.scan_now(1);
    // Hashed: pages 0 and 1 (no run yet), 12 (sample differs), 13 and 14
    // (the run restarts); the other 11 continued the run unhashed, page 10
    // wrongly (abandoned at the final compare).
    assert_eq!(e.pages_hashed() - h0, 5);
    assert_eq!(e.abandoned() - ab0, 1);
    assert_eq!(e.stats().pages_sharing, 16 + 14, "{:?}", e.stats());
    assert_eq!(c.read(10), want10);
    assert_eq!(c.read(12), want12);
    for i in (0..16).filter(|&i| i != 10 && i != 12) {
        assert_eq!(c.read(i), pattern(500 + i as u64), "page {i}");
    }
    e.check_consistency().unwrap();
    // The wrong guess is hashed at its next visit (unique: not merged).
    let h1 = e.pages_hashed();
    e.scan_now(1);
    assert!(e.pages_hashed() > h1);
    assert_eq!(e.stats().pages_sharing, 30);
    assert_eq!(c.read(10), want10);
    e.check_consistency().unwrap();
    e.shutdown();
}

/// A region's quiescer is requested and released around every batch of
/// merges (and only then), and not any more once it is taken back.
#[test]
fn merge_batches_park_the_regions_quiescers() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let e = engine(256);
    let (a, b) = (Mem::new(32), Mem::new(32));
    a.fill_from(700);
    b.fill_from(700);
    let ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    let q = Arc::new(CountingQuiescer::default());
    e.set_quiesce(ra, Some(q.clone()));
    e.scan_now(1);
    // The first pass only hashes: nothing to execute, nothing parked.
    assert_eq!(q.requests.load(Ordering::SeqCst), 0);
    e.scan_now(1);
    assert_eq!(e.stats().pages_sharing, 32);
    let n = q.requests.load(Ordering::SeqCst);
    assert!(n >= 1, "the merge batch parked the VM");
    assert_eq!(q.releases.load(Ordering::SeqCst), n);
    assert_eq!(q.held.load(Ordering::SeqCst), 0);
    // Taken back as a stopping VM does (with its write log, one call):
    // later merges leave it alone.
    e.detach_guest(&[ra]);
    a.fill_from(900);
    b.fill_from(900);
    e.scan_now(3);
    assert!(e.stats().merges > 64, "{:?}", e.stats());
    assert_eq!(q.requests.load(Ordering::SeqCst), n);
    for i in 0..32 {
        assert_eq!(a.read(i), pattern(900 + i as u64));
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// The quiesce threshold is the engine's configuration: at 0 no batch parks
/// the guests, and a batch smaller than the threshold does not either.
#[test]
fn batches_below_the_configured_quiesce_threshold_do_not_park() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    for min_ops in [0, 1000] {
        let e = Engine::new(EngineConfig {
            knobs: Knobs {
                pages_to_scan: 1 << 16,
                sleep_millisecs: 0,
                max_page_sharing: 256,
            },
            quiesce_min_ops: min_ops,
            ..EngineConfig::default()
        })
        .unwrap();
        let (a, b) = (Mem::new(32), Mem::new(32));
        a.fill_from(700);
        b.fill_from(700);
        let ra = a.register(&e, "vm-a", "g");
        let _rb = b.register(&e, "vm-b", "g");
        let q = Arc::new(CountingQuiescer::default());
        e.set_quiesce(ra, Some(q.clone()));
        e.scan_now(2);
        assert_eq!(e.stats().pages_sharing, 32, "threshold {min_ops}");
        assert_eq!(q.requests.load(Ordering::SeqCst), 0, "threshold {min_ops}");
        e.check_consistency().unwrap();
        e.shutdown();
    }
}

/// Mode `unmerge` parks the guests too (each chunk flushes the TLB), but
/// over slices of chunks: on a scattered layout a chunk is a page or two,
/// and a park per chunk cost more than the flushes it saved. Half of B's
/// pages hold A's content in a random order, so A's and B's merged pages
/// form runs of a page or two: hundreds of chunks, a park or two per region.
#[test]
fn an_unmerge_parks_the_guests_per_slice_of_chunks() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    const N: usize = 2048;
    let e = engine(256);
    let (a, b) = (Mem::new(N), Mem::new(N));
    let perm = permutation(N, 0x0dd_5eed);
    for (i, &j) in perm.iter().enumerate() {
        a.fill(i, 10_000 + i as u64);
        // B's page perm[i] copies A's page i for even i, else unique.
        let v = if i % 2 == 0 { 10_000 } else { 90_000 };
        b.fill(j, v + i as u64);
    }
    let ra = a.register(&e, "vm-a", "g");
    b.register(&e, "vm-b", "g");
    let q = Arc::new(CountingQuiescer::default());
    e.set_quiesce(ra, Some(q.clone()));
    let mut scans = 0;
    while (e.stats().pages_sharing as usize) < N / 2 && scans < 16 {
        e.scan_now(1);
        scans += 1;
    }
    assert_eq!(e.stats().pages_sharing as usize, N / 2, "{:?}", e.stats());
    // The pause budget would end each park after 500 µs (the quiescer
    // says it holds threads): at a second, what is left is the slicing.
    let budget = DedupSettings {
        max_guest_pause_us: Some(1_000_000),
        ..DedupSettings::default()
    };
    e.apply(&budget.validate().unwrap()).unwrap();
    let before = q.requests.load(Ordering::SeqCst);
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(60)));
    let s = e.stats();
    assert_eq!((s.pages_sharing, s.pool_pages), (0, 0), "{s:?}");
    let parks = q.requests.load(Ordering::SeqCst) - before;
    assert!(
        (1..=4).contains(&parks),
        "{parks} parks to unmerge {} scattered pages in two regions",
        N / 2
    );
    assert_eq!(q.held.load(Ordering::SeqCst), 0);
    for (i, &j) in perm.iter().enumerate() {
        assert_eq!(a.read(i), pattern(10_000 + i as u64), "A page {i}");
        let v = if i % 2 == 0 { 10_000 } else { 90_000 };
        assert_eq!(b.read(j), pattern(v + i as u64), "B page {j}");
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// Soak finding (2026-11-30): a region registered while the unstable index
/// still held pages of a removed region that sat after an older one made the
/// index's grow read past the end of that older region (`then_some` evaluated
/// the page's word before the bounds check): a panic in `register`, which
/// took the whole VMM down when a VM was created through the API.
#[test]
fn register_after_removing_a_region_mid_pass() {
    let e = Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 100,
            sleep_millisecs: 60_000,
            max_page_sharing: 256,
        },
        ..EngineConfig::default()
    })
    .unwrap();
    let (a, b, d) = (Mem::new(16), Mem::new(64), Mem::new(1024));
    a.fill_from(10_000);
    b.fill_from(20_000);
    d.fill_from(30_000);
    let _ra = a.register(&e, "a", "g");
    let rb = b.register(&e, "b", "g");
    let _rd = d.register(&e, "d", "g");
    // A first pass hashes every page (a page enters the unstable index on
    // its second visit, unchanged); then one wake-up of 100 page visits:
    // a and b go into the unstable index, the pass stops inside d and the
    // engine sleeps for a minute.
    e.scan_now(1);
    let hashed = e.pages_hashed();
    e.set_mode(Mode::On).unwrap();
    let t = std::time::Instant::now();
    while e.pages_hashed() < hashed + 80 {
        assert!(t.elapsed() < Duration::from_secs(10), "no wake-up");
        std::thread::sleep(Duration::from_millis(5));
    }
    e.unregister(rb).unwrap();
    // A bigger region grows the index, rehashing b's stale entries.
    let c = Mem::new(2048);
    c.register(&e, "c", "g");
    e.scan_now(2);
    e.check_consistency().unwrap();
    e.shutdown();
}

/// A page that breaks its share becomes a private anonymous page inside
/// the pool VMA its merge created; once identical again it is merged again
/// (protected there, compared, remapped), and the counts stay exact.
#[test]
fn a_cow_broken_page_merges_again_inside_its_pool_vma() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(16), Mem::new(16));
    a.fill_from(500);
    b.fill_from(500);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.scan_now(2);
    assert_eq!(e.stats().pages_sharing, 16);
    assert_eq!(a.read(5), pattern(505)); // maps the page in
    assert!(a.entry(&pm, 5).file());
    // Break the share of page 5 in `a` with other content, then write the
    // old content back: a private anonymous page inside the pool VMA.
    a.fill(5, 9999);
    e.scan_now(2);
    assert_eq!(e.stats().cow_breaks, 1);
    assert_eq!(e.stats().pages_sharing, 15);
    a.fill(5, 505);
    assert!(!a.entry(&pm, 5).file());
    e.scan_now(3);
    let s = e.stats();
    assert_eq!(s.pages_sharing, 16, "{s:?}");
    assert_eq!(a.read(5), pattern(505));
    assert!(a.entry(&pm, 5).file());
    assert_eq!(a.pfn(&pm, 5), b.pfn(&pm, 5));
    for i in 0..16 {
        assert_eq!(a.read(i), pattern(500 + i as u64));
    }
    e.check_consistency().unwrap();
    e.shutdown();
}

/// Pages merged once and written since are private copies that still lie
/// in their pool VMAs. When the last merged page goes (here: the other VM
/// leaves), every slot is freed at once; that must not touch those copies.
/// The pool used to be truncated then, and truncating a file unmaps even
/// the private copies of its pages: the guest's data was gone (zeros once
/// the pool grew again, KVM_RUN EFAULT while it had not; soak and stress
/// of 2026-12-02).
#[test]
fn freeing_every_slot_keeps_pages_written_since_their_merge() {
    const N: usize = 128;
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(N), Mem::new(N));
    a.fill_from(3000);
    b.fill_from(3000);
    let mut core = driven_core();
    // SAFETY: `a` and `b` are private anonymous mappings declared before
    // the core, so they stay mapped for as long as it lives.
    unsafe { core.register(a.addr, N * PS, "a".into(), "g".into()) }.unwrap();
    // SAFETY: as for `a`.
    let b_id = unsafe { core.register(b.addr, N * PS, "b".into(), "g".into()) }.unwrap();
    core.run_passes(3);
    assert!(
        (0..N).all(|i| a.pfn(&pm, i) == b.pfn(&pm, i)),
        "the regions did not merge"
    );
    // The guest of a rewrites every page (copy-on-write, inside the pool
    // VMAs); the scan notices: a maps no slot any more, b maps them all.
    for i in 0..N {
        a.fill(i, 90_000 + i as u64);
    }
    core.run_passes(9);
    core.check_consistency().unwrap();
    // b leaves: no slot has a mapper left, all are freed together.
    // SAFETY: the test never reads or writes `b` again; it is unmapped
    // when it drops.
    unsafe { core.unregister(b_id, false) }.unwrap();
    core.check_consistency().unwrap();
    for i in 0..N {
        assert!(
            a.entry(&pm, i).present(),
            "page {i} of a (written after its merge) was unmapped when the pool was emptied"
        );
        assert_eq!(a.read(i), pattern(90_000 + i as u64), "page {i}");
    }
    // The pool is usable again: a's pages merge among themselves.
    a.fill_all(7);
    core.run_passes(3);
    core.check_consistency().unwrap();
    assert!((0..N).all(|i| a.read(i) == pattern(7)));
}

#[test]
fn registering_memory_during_an_unmerge_waits_for_a_chunk_not_for_the_whole_unmerge() {
    // Mode `unmerge` gave every merged page back in one hold of the core
    // lock (120-170 ms per 76,800 pages in a release build), and a VM
    // created or deleted meanwhile waited for all of it. It now lets a
    // waiter in after the chunk (at most 256 pages) it is unmerging.
    use std::time::Instant;
    let n = 65536;
    let (a, b) = (Mem::new(n), Mem::new(n));
    a.fill_from(1);
    b.fill_from(1);
    let e = engine(256);
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    merge_fully(&e, n);
    let start = Instant::now();
    e.set_mode(Mode::Unmerge).unwrap();
    let mut worst = Duration::ZERO;
    let mut rounds = 0;
    while e.stats().pages_sharing > 0 && start.elapsed() < Duration::from_secs(30) {
        let c = Mem::new(64);
        c.fill_from(5_000_000);
        let t = Instant::now();
        let id = c.register(&e, "c", "g");
        worst = worst.max(t.elapsed());
        let t = Instant::now();
        e.unregister(id).unwrap();
        worst = worst.max(t.elapsed());
        rounds += 1;
    }
    let took = start.elapsed();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(30)));
    assert_eq!(e.stats().pages_sharing, 0);
    for i in (0..n).step_by(509) {
        assert_eq!(b.read(i), pattern(1 + i as u64));
    }
    eprintln!("unmerge {took:?}, {rounds} registrations, worst wait {worst:?}");
    assert!(
        rounds >= 4,
        "{rounds} registrations during a {took:?} unmerge"
    );
    assert!(
        worst * 4 < took,
        "a registration waited {worst:?} during a {took:?} unmerge ({rounds} rounds)"
    );
    e.check_consistency().unwrap();
    e.shutdown();
}

/// Whether `addr` lies in a mapping of the engine's pool file.
fn in_pool_vma(addr: usize) -> bool {
    mappings()
        .iter()
        .any(|(s, e, l)| (*s..*e).contains(&addr) && l.contains("pagefold-pool"))
}

/// Scans until the `n` pages of two identical regions all share (at most
/// ten passes), and asserts they do.
fn merge_fully(e: &Engine, n: usize) {
    for _ in 0..10 {
        if e.stats().pages_sharing as usize == n {
            break;
        }
        e.scan_now(1);
    }
    assert_eq!(e.stats().pages_sharing as usize, n);
}

/// The case the unmerge's yield opens: a VM leaves while mode `unmerge`
/// is half-way through another VM of its group, whose merged pages left
/// to unmerge were all rewritten since their merge (private copies inside
/// pool VMAs, mapping no slot). With the leaving VM every slot is freed at
/// once; the unmerge then copies those pages out of their pool VMAs, and
/// they must still hold their data (a truncated pool destroyed them: the
/// engine thread took SIGBUS, the guest read zeros).
#[test]
fn a_vm_leaving_half_way_through_an_unmerge_loses_no_page_of_the_other() {
    use std::time::Instant;
    let (n, head) = (65536, 2048);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(n), Mem::new(n));
    a.fill_from(1);
    b.fill_from(1);
    let e = engine(256);
    a.register(&e, "a", "g");
    let b_id = b.register(&e, "b", "g");
    merge_fully(&e, n);
    // a rewrites every page after its first `head` (copy-on-write inside
    // the pool VMAs), and the scan sees it: only a's head maps slots.
    for i in head..n {
        a.fill(i, 7_000_000 + i as u64);
    }
    for _ in 0..40 {
        if e.stats().per_owner["a"].pages_merged as usize == head {
            break;
        }
        e.scan_now(1);
    }
    assert_eq!(e.stats().per_owner["a"].pages_merged as usize, head);
    let want = |i: usize| {
        pattern(if i < head {
            1 + i as u64
        } else {
            7_000_000 + i as u64
        })
    };
    e.set_mode(Mode::Unmerge).unwrap();
    // a (registered first) is unmerged first, in order; b leaves once a's
    // head is private again and the rest not yet out of the pool.
    let private = |i: usize| {
        let en = a.entry(&pm, i);
        en.present() && !en.file()
    };
    let t = Instant::now();
    while !private(head - 1) && t.elapsed() < Duration::from_secs(10) {
        std::hint::spin_loop();
    }
    assert!(private(head - 1), "the unmerge did not start");
    e.unregister(b_id).unwrap();
    assert!(
        in_pool_vma(a.addr + (n - 1) * PS),
        "the unmerge of a ended before b left: the case is not tested"
    );
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(30)));
    for i in 0..n {
        assert!(private(i), "page {i} of a is not private after the unmerge");
        assert!(a.read(i) == want(i), "page {i} of a lost its data");
    }
    let s = e.stats();
    assert_eq!((s.pages_sharing, s.pool_pages), (0, 0), "{s:?}");
    e.check_consistency().unwrap();
    e.shutdown();
}

/// A wake-up whose time is up ends like one with a waiter: the span stops
/// once 512 merges are planned, its execution after 512 merges ran (the
/// few planned ops left wait for a second look), the batch reports that it
/// yielded, and the next batches merge the rest. An unmerge step past its
/// time likewise stops after a chunk and the next steps finish the
/// unmerge.
#[test]
fn a_wakeup_past_its_deadline_stops_at_a_step_and_the_next_go_on() {
    const N: usize = 4096;
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(N);
    for k in 0..N / 2 {
        a.fill(2 * k, 50_000 + k as u64);
        a.fill(2 * k + 1, 50_000 + k as u64);
    }
    let mut core = driven_core();
    // SAFETY: `a` is a private anonymous mapping declared before the core,
    // so it stays mapped for as long as the core lives.
    unsafe { core.register(a.addr, N * PS, "a".into(), "g".into()) }.unwrap();
    core.run_passes(1);
    core.set_deadline(Some(std::time::Instant::now()));
    let rep = core.run_batch(1 << 20, true);
    assert!(rep.yielded, "{rep:?}");
    let left = core.counters().left_for_waiters;
    assert!(
        (512..=514).contains(&(rep.merges + left)),
        "the span planned {} merges and left {left} before stopping at the deadline",
        rep.merges
    );
    assert!(rep.merges >= 512, "{rep:?}");
    core.check_consistency().unwrap();
    core.set_deadline(None);
    core.run_passes(2);
    core.check_consistency().unwrap();
    for k in 0..N / 2 {
        assert_eq!(a.pfn(&pm, 2 * k), a.pfn(&pm, 2 * k + 1), "pair {k}");
    }
    // Unmerge: each step past its deadline does one chunk (and says it
    // stopped early); the steps together unmerge every page.
    let mut steps = 0;
    loop {
        core.set_deadline(Some(std::time::Instant::now()));
        steps += 1;
        match core.unmerge_all() {
            Some(left) => {
                assert_eq!(left, 0);
                break;
            }
            None => assert!(steps < 10_000, "unmerge makes no progress"),
        }
    }
    assert!(steps > 1, "the deadline did not stop the unmerge");
    core.set_deadline(None);
    core.check_consistency().unwrap();
    for k in 0..N / 2 {
        assert_ne!(a.pfn(&pm, 2 * k), a.pfn(&pm, 2 * k + 1), "pair {k}");
        assert_eq!(a.read(2 * k + 1), pattern(50_000 + k as u64));
        assert_eq!(a.read(2 * k), pattern(50_000 + k as u64));
    }
}

/// A span plans the merges of up to 4,096 pages and runs them before the
/// batch can yield: 2,570 scattered merges held the core 244 ms in a soak,
/// and a VM being created waited for all of them. With a thread waiting for
/// the core, the span now ends once 512 merges are planned; the rest of the
/// span is merged by the next batch, as if nothing had happened.
#[test]
fn a_waiter_ends_a_span_after_512_planned_merges() {
    const N: usize = 4096;
    let pm = Pagemap::open().unwrap();
    // Pages 2k and 2k+1 hold the same content: every odd page pairs with
    // its left neighbour, so the region's one span plans 4,096 merges.
    let a = Mem::new(N);
    for k in 0..N / 2 {
        a.fill(2 * k, 40_000 + k as u64);
        a.fill(2 * k + 1, 40_000 + k as u64);
    }
    let mut core = driven_core();
    // SAFETY: `a` is a private anonymous mapping declared before the core,
    // so it stays mapped for as long as the core lives.
    unsafe { core.register(a.addr, N * PS, "a".into(), "g".into()) }.unwrap();
    // First pass: hashes only (KSM's volatility rule).
    core.run_passes(1);
    core.waiters()
        .store(1, std::sync::atomic::Ordering::Release);
    let rep = core.run_batch(1 << 20, true);
    core.waiters()
        .store(0, std::sync::atomic::Ordering::Release);
    assert!(rep.yielded, "{rep:?}");
    assert!(
        (512..=514).contains(&rep.merges),
        "the span ran {} merges before yielding",
        rep.merges
    );
    core.check_consistency().unwrap();
    // The rest merges on the next batches.
    core.run_passes(2);
    core.check_consistency().unwrap();
    for k in 0..N / 2 {
        assert_eq!(a.pfn(&pm, 2 * k), a.pfn(&pm, 2 * k + 1), "pair {k}");
        assert_eq!(a.read(2 * k + 1), pattern(40_000 + k as u64));
    }
}
