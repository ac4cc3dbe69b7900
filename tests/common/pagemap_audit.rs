//! The host kernel's view of what a pagefold process has merged, read from
//! its `/proc/<pid>/maps` and `/proc/<pid>/pagemap` (root: pagemap shows
//! frame numbers only to CAP_SYS_ADMIN), to check the engine's own figures
//! against. Nothing here asks the engine.
//!
//! * Pool pages: the engine maps pool pages into guest RAM as private
//!   (`MAP_PRIVATE`) mappings of its pool memfd, so a guest page that
//!   shares pool page `s` lies in such a VMA at file offset `s * 4096` and
//!   is either not yet faulted in or present and file-backed; a present
//!   anonymous page there is the guest's copy-on-write copy and shares
//!   nothing. The pool's own mapping of the memfd is `MAP_SHARED` and is
//!   not guest memory.
//! * KSM's pages (the assist): an anonymous frame that two pages of the
//!   process map. Without fork, only KSM (or the zero page, left out) puts
//!   one frame under two anonymous pages of one process.
//!
//! Zero pages are not audited: a page the engine dropped and a guest page
//! never touched look the same to pagemap.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use pagefold_dedup::pagemap::{PM_FILE, PM_PFN_MASK, PM_PRESENT};

const PAGE: u64 = 4096;
/// The pool memfd's name (dedup/src/pool.rs) as `/proc/<pid>/maps` shows it.
const POOL_PATH: &str = "/memfd:pagefold-pool";

/// What the kernel's page tables say is shared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audit {
    /// Pool pages that at least one guest page maps.
    pub pool_mapped: u64,
    /// Pool pages that two or more guest pages map.
    pub pool_shared: u64,
    /// Sum over pool pages of (guest pages mapping it - 1).
    pub pool_sharing: u64,
    /// Present anonymous pages inside pool VMAs: copies made on write.
    pub cow_copies: u64,
    /// Anonymous frames mapped by two or more pages (KSM's), copies made
    /// on write inside pool VMAs included: in a region handed to KSM,
    /// KSM merges those too.
    pub ksm_shared: u64,
    /// Sum over those frames of (pages mapping it - 1).
    pub ksm_sharing: u64,
}

impl Audit {
    /// Pages saved, as the engine's `pages_sharing` counts them.
    pub fn pages_sharing(&self) -> u64 {
        self.pool_sharing + self.ksm_sharing
    }

    /// Frames shared, as the engine's `pages_shared` counts them.
    pub fn pages_shared(&self) -> u64 {
        self.pool_shared + self.ksm_shared
    }
}

/// One line of `/proc/<pid>/maps`.
#[derive(Debug, PartialEq, Eq)]
struct Vma {
    start: u64,
    end: u64,
    private: bool,
    offset: u64,
    inode: u64,
    path: String,
}

impl Vma {
    /// A private mapping of the engine's pool memfd: merged guest pages.
    fn is_pool(&self) -> bool {
        self.private && self.path.starts_with(POOL_PATH)
    }

    /// A mapping of guest RAM's kind: private anonymous memory, or a pool
    /// VMA the engine mapped into it.
    fn is_guest_ram(&self) -> bool {
        self.private && (self.path.is_empty() || self.is_pool())
    }
}

fn parse_maps(text: &str) -> Vec<Vma> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (_dev, inode) = (f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            let (s, e) = range.split_once('-')?;
            Some(Vma {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                private: perms.as_bytes().get(3) == Some(&b'p'),
                offset: u64::from_str_radix(offset, 16).ok()?,
                inode: inode.parse().ok()?,
                path,
            })
        })
        .collect()
}

/// The pagemap entries of the pages in `range` (page-aligned addresses).
fn entries(pagemap: &File, range: Range<u64>) -> Vec<u64> {
    let n = ((range.end - range.start) / PAGE) as usize;
    let mut buf = vec![0u8; n * 8];
    pagemap
        .read_exact_at(&mut buf, range.start / PAGE * 8)
        .unwrap_or_else(|e| panic!("pagemap at {:#x}: {e}", range.start));
    buf.chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}

