//! Helpers shared by the integration tests: anonymous regions, page
//! patterns, pagemap PFNs.
#![allow(dead_code)]

use pagefold_dedup::mm;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::{DedupBackend, Engine, EngineConfig, Knobs, RegionId, RegionSpec, Security};

pub const PS: usize = 4096;

/// A private anonymous mapping (what vm-memory gives the VMM for guest RAM).
pub struct Mem {
    pub addr: usize,
    pub pages: usize,
}

impl Mem {
    pub fn new(pages: usize) -> Mem {
        let p = mm::map_anon(pages * PS).expect("mmap");
        // SAFETY: our fresh mapping of `pages` pages; MADV_NOHUGEPAGE
        // changes no content.
        unsafe { mm::madvise(p as usize, pages * PS, libc::MADV_NOHUGEPAGE) }.expect("madvise");
        Mem {
            addr: p as usize,
            pages,
        }
    }

    /// A mapping of `pages` pages (a multiple of 512) aligned to 2 MiB
    /// and advised `MADV_HUGEPAGE`, so that the kernel backs it with
    /// transparent huge pages as far as it can: what guest RAM is on a host
    /// whose THP setting is `always` (Debian's kernels), or wherever the VMM
    /// asks for huge pages.
    pub fn new_thp(pages: usize) -> Mem {
        const HUGE: usize = 2 << 20;
        assert_eq!(pages * PS % HUGE, 0, "whole huge pages only");
        let len = pages * PS;
        let p = mm::map_anon(len + HUGE).expect("mmap") as usize;
        let start = (p + HUGE - 1) & !(HUGE - 1);
        // SAFETY: the unaligned head and tail of our own fresh mapping,
        // which nothing uses.
        unsafe {
            if start > p {
                mm::unmap(p as *mut u8, start - p);
            }
            let end = p + len + HUGE;
            if end > start + len {
                mm::unmap((start + len) as *mut u8, end - start - len);
            }
        }
        // SAFETY: our fresh mapping; MADV_HUGEPAGE changes no content.
        unsafe { mm::madvise(start, len, libc::MADV_HUGEPAGE) }.expect("madvise");
        Mem { addr: start, pages }
    }

    /// Bytes of this mapping that transparent huge pages back
    /// (`AnonHugePages` of its line in /proc/self/smaps).
    pub fn huge_bytes(&self) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read smaps");
        let mut inside = false;
        let mut total = 0;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a < self.addr + self.pages * PS && self.addr < b;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    let kb = kb.trim().trim_end_matches("kB").trim();
                    total += kb.parse::<usize>().unwrap_or(0) * 1024;
                }
            }
        }
        total
    }

    /// A mapping at exactly `addr` (which must be free), as the kernel
    /// hands out a freed range again to the next VM's RAM.
    pub fn new_at(addr: usize, pages: usize) -> Mem {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; it
        // fails instead, and the result is checked.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                pages * PS,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(p as usize, addr, "could not map at {addr:#x}");
        // SAFETY: the mapping just made at `addr`; MADV_NOHUGEPAGE changes
        // no content.
        unsafe { mm::madvise(addr, pages * PS, libc::MADV_NOHUGEPAGE) }.expect("madvise");
        Mem { addr, pages }
    }

    pub fn page_ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.pages);
        (self.addr + i * PS) as *mut u8
    }

    /// Fills page i with the pattern of `v`.
    pub fn fill(&self, i: usize, v: u64) {
        let buf = pattern(v);
        // SAFETY: page i is inside our mapping.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.page_ptr(i), PS) };
    }

    /// Fills every page with the pattern of `v` (one content throughout).
    pub fn fill_all(&self, v: u64) {
        for i in 0..self.pages {
            self.fill(i, v);
        }
    }

    /// Fills every page i with the pattern of `base + i` (distinct pages;
    /// two regions filled from one base are identical page by page).
    pub fn fill_from(&self, base: u64) {
        for i in 0..self.pages {
            self.fill(i, base + i as u64);
        }
    }

    pub fn read(&self, i: usize) -> Vec<u8> {
        let mut v = vec![0u8; PS];
        // SAFETY: page i is inside our mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.page_ptr(i), v.as_mut_ptr(), PS) };
        v
    }

    pub fn spec(&self, owner: &str, group: &str) -> RegionSpec {
        RegionSpec {
            host_addr: self.addr,
            len: self.pages * PS,
            owner: owner.into(),
            group: group.into(),
            security: Default::default(),
        }
    }

    /// Registers with the engine.
    pub fn register(&self, e: &Engine, owner: &str, group: &str) -> RegionId {
        self.register_as(e, owner, group, Security::Default)
    }

    /// Registers with the engine into a group of the given security.
    pub fn register_as(
        &self,
        e: &Engine,
        owner: &str,
        group: &str,
        security: Security,
    ) -> RegionId {
        let spec = RegionSpec {
            security,
            ..self.spec(owner, group)
        };
        // SAFETY: the mapping outlives the registration in every test (tests
        // unregister before dropping Mem, or drop the engine first).
        unsafe { e.register(spec).unwrap() }
    }

    /// PFN of page i after touching it (read), 0 if hidden.
    pub fn pfn(&self, pm: &Pagemap, i: usize) -> u64 {
        // SAFETY: inside our mapping.
        let _ = unsafe { std::ptr::read_volatile(self.page_ptr(i)) };
        pm.entry(self.addr + i * PS).unwrap().pfn()
    }

    pub fn entry(&self, pm: &Pagemap, i: usize) -> pagefold_dedup::pagemap::Entry {
        pm.entry(self.addr + i * PS).unwrap()
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: exactly our mapping; no engine has it registered any more
        // (see `register`), and Mem hands out no reference into it.
        unsafe { mm::unmap(self.addr as *mut u8, self.pages * PS) };
    }
}

