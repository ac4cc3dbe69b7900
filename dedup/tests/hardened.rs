//! Hardened dedup groups (root: userfaultfd and pagemap PFNs): a guest
//! must not tell a merged page from an unmerged one by its first write, so
//! every page that stays unwritten over two of the scan's visits moves onto
//! a pool page, shared with its twins or its own, zero pages too; pages
//! written since stay the guest's own.

mod common;

use common::*;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::{DedupBackend, Error, Security};

/// Pages 0..16 the same in both guests, 16..24 each guest's own, 24..32
/// zeros written by the guest.
const SHARED: usize = 16;
const UNIQUE: usize = 8;
const ZERO: usize = 8;
const PAGES: usize = SHARED + UNIQUE + ZERO;

fn guests() -> (Mem, Mem) {
    let (a, b) = (Mem::new(PAGES), Mem::new(PAGES));
    for (m, own) in [(&a, 1u64 << 40), (&b, 2u64 << 40)] {
        for i in 0..SHARED {
            m.fill(i, 100 + i as u64);
        }
        for i in SHARED..SHARED + UNIQUE {
            m.fill(i, own + i as u64);
        }
        for i in SHARED + UNIQUE..PAGES {
            // SAFETY: page i of our own mapping.
            unsafe { std::ptr::write_bytes(m.page_ptr(i), 0, 4096) };
        }
    }
    (a, b)
}

fn content(own: u64, i: usize) -> Vec<u8> {
    if i < SHARED {
        pattern(100 + i as u64)
    } else if i < SHARED + UNIQUE {
        pattern(own + i as u64)
    } else {
        vec![0; 4096]
    }
}

/// Page i of `m` maps the pool (read first, so that it is present).
fn on_pool(m: &Mem, pm: &Pagemap, i: usize) -> bool {
    let _ = m.pfn(pm, i);
    let e = m.entry(pm, i);
    e.present() && e.file()
}

#[test]
fn every_idle_page_of_a_hardened_group_moves_onto_the_pool() {
    let pm = Pagemap::open().unwrap();
    let (a, b) = guests();
    let e = engine(256);
    let _ra = a.register_as(&e, "vm-a", "h", Security::Hardened);
    let _rb = b.register_as(&e, "vm-b", "h", Security::Hardened);
    // Visits 1 and 2 see each page first, then unchanged: not yet idle (a
    // default group merges the shared pages on the second).
    e.scan_now(2);
    let s = e.stats();
    assert_eq!(
        (s.merges, s.zero_pages),
        (0, 0),
        "merged before idle: {s:?}"
    );
    for i in 0..PAGES {
        assert!(!on_pool(&a, &pm, i), "page {i} moved before it was idle");
    }
    // Visit 3: unchanged over two visits, every page moves.
    e.scan_now(1);
    let s = e.stats();
    for i in 0..PAGES {
        assert!(
            on_pool(&a, &pm, i),
            "a's page {i} is not on the pool: {s:?}"
        );
        assert!(
            on_pool(&b, &pm, i),
            "b's page {i} is not on the pool: {s:?}"
        );
    }
    for i in 0..SHARED {
        assert_eq!(a.pfn(&pm, i), b.pfn(&pm, i), "shared page {i} not shared");
    }
    for i in SHARED..SHARED + UNIQUE {
        assert_ne!(a.pfn(&pm, i), b.pfn(&pm, i));
    }
    // The zero pages went to pool pages like any content, none to the
    // zero page.
    let zero_pfn = pagefold_dedup::mm::zero_pfn(&pm);
    let zeros = |m: &Mem| -> std::collections::BTreeSet<u64> {
        (SHARED + UNIQUE..PAGES).map(|i| m.pfn(&pm, i)).collect()
    };
    let (za, zb) = (zeros(&a), zeros(&b));
    assert!(!za.contains(&zero_pfn) && !zb.contains(&zero_pfn));
    assert!(
        zb.is_subset(&za),
        "b's zero pages share none of a's: {za:?} {zb:?}"
    );
    // Saved: a page per shared pair and per pair of zero pages at least;
    // the unique pages' own pool pages save nothing.
    assert_eq!(s.zero_pages, 0, "{s:?}");
    assert!(s.pages_sharing as usize >= SHARED + ZERO, "{s:?}");
    assert_eq!(s.merges as usize, 2 * PAGES, "{s:?}");
    for (m, own) in [(&a, 1u64 << 40), (&b, 2u64 << 40)] {
        for i in 0..PAGES {
            assert_eq!(m.read(i), content(own, i), "page {i}");
        }
    }
    // First writes: every page's copy-on-write breaks its pool mapping,
    // whatever it shared, and the guest's bytes land.
    for (m, own) in [(&a, 1u64 << 40), (&b, 2u64 << 40)] {
        for i in 0..PAGES {
            // SAFETY: page i of our own mapping.
            unsafe { m.page_ptr(i).add(7).write_volatile(0xa5) };
            let mut want = content(own, i);
            want[7] = 0xa5;
            assert_eq!(m.read(i), want, "page {i} after its write");
            let e = m.entry(&pm, i);
            assert!(e.present() && !e.file(), "page {i} still maps the pool");
        }
    }
    e.scan_now(1);
    let s = e.stats();
    assert_eq!(s.cow_breaks as usize, 2 * PAGES, "{s:?}");
    e.check_consistency().unwrap();
}

#[test]
fn a_default_group_leaves_unique_pages_alone_and_drops_zero_pages() {
    // The same guests in a default group: what the hardened group changes.
    let pm = Pagemap::open().unwrap();
    let (a, b) = guests();
    let e = engine(256);
    let _ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    e.scan_now(3);
    let s = e.stats();
    assert_eq!(s.zero_pages as usize, 2 * ZERO, "{s:?}");
    assert_eq!(s.pages_sharing as usize, SHARED, "{s:?}");
    for i in 0..SHARED {
        assert!(on_pool(&a, &pm, i));
    }
    for i in SHARED..SHARED + UNIQUE {
        assert!(!on_pool(&a, &pm, i), "unique page {i} moved");
    }
}

#[test]
fn a_hardened_groups_written_pages_stay_the_guests_own() {
    let pm = Pagemap::open().unwrap();
    let (a, b) = guests();
    let e = engine(256);
    let _ra = a.register_as(&e, "vm-a", "h", Security::Hardened);
    let _rb = b.register_as(&e, "vm-b", "h", Security::Hardened);
    // Page 0 of a changes before every pass, between two contents: its
    // hash differs at each visit, so it is never idle (its twin's content
    // every other pass is no reason to merge it).
    for round in 0..6u64 {
        a.fill(0, if round % 2 == 0 { 7 } else { 100 });
        e.scan_now(1);
    }
    assert!(!on_pool(&a, &pm, 0), "a page written every pass moved");
    assert!(on_pool(&a, &pm, 1) && on_pool(&b, &pm, 0));
}

#[test]
fn a_group_keeps_one_security() {
    let (a, b) = (Mem::new(4), Mem::new(4));
    let e = engine(256);
    let _ra = a.register_as(&e, "vm-a", "h", Security::Hardened);
    let spec = pagefold_dedup::RegionSpec {
        security: Security::Default,
        ..b.spec("vm-b", "h")
    };
    // SAFETY: b outlives the engine's use of it (the registration fails).
    let err = unsafe { e.register(spec) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::SecurityMismatch {
                has: Security::Hardened,
                asked: Security::Default,
                ..
            }
        ),
        "{err}"
    );
    // Another group may be default.
    let _rb = b.register(&e, "vm-b", "g");
}