/// Audits process `pid` now. `zero_pfn` is the zero page's frame
/// (`common::dedup::zero_pfn`).
pub fn audit(pid: u32, zero_pfn: u64) -> Audit {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let pagemap = File::open(format!("/proc/{pid}/pagemap")).expect("open pagemap");
    // Keyed by (memfd inode, page offset): one pool per engine.
    let mut pool: HashMap<(u64, u64), u64> = HashMap::new();
    let mut anon: HashMap<u64, u64> = HashMap::new();
    let mut a = Audit::default();
    // Files, heap, stack, vdso: not guest memory.
    for v in parse_maps(&maps).iter().filter(|v| v.is_guest_ram()) {
        let pool_vma = v.is_pool();
        for (i, e) in entries(&pagemap, v.start..v.end).into_iter().enumerate() {
            let present = e & PM_PRESENT != 0;
            let file = e & PM_FILE != 0;
            // A private anonymous page: a guest page of its own, or (in a
            // pool VMA) a copy made on write.
            let private_anon = present && !file;
            if pool_vma && !private_anon {
                *pool
                    .entry((v.inode, v.offset / PAGE + i as u64))
                    .or_default() += 1;
            } else if private_anon {
                a.cow_copies += u64::from(pool_vma);
                let pfn = e & PM_PFN_MASK;
                assert!(pfn != 0, "pagemap hides frame numbers: run as root");
                if pfn != zero_pfn {
                    *anon.entry(pfn).or_default() += 1;
                }
            }
        }
    }
    a.pool_mapped = pool.len() as u64;
    for &m in pool.values() {
        a.pool_shared += u64::from(m >= 2);
        a.pool_sharing += m - 1;
    }
    for &m in anon.values().filter(|&&m| m >= 2) {
        a.ksm_shared += 1;
        a.ksm_sharing += m - 1;
    }
    a
}

/// Pages of guest RAM's kind (private anonymous mappings and pool VMAs)
/// of process `pid`: (present, absent). Present counts frames the process
/// holds (the zero page left out, a pool page once per mapping); absent
/// counts pages with no frame, which is what memory given back is (and
/// memory never touched, heaps' and stacks' reserves: a small, steady
/// share beside guest RAM).
pub fn guest_pages(pid: u32, zero_pfn: u64) -> (u64, u64) {
    guest_pages_in(pid, zero_pfn, 0..u64::MAX)
}

/// [`guest_pages`] within the addresses `range` only: one VM's RAM
/// ([`new_anon_range`]), pool VMAs the engine mapped into it included.
pub fn guest_pages_in(pid: u32, zero_pfn: u64, range: Range<u64>) -> (u64, u64) {
    let (mut present, mut absent) = (0, 0);
    for_each_entry_in(pid, range, Vma::is_guest_ram, |e| {
        if e & PM_PRESENT != 0 && e & PM_PFN_MASK != zero_pfn {
            present += 1;
        } else {
            absent += 1;
        }
    });
    (present, absent)
}

/// Calls `f` with the pagemap entry of each page of process `pid` within
/// `range` that lies in a VMA `keep` accepts.
fn for_each_entry_in(
    pid: u32,
    range: Range<u64>,
    keep: impl Fn(&Vma) -> bool,
    mut f: impl FnMut(u64),
) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let pagemap = File::open(format!("/proc/{pid}/pagemap")).expect("open pagemap");
    for v in parse_maps(&maps).iter().filter(|v| keep(v)) {
        let (start, end) = (v.start.max(range.start), v.end.min(range.end));
        if start < end {
            entries(&pagemap, start..end).into_iter().for_each(&mut f);
        }
    }
}

/// Pages of process `pid` within `range` (one VM's RAM) that lie in pool
/// VMAs and are not the guest's own copies made on write: the pages the
/// kernel shows merged there, as the engine's per-VM `pages_merged`
/// counts them (KSM's merges left out).
pub fn pool_pages_in(pid: u32, range: Range<u64>) -> u64 {
    let mut n = 0;
    for_each_entry_in(pid, range, Vma::is_pool, |e| {
        let own_copy = e & PM_PRESENT != 0 && e & PM_FILE == 0;
        n += u64::from(!own_copy);
    });
    n
}

