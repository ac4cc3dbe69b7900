//! Pages given back by their owner (`DedupBackend::discard`: a balloon's
//! inflated pages, free page reporting): merged pages leave the pool
//! without a copy, zero and plain pages are freed, pages copied on write
//! since their merge read zeros (never the pool page), and none of them is
//! scanned or counted as merged or zero until it is written again. The
//! figures are checked against pagemap, the books with
//! `check_consistency`. (The KSM-assisted case is in assist.rs, the race
//! with writers and merges in torture.rs, `torture_discards*`.)

mod common;

use common::*;
use pagefold_dedup::ksm::KsmBackend;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::{DedupBackend, Security};

#[test]
fn a_merged_page_given_back_leaves_the_pool_without_a_copy() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = merged_pair(&e, 32, 1000);
    let pool_pfn = b.pfn(&pm, 5);
    assert!(b.entry(&pm, 5).file(), "b's page 5 maps the pool");

    // SAFETY: a's pages 0..16 are expected to read zeros from here on.
    let n = unsafe { e.discard(a.addr, 16 * PS) }.unwrap();
    assert_eq!(n, 16);
    let s = e.stats();
    let o = &s.per_owner["a"];
    assert_eq!(
        (o.pages_merged, o.pages_reported, o.pages_returned),
        (16, 16, Some(16)),
        "{s:?}"
    );
    assert_eq!((s.pages_sharing, s.pool_pages), (16, 32), "{s:?}");
    assert_eq!((s.pages_reported, s.pages_returned), (16, Some(16)));
    for i in 0..16 {
        assert!(!a.entry(&pm, i).present(), "page {i} still mapped");
    }
    // No pool VMA is left over the pages given back.
    assert!(mappings_in(a.addr, 16 * PS)
        .iter()
        .all(|(_, _, line)| !line.contains("memfd")));
    for i in 0..32 {
        let want = if i < 16 { 0 } else { 1000 + i as u64 };
        assert_eq!(a.read(i), pattern(want), "a's page {i}");
        assert_eq!(b.read(i), pattern(1000 + i as u64), "b's page {i}");
    }
    // b still maps the very pool page: nothing was copied for it.
    assert_eq!(b.pfn(&pm, 5), pool_pfn);
    e.check_consistency().unwrap();

    // The last mapper given back frees the slot.
    // SAFETY: b's pages 0..8 are expected to read zeros from here on.
    assert_eq!(unsafe { e.discard(b.addr, 8 * PS) }.unwrap(), 8);
    let s = e.stats();
    assert_eq!((s.pages_sharing, s.pool_pages), (16, 24), "{s:?}");
    e.check_consistency().unwrap();

    // Not scanned again until written: the pages given back are absent
    // (or the zero page, read above), so passes hash none of them.
    let hashed = e.pages_hashed();
    e.scan_now(3);
    assert_eq!(e.pages_hashed(), hashed, "a page given back was hashed");
    assert_eq!(e.stats().per_owner["a"].pages_returned, Some(16));
    // Written again: hashed and merged like any page (a's page 3 gets b's
    // page 20's content), no longer counted as given back.
    a.fill(3, 1020);
    e.scan_now(3);
    let s = e.stats();
    assert_eq!(s.per_owner["a"].pages_returned, Some(15), "{s:?}");
    assert!(e.pages_hashed() > hashed);
    assert_eq!(a.read(3), pattern(1020));
    e.check_consistency().unwrap();
}

#[test]
fn zero_and_plain_pages_given_back_are_freed_and_not_scanned() {
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(64);
    for i in 0..64 {
        a.fill(i, if i < 16 { 0 } else { 5000 + i as u64 });
        // SAFETY: make the zero pages present (written).
        unsafe { std::ptr::write_volatile(a.page_ptr(i), 0) };
        a.fill(i, if i < 16 { 0 } else { 5000 + i as u64 });
    }
    a.register(&e, "a", "g");
    e.scan_now(2);
    let s = e.stats();
    assert_eq!((s.zero_pages, s.pages_sharing), (16, 0), "{s:?}");
    assert!((16..64).all(|i| a.entry(&pm, i).present()));

    // SAFETY: every page of a is expected to read zeros from here on.
    let n = unsafe { e.discard(a.addr, 64 * PS) }.unwrap();
    assert_eq!(n, 64);
    assert!((0..64).all(|i| !a.entry(&pm, i).present()));
    let s = e.stats();
    let o = &s.per_owner["a"];
    // Given back, the zero pages are neither zero pages any more nor
    // counted twice.
    assert_eq!(
        (
            o.zero_pages,
            o.pages_merged,
            o.pages_returned,
            o.pages_reported
        ),
        (0, 0, Some(64), 64),
        "{s:?}"
    );
    assert_eq!(s.zero_pages, 0);
    let hashed = e.pages_hashed();
    e.scan_now(3);
    assert_eq!(e.pages_hashed(), hashed, "a page given back was hashed");
    assert!((0..64).all(|i| !a.entry(&pm, i).present()));

    a.fill(20, 7);
    e.scan_now(2);
    let s = e.stats();
    assert_eq!(s.per_owner["a"].pages_returned, Some(63), "{s:?}");
    assert!(e.pages_hashed() > hashed);
    // Given back twice: counted twice as reported, once as returned.
    // SAFETY: as above.
    assert_eq!(unsafe { e.discard(a.addr, 32 * PS) }.unwrap(), 32);
    let s = e.stats();
    assert_eq!(s.per_owner["a"].pages_reported, 96);
    assert_eq!(s.per_owner["a"].pages_returned, Some(64));
    e.check_consistency().unwrap();
}