/// The content for value `v`: 0 is the zero page; otherwise a non-zero page
/// whose words depend only on `v`.
pub fn pattern(v: u64) -> Vec<u8> {
    let mut b = vec![0u8; PS];
    if v != 0 {
        for (k, w) in b.chunks_mut(8).enumerate() {
            let x = v.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (k as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
                | 1;
            w.copy_from_slice(&x.to_le_bytes());
        }
    }
    b
}

/// This process's mappings from /proc/self/maps: start, end and the
/// whole line (flags, offset, name).
pub fn mappings() -> Vec<(usize, usize, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter_map(|l| {
            let (range, _) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
                l.to_string(),
            ))
        })
        .collect()
}

/// This process's mappings that overlap `addr..addr + len`.
pub fn mappings_in(addr: usize, len: usize) -> Vec<(usize, usize, String)> {
    mappings()
        .into_iter()
        .filter(|&(a, b, _)| a < addr + len && addr < b)
        .collect()
}

/// VMAs of this process that overlap `addr..addr + len`, from
/// /proc/self/maps (what `vm.max_map_count` counts).
pub fn vmas_in(addr: usize, len: usize) -> usize {
    mappings_in(addr, len).len()
}

/// Polls `done` every `every` until it holds; how long that took, or None
/// after `limit`.
pub fn wait_until(
    limit: std::time::Duration,
    every: std::time::Duration,
    mut done: impl FnMut() -> bool,
) -> Option<std::time::Duration> {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if done() {
            return Some(t.elapsed());
        }
        std::thread::sleep(every);
    }
    None
}

/// A seeded random permutation of `0..n` (xorshift Fisher-Yates): where
/// scattered layouts put page i.
pub fn permutation(n: usize, mut x: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.swap(i, (x % (i as u64 + 1)) as usize);
    }
    p
}

/// Two regions of `n` distinct pages where B holds A's pages in a seeded
/// random order (page i of A is page `perm[i]` of B): the worst scattered
/// layout. Returns the permutation too.
pub fn scattered_pair(n: usize) -> (Mem, Mem, Vec<usize>) {
    let (a, b) = (Mem::new(n), Mem::new(n));
    let perm = permutation(n, 0x9E37_79B9_7F4A_7C15);
    for (i, &j) in perm.iter().enumerate() {
        a.fill(i, i as u64 + 1);
        b.fill(j, i as u64 + 1);
    }
    (a, b, perm)
}