/// The guest RAM a VM created between two reads of a process's
/// `/proc/<pid>/maps` brought: the longest stretch of guest RAM's kind
/// (private anonymous memory and pool VMAs) in `after` that nothing in
/// `before` mapped, if at least `len` bytes long. A VM's RAM is one
/// anonymous mapping when it is created, and the engine may have merged
/// some of its pages (the loaded kernel's, the initrd's) into pool VMAs
/// by the second read; new thread stacks and heap are far smaller.
pub fn new_anon_range(before: &str, after: &str, len: u64) -> Option<Range<u64>> {
    let old = parse_maps(before);
    let mut pieces: Vec<Range<u64>> = Vec::new();
    for v in parse_maps(after).iter().filter(|v| v.is_guest_ram()) {
        // `v` minus every old mapping it overlaps (maps are sorted).
        let mut at = v.start;
        for o in old.iter().filter(|o| o.start < v.end && o.end > v.start) {
            if o.start > at {
                pieces.push(at..o.start);
            }
            at = at.max(o.end);
        }
        if at < v.end {
            pieces.push(at..v.end);
        }
    }
    // Adjacent pieces (a VMA split by flags) are one stretch.
    let mut stretches: Vec<Range<u64>> = Vec::new();
    for p in pieces {
        match stretches.last_mut() {
            Some(l) if l.end == p.start => l.end = p.end,
            _ => stretches.push(p),
        }
    }
    stretches
        .into_iter()
        .filter(|r| r.end - r.start >= len)
        .max_by_key(|r| r.end - r.start)
}

/// The backend's figures the audit checks. The kernel-KSM backend reports
/// KSM's system-wide `pages_sharing` only (its `pages_shared` counts KSM
/// pages a copy-on-write left with one mapper until ksmd looks again; it
/// has no pool): the others are None there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub pages_sharing: u64,
    pub pages_shared: Option<u64>,
    pub pool_pages: Option<u64>,
}

impl Claimed {
    /// Whether the kernel shows exactly what the backend claims.
    pub fn agrees(&self, a: &Audit) -> bool {
        // The engine's KSM share comes from its census, its own share from
        // its books: both must match the page tables. Its pool pages are
        // the pool pages some guest page maps (a page whose partners all
        // copied on write keeps its slot until that last mapper goes).
        self.pages_sharing == a.pages_sharing()
            && self.pages_shared.is_none_or(|n| n == a.pages_shared())
            && self.pool_pages.is_none_or(|n| n == a.pool_mapped)
    }
}

/// Waits (up to `limit`) for a quiet moment at which the engine's figures
/// (`claimed()`, read before and after the audit and unchanged) agree
/// exactly with the page tables of process `pid`; returns both, or panics
/// with the last pair seen. The engine notices a copy-on-write break at
/// its next visit of the page and KSM's merges at its next census, so
/// they may differ for a moment while guests write or KSM merges.
pub fn wait_agreement(
    what: &str,
    pid: u32,
    claimed: impl FnMut() -> Claimed,
    limit: std::time::Duration,
) -> (Claimed, Audit) {
    wait_agreement_or_report(what, pid, claimed, limit, String::new)
}

