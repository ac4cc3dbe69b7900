//! `Engine::check_consistency`, which every engine test leans on, holds
//! the books to what the host kernel's page tables show (what the
//! Linux-guest tests' audit counts): a page merged in the books that a
//! mapping behind the engine's back took out of the pool, or a page the
//! books count as its own that reads a pool page, is reported.

mod common;

use common::*;
use std::os::fd::AsRawFd;

use pagefold_dedup::{mm, DedupBackend};

#[test]
fn a_merged_page_mapped_over_behind_the_engines_back_is_reported() {
    let e = engine(256);
    let (a, _b) = merged_pair(&e, 16, 500);
    e.check_consistency().unwrap();
    // SAFETY: a's page 3 lies in a's mapping; its content is the test's
    // (it reads zeros afterwards, which nothing checks).
    let p = unsafe {
        libc::mmap(
            (a.addr + 3 * PS) as *mut libc::c_void,
            PS,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p as usize, a.addr + 3 * PS);
    let err = e.check_consistency().unwrap_err();
    assert!(
        err.contains("page 3 ") && err.contains("outside the pool VMAs"),
        "{err}"
    );
}

#[test]
fn a_page_its_books_call_its_own_that_reads_the_pool_is_reported() {
    let e = engine(256);
    let (_a, b) = merged_pair(&e, 16, 500);
    e.check_consistency().unwrap();
    // A third region of unique pages: none of them merges.
    let c = Mem::new(4);
    c.fill_from(9000);
    c.register(&e, "c", "g");
    e.scan_now(2);
    assert_eq!(e.stats().per_owner["c"].pages_merged, 0);
    e.check_consistency().unwrap();
    // c's page 0 made to map b's page 5's pool page too, through the pool
    // VMA's file (root: /proc/self/map_files): the pool page has one more
    // mapper than the books know.
    let (start, end, line) = mappings_in(b.addr + 5 * PS, PS)
        .into_iter()
        .next()
        .expect("b's page 5's mapping");
    assert!(line.contains("pagefold-pool"), "{line}");
    let off = line.split_whitespace().nth(2).unwrap();
    let offset = u64::from_str_radix(off, 16).unwrap() + (b.addr + 5 * PS - start) as u64;
    let pool = std::fs::File::open(format!("/proc/self/map_files/{start:x}-{end:x}"))
        .expect("open the pool through map_files (root)");
    // SAFETY: c's page 0 lies in c's mapping; what it reads from here on
    // is the test's business (nothing checks it).
    unsafe { mm::map_pool_fixed(c.addr, PS, pool.as_raw_fd(), offset) }.unwrap();
    let err = e.check_consistency().unwrap_err();
    assert!(
        err.contains("page 0 ") && err.contains("which its books do not count"),
        "{err}"
    );
}
