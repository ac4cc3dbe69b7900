//! Regression: pages that become identical at different times must still
//! meet. Smart-scan skipping visits a page that stays unique only every
//! 2, 4, then 8 passes; if two identical pages were skipped on different
//! passes (out of phase) and the unstable index only holds pages visited in
//! the current pass, neither ever found the other (seen with two VMs that
//! fill their memory at slightly different times).

mod common;

use std::collections::HashMap;

use common::*;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::DedupBackend;

/// Pages per region.
const N: usize = 512;

/// Asserts that page i of `a` and page i of `b` share one frame for every i,
/// that no other sharing exists, and that the stats say exactly that.
fn assert_pairs_merged(e: &pagefold_dedup::Engine, a: &Mem, b: &Mem, pm: &Pagemap) {
    let s = e.stats();
    let unmerged: Vec<usize> = (0..N)
        .filter(|&i| {
            let (pa, pb) = (a.pfn(pm, i), b.pfn(pm, i));
            pa == 0 || pa != pb
        })
        .collect();
    assert!(
        unmerged.is_empty(),
        "{} of {N} identical pairs never merged (first: {:?}); {s:?}",
        unmerged.len(),
        &unmerged[..unmerged.len().min(8)]
    );
    assert_eq!(
        (s.pages_shared, s.pages_sharing),
        (N as u64, N as u64),
        "{s:?}"
    );
    assert_eq!(s.pool_pages, N as u64, "{s:?}");
    let mut pfns: HashMap<u64, u32> = HashMap::new();
    for i in 0..N {
        *pfns.entry(a.pfn(pm, i)).or_default() += 1;
        *pfns.entry(b.pfn(pm, i)).or_default() += 1;
        assert_eq!(a.read(i), pattern(5000 + i as u64));
        assert_eq!(b.read(i), pattern(5000 + i as u64));
    }
    assert!(
        pfns.values().all(|&n| n == 2),
        "a frame shared other than pairwise"
    );
    e.check_consistency().unwrap();
}

/// Region a is written in 8 waves, one per pass, then left alone until its
/// pages reach the highest smart-scan level; region b gets the same contents
/// later, also in waves of different phase. Every pair must merge within a
/// bounded number of passes.
#[test]
fn pages_written_in_different_passes_all_merge() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(N), Mem::new(N));
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    for wave in 0..8 {
        for i in (0..N).filter(|i| i % 8 == wave) {
            a.fill(i, 5000 + i as u64);
        }
        e.scan_now(1);
    }
    // a's pages are unique: let them climb to the top level.
    e.scan_now(13);
    assert_eq!(e.stats().pages_sharing, 0);
    for wave in 0..8 {
        // Another order than a's, so pair phases differ.
        for i in (0..N).filter(|i| (i / 8 + 3 * (i % 8)) % 8 == wave) {
            b.fill(i, 5000 + i as u64);
        }
        e.scan_now(1);
    }
    // Enough for any two pages to be visited in one pass: the top level
    // visits once every 8 passes; allow a full cycle from every level.
    e.scan_now(40);
    assert_pairs_merged(&e, &a, &b, &pm);
    e.shutdown();
}

/// The same, with both regions written wave by wave at the same time but
/// shifted: b's page i arrives some passes after a's page i, for shifts
/// 1..=7 (every relative phase).
#[test]
fn pages_arriving_with_every_phase_shift_all_merge() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = (Mem::new(N), Mem::new(N));
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    // Page i of a is written on pass i % 16, page i of b on pass
    // i % 16 + 1 + (i / 16) % 7.
    for pass in 0..24 {
        for i in 0..N {
            if i % 16 == pass {
                a.fill(i, 5000 + i as u64);
            }
            if i % 16 + 1 + (i / 16) % 7 == pass {
                b.fill(i, 5000 + i as u64);
            }
        }
        e.scan_now(1);
    }
    e.scan_now(40);
    assert_pairs_merged(&e, &a, &b, &pm);
    e.shutdown();
}