/// [`wait_agreement`], with `report`'s text added to the failure: what
/// the caller knows that narrows a disagreement down (per VM figures).
pub fn wait_agreement_or_report(
    what: &str,
    pid: u32,
    mut claimed: impl FnMut() -> Claimed,
    limit: std::time::Duration,
    report: impl FnOnce() -> String,
) -> (Claimed, Audit) {
    let zero_pfn = super::dedup::zero_pfn();
    let start = std::time::Instant::now();
    loop {
        let before = claimed();
        let a = audit(pid, zero_pfn);
        let after = claimed();
        if before == after && before.agrees(&a) {
            eprintln!("{what}: the page tables agree with the engine: {a:?}");
            return (after, a);
        }
        if start.elapsed() >= limit {
            panic!(
                "{what}: the engine's figures never agreed with the page tables within {limit:?}: \
                 engine {after:?}, kernel {a:?}{}",
                report()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walks count this process's own pages: written ones present,
    /// the others absent, and none in a pool VMA.
    #[test]
    fn the_walks_count_a_mappings_written_and_untouched_pages() {
        const N: usize = 16;
        let len = N * PAGE as usize;
        let base = pagefold_dedup::mm::map_anon(len).expect("map") as usize;
        for p in [0, 3, 4, 9, 15] {
            // SAFETY: page `p` of the test's own private mapping.
            unsafe { *((base + p * PAGE as usize) as *mut u8) = 1 };
        }
        let (b, e) = (base as u64, (base + len) as u64);
        let pid = std::process::id();
        let zero = super::super::dedup::zero_pfn();
        assert_eq!(guest_pages_in(pid, zero, b..e), (5, 11));
        // Half the range: pages 0, 3 and 4 of the first eight.
        assert_eq!(guest_pages_in(pid, zero, b..b + 8 * PAGE), (3, 5));
        assert_eq!(pool_pages_in(pid, b..e), 0);
        // SAFETY: the test's own mapping, no longer used.
        unsafe { pagefold_dedup::mm::unmap(base as *mut u8, len) };
    }

    #[test]
    fn parses_maps_lines_with_and_without_paths() {
        let v = parse_maps(
            "7f00a0000000-7f00a0002000 rw-p 00003000 00:01 77 /memfd:pagefold-pool (deleted)\n\
             7f00b0000000-7f00b0100000 rw-s 00000000 00:01 77 /memfd:pagefold-pool (deleted)\n\
             7f00c0000000-7f00c0200000 rw-p 00000000 00:00 0 \n",
        );
        assert_eq!(v.len(), 3);
        assert_eq!(
            (v[0].start, v[0].end, v[0].offset),
            (0x7f00a0000000, 0x7f00a0002000, 0x3000)
        );
        assert!(v[0].private && v[0].path.starts_with(POOL_PATH));
        assert_eq!(v[0].inode, 77);
        assert!(!v[1].private);
        assert!(v[2].private && v[2].path.is_empty());
    }

    #[test]
    fn a_new_vms_ram_is_the_longest_new_anonymous_stretch() {
        let before = "7f0000000000-7f0000100000 rw-p 00000000 00:00 0 \n\
                      7f0100000000-7f0100001000 rw-p 00000000 00:01 9 /memfd:pagefold-pool\n";
        // The new RAM merged with the old anonymous VMA below it and was
        // split by flags; a new stack and a shared mapping came too.
        let after = "7eff00000000-7eff00800000 rw-p 00000000 00:00 0 \n\
                     7f0000000000-7f0008000000 rw-p 00000000 00:00 0 \n\
                     7f0008000000-7f0010000000 rw-p 00000000 00:00 0 \n\
                     7f0100000000-7f0100001000 rw-p 00000000 00:01 9 /memfd:pagefold-pool\n\
                     7f0200000000-7f0220000000 rw-s 00000000 00:01 8 /memfd:other\n";
        assert_eq!(
            new_anon_range(before, after, 64 << 20),
            Some(0x7f0000100000..0x7f0010000000)
        );
        assert_eq!(new_anon_range(before, after, 1 << 30), None);
        assert_eq!(new_anon_range(after, after, 0), None);
    }

    #[test]
    fn a_new_vms_ram_takes_in_the_pool_vmas_merges_put_in_it() {
        let before = "7f0100000000-7f0100001000 rw-p 00000000 00:01 9 /memfd:pagefold-pool\n";
        // 128 MiB of RAM with four pages about its middle merged by the
        // second read: three VMAs, none of them 64 MiB long alone.
        let after = "7f0000000000-7f0003ffe000 rw-p 00000000 00:00 0 \n\
                     7f0003ffe000-7f0004002000 rw-p 00005000 00:01 9 /memfd:pagefold-pool\n\
                     7f0004002000-7f0008000000 rw-p 00000000 00:00 0 \n\
                     7f0100000000-7f0100001000 rw-p 00000000 00:01 9 /memfd:pagefold-pool\n";
        assert_eq!(
            new_anon_range(before, after, 64 << 20),
            Some(0x7f0000000000..0x7f0008000000)
        );
    }
}