#[test]
fn a_page_written_since_its_merge_reads_zeros_once_given_back() {
    // A page merged, then copied on write (still in the pool VMA, the
    // engine not told yet): MADV_DONTNEED there would show the pool page.
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, b) = merged_pair(&e, 8, 1000);
    a.fill(2, 99);
    let en = a.entry(&pm, 2);
    assert!(
        en.present() && !en.file(),
        "a's page 2 was not copied on write"
    );
    // SAFETY: a's pages are expected to read zeros from here on.
    assert_eq!(unsafe { e.discard(a.addr, 8 * PS) }.unwrap(), 8);
    for i in 0..8 {
        assert_eq!(a.read(i), pattern(0), "a's page {i}");
        assert_eq!(b.read(i), pattern(1000 + i as u64), "b's page {i}");
    }
    // The write broke a share the engine had not noticed: its reference
    // went with the discard, and the visit finds nothing to drop twice.
    e.scan_now(2);
    let s = e.stats();
    assert_eq!(
        (s.pages_sharing, s.pool_pages, s.cow_breaks),
        (0, 8, 0),
        "{s:?}"
    );
    e.check_consistency().unwrap();
}

#[test]
fn a_hardened_groups_freed_slots_wait_for_the_scanner() {
    // Freeing a slot (a hole punch) in the discard would make it take
    // longer exactly when the page was its slot's last mapper, which a
    // hardened guest must not learn (docs/security.md). A driven core (no
    // engine thread): an engine's own wake-up between the discard and the
    // check would free the slots as it should, and hide a discard that
    // freed them itself.
    let (a, b) = (Mem::new(8), Mem::new(8));
    a.fill_from(1000);
    b.fill_from(1000);
    let mut core = driven_core();
    for (m, owner) in [(&a, "a"), (&b, "b")] {
        // SAFETY: `a` and `b` are private anonymous mappings declared before
        // the core, so they stay mapped for as long as the core lives.
        unsafe { core.register_in(m.addr, 8 * PS, owner.into(), "h".into(), Security::Hardened) }
            .unwrap();
    }
    core.run_passes(4);
    let s = core.stats();
    assert!(s.pool_pages > 0 && s.pages_sharing > 0, "{s:?}");
    // SAFETY: both regions are expected to read zeros from here on.
    unsafe {
        assert_eq!(core.discard(a.addr, 8 * PS).unwrap(), 8);
        assert_eq!(core.discard(b.addr, 8 * PS).unwrap(), 8);
    }
    assert!((0..8).all(|i| a.read(i) == pattern(0) && b.read(i) == pattern(0)));
    let after = core.stats();
    assert_eq!(after.pages_sharing, 0, "{after:?}");
    assert_eq!(
        after.pool_pages, s.pool_pages,
        "a slot was freed in the discard"
    );
    core.check_consistency().unwrap();
    // The scanner's next wake-up (a pass begins as one does) frees them.
    core.run_passes(1);
    assert_eq!(core.stats().pool_pages, 0, "{:?}", core.stats());
    core.check_consistency().unwrap();
}

#[test]
fn a_range_outside_the_registered_regions_is_refused() {
    let e = engine(256);
    let a = Mem::new(8);
    a.fill_all(3);
    a.register(&e, "a", "g");
    // SAFETY: nothing is given back (each call is refused).
    unsafe {
        assert!(e.discard(a.addr + 4 * PS, 8 * PS).is_err(), "past the end");
        assert!(e.discard(a.addr + 1, PS).is_err(), "not page aligned");
        assert!(e.discard(a.addr, 0).is_err(), "empty");
    }
    assert!((0..8).all(|i| a.read(i) == pattern(3)));
}

#[test]
fn the_ksm_backend_gives_pages_back_with_madv_dontneed() {
    // Registering with the KSM backend only marks the range mergeable;
    // giving it back changes no KSM knob (checked). The backend reads the
    // knobs' journal at its start: serialised with every other KSM user.
    let _ksm = pagefold_dedup::ksm::ksm_exclusive().unwrap();
    let root = std::path::Path::new(pagefold_dedup::ksm::KSM_SYSFS);
    let before = pagefold_dedup::ksm::snapshot_tunables(root);
    let k = KsmBackend::new().unwrap();
    let pm = Pagemap::open().unwrap();
    let a = Mem::new(16);
    a.fill_all(9);
    // SAFETY: a stays mapped until after the unregister below.
    let id = unsafe { k.register(a.spec("a", "g")) }.unwrap();
    // SAFETY: a's pages 4..12 are expected to read zeros from here on.
    assert_eq!(unsafe { k.discard(a.addr + 4 * PS, 8 * PS) }.unwrap(), 8);
    for i in 0..16 {
        let given = (4..12).contains(&i);
        assert_eq!(a.entry(&pm, i).present(), !given, "page {i}");
        assert_eq!(a.read(i), pattern(if given { 0 } else { 9 }), "page {i}");
    }
    let s = k.stats();
    assert_eq!(s.pages_reported, 8);
    assert_eq!(s.per_owner["a"].pages_reported, 8);
    assert_eq!(s.per_owner["a"].pages_returned, None);
    // SAFETY: outside the region.
    assert!(unsafe { k.discard(a.addr + 12 * PS, 8 * PS) }.is_err());
    k.unregister(id).unwrap();
    k.shutdown();
    assert_eq!(pagefold_dedup::ksm::snapshot_tunables(root), before);
}