/// Pages of [`merged_three_patterns`]'s region.
pub const THREE_PATTERN_PAGES: usize = 192;

/// The pattern value of page `i` of [`merged_three_patterns`]'s region.
pub fn three_pattern(i: usize) -> u64 {
    1 + (i as u64 % 3)
}

/// A region of [`THREE_PATTERN_PAGES`] pages holding three contents in
/// turn ([`three_pattern`]), registered as owner "a" in group "g" and
/// merged by two driven passes: over 150 of its pages share. The tests
/// of the unmerge and removal paths start from it.
pub fn merged_three_patterns(e: &Engine) -> (Mem, RegionId) {
    let a = Mem::new(THREE_PATTERN_PAGES);
    for i in 0..THREE_PATTERN_PAGES {
        a.fill(i, three_pattern(i));
    }
    let id = a.register(e, "a", "g");
    e.scan_now(2);
    assert!(e.stats().pages_sharing > 150, "{:?}", e.stats());
    (a, id)
}

/// Engine with fast knobs for tests.
pub fn engine(max_sharing: u64) -> Engine {
    Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 1 << 16,
            sleep_millisecs: 0,
            max_page_sharing: max_sharing,
        },
        ..EngineConfig::default()
    })
    .unwrap()
}

/// A scanner core with no engine thread (the test drives its passes) and
/// no regions: max effort, `max_page_sharing` 256, xxh3.
pub fn driven_core() -> pagefold_dedup::testing::Core {
    pagefold_dedup::testing::Core::driven(1 << 30).unwrap()
}

/// A quiescer that stops at once and counts its requests and releases.
#[derive(Default)]
pub struct CountingQuiescer {
    pub requests: std::sync::atomic::AtomicUsize,
    pub releases: std::sync::atomic::AtomicUsize,
    pub held: std::sync::atomic::AtomicUsize,
}

impl pagefold_dedup::Quiesce for CountingQuiescer {
    fn request(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.requests.fetch_add(1, SeqCst);
        self.held.fetch_add(1, SeqCst);
    }
    fn stopped(&self) -> bool {
        true
    }
    fn release(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.releases.fetch_add(1, SeqCst);
        self.held.fetch_sub(1, SeqCst);
    }
}

/// A liveness bound, stretched where everything runs slower: times the
/// factor in `PAGEFOLD_TEST_TIME_SCALE` (default 1). The bound catches an
/// engine that never finishes, it does not time one; under the emulated
/// host (QEMU TCG), where the same work takes 5-10 times longer and its
/// speed varies twofold from run to run, scripts/engine-suite-on-kernel.sh
/// sets the factor.
#[allow(dead_code)]
pub fn liveness_bound(native: std::time::Duration) -> std::time::Duration {
    native * time_scale()
}

/// How many times slower than native this run's machine does the same
/// work: `PAGEFOLD_TEST_TIME_SCALE`, at least 1 (default 1).
#[allow(dead_code)]
pub fn time_scale() -> u32 {
    std::env::var("PAGEFOLD_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&f| f >= 1)
        .unwrap_or(1)
}

/// Two regions of `n` pages, page i of each the pattern of `base + i`,
/// registered as owners "a" and "b" of group "g" and merged pairwise:
/// every page of b shares a's, each pair on a pool page of its own.
pub fn merged_pair(e: &Engine, n: usize, base: u64) -> (Mem, Mem) {
    let (a, b) = (Mem::new(n), Mem::new(n));
    a.fill_from(base);
    b.fill_from(base);
    a.register(e, "a", "g");
    b.register(e, "b", "g");
    e.scan_now(3);
    let s = e.stats();
    assert_eq!(
        (s.pages_sharing, s.pool_pages),
        (n as u64, n as u64),
        "{s:?}"
    );
    (a, b)
}
