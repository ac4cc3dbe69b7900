//! A region that leaves while its unmerge fails keeps its pages' content.
//! In a test binary of its own: it lowers the process's address-space
//! limit (RLIMIT_AS) for a moment, which would fail other tests' mappings.

mod common;

use common::*;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::DedupBackend;

/// The process's virtual size, from /proc/self/status (`VmSize`, kB).
fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

fn set_as_limit(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass; it changes only this
    // process's limit.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_region_leaving_after_a_failed_unmerge_keeps_its_pages() {
    // `unregister` unmerges the region first; the owner goes on using the
    // memory. When that unmerge fails (here: its copy area cannot be
    // mapped), the pages still map their pool slots, so the slots must
    // stay allocated: freed and punched, they would read zeros, and once
    // reused another page's content (docs/merge-races.md §14).
    let e = engine(256);
    let pm = Pagemap::open().unwrap();
    let (a, id) = merged_three_patterns(&e);
    let in_pool = (0..THREE_PATTERN_PAGES)
        .filter(|&i| {
            let en = a.entry(&pm, i);
            !en.present() || en.file()
        })
        .count();
    assert!(in_pool > 150, "{in_pool} pages map pool slots");

    // No room for the unmerge's 768 KiB copy area.
    set_as_limit(vm_size() + 64 * 1024);
    let res = e.unregister(id);
    set_as_limit(libc::RLIM_INFINITY);
    res.unwrap();

    for i in 0..THREE_PATTERN_PAGES {
        assert_eq!(a.read(i), pattern(three_pattern(i)), "page {i}");
    }
    assert!(
        e.stats().pool_pages > 0,
        "the slots the pages still map were freed: {:?}",
        e.stats()
    );
    e.check_consistency().unwrap();
}
