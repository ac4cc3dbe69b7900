//! The benchmark's memory: private anonymous regions filled with one of
//! the 2022 auto-mode test's shapes, or with the `scattered` shape (two
//! regions holding the same distinct pages in different orders).

use std::fmt;
use std::str::FromStr;

use pagefold_dedup::mm;
use serde::Serialize;

use crate::error::BenchError;

pub const PAGE: usize = 4096;
/// 300 MiB, as in the 2022 test.
pub const SEED_REGION_BYTES: usize = 300 << 20;
/// Each of the two `scattered` regions: 512 MiB (131072 pages).
pub const SCATTERED_REGION_BYTES: usize = 512 << 20;
/// Seed of the `scattered` content and permutation (fixed: every run and
/// every system sees the same pages in the same places).
pub const SCATTERED_SEED: u64 = 0x5ca7_7e2e_d000_0001;

/// Content of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Every page memset to 0x01: one content, everything merges.
    Full,
    /// Every page distinct except every 1800th (0xff): almost nothing merges.
    Sparse,
    /// Two regions: A's pages all distinct (like cached file content), B
    /// holds each page of A exactly once, at a seeded random place. Every
    /// page of B merges with its twin in A, but twins that are neighbours
    /// in B are not neighbours in A: a remapping merger cannot keep B's
    /// mappings in few VMAs (`vm.max_map_count`), KSM does not care.
    Scattered,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 3] = [Shape::Full, Shape::Sparse, Shape::Scattered];
    /// The two shapes of the 2022 auto-mode test (the default run).
    pub const TEST_2022: [Shape; 2] = [Shape::Full, Shape::Sparse];

    /// `pages_sharing` a perfect merger settles at (before any
    /// `max_page_sharing` limit): duplicates minus one kept copy per
    /// content. `pages` is the size of one region (`scattered` has two).
    pub fn ideal_sharing(self, pages: usize) -> u64 {
        match self {
            Shape::Full => pages as u64 - 1,
            Shape::Sparse => (pages.div_ceil(1800) - 1) as u64,
            Shape::Scattered => pages as u64,
        }
    }

    /// How many regions of the given size the shape uses.
    pub fn regions(self) -> usize {
        match self {
            Shape::Full | Shape::Sparse => 1,
            Shape::Scattered => 2,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shape::Full => "full",
            Shape::Sparse => "sparse",
            Shape::Scattered => "scattered",
        })
    }
}

impl FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Shape::Full),
            "sparse" => Ok(Shape::Sparse),
            "scattered" => Ok(Shape::Scattered),
            o => Err(format!(
                "unknown shape {o:?} (expected full, sparse or scattered)"
            )),
        }
    }
}

/// A `MAP_PRIVATE|MAP_ANONYMOUS` region, unmapped on drop.
#[derive(Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; the harness only
// writes it from the thread that owns it, before handing it to a backend.
unsafe impl Send for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to whole pages), not yet touched.
    pub fn map(len: usize) -> Result<Self, BenchError> {
        let len = len.div_ceil(PAGE) * PAGE;
        let ptr = mm::map_anon(len).map_err(|source| BenchError::Mmap { len, source })?;
        Ok(Self { ptr, len })
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn pages(&self) -> usize {
        self.len / PAGE
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr..ptr+len is our read-write mapping for self's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: as in bytes_mut; shared borrow.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Writes `shape` exactly as the 2022 test did.
    ///
    /// `sparse`: on the fresh (zero) region, for each page i >= 1, with j
    /// counting up from 0 (one step per page), `ptr[i*4096 + j%4096] =
    /// j%127 + 1`: every page gets one non-zero byte at a different
    /// (offset, value) pair, so no two are equal (76800 pages < 4096 x 127
    /// combinations). Then every 1800th page (0, 1800, ...) is memset to
    /// 0xff: those 43 pages are the only duplicates (1 shared + 42 sharing).
    ///
    /// `scattered` is two regions: this fills one with [`Region::fill_random`];
    /// the other gets [`Region::fill_permuted`].
    pub fn fill(&mut self, shape: Shape) {
        let pages = self.pages();
        match shape {
            Shape::Full => self.bytes_mut().fill(0x01),
            Shape::Scattered => self.fill_random(SCATTERED_SEED),
            Shape::Sparse => {
                let b = self.bytes_mut();
                for (j, i) in (1..pages).enumerate() {
                    b[i * PAGE + (j % PAGE)] = (j % 127 + 1) as u8;
                }
                for i in (0..pages).step_by(1800) {
                    b[i * PAGE..(i + 1) * PAGE].fill(0xff);
                }
            }
        }
    }

    /// Every page full of pseudo-random bytes from `seed`, like file
    /// content in a page cache (a merger cannot tell pages apart by their
    /// first bytes alone). Each page starts with its index, so all pages are
    /// distinct for certain, not just with high probability.
    pub fn fill_random(&mut self, seed: u64) {
        let b = self.bytes_mut();
        for (i, page) in b.chunks_exact_mut(PAGE).enumerate() {
            let mut rng = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            for word in page.chunks_exact_mut(8) {
                word.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            page[..8].copy_from_slice(&(i as u64).to_le_bytes());
        }
    }

    /// Copies `src`'s pages into this region in a seeded random order of
    /// extents of `extent_pages` pages: every extent of `src` lands exactly
    /// once, at a random extent slot (the last extent may be shorter and
    /// stays last). Returns the permutation: slot `j` of this region holds
    /// extent `perm[j]` of `src`.
    ///
    /// # Panics
    /// If the regions differ in size or `extent_pages` is 0.
    pub fn fill_permuted(&mut self, src: &Region, seed: u64, extent_pages: usize) -> Vec<usize> {
        assert_eq!(self.len, src.len, "regions of different sizes");
        assert!(extent_pages > 0, "extent of 0 pages");
        let ext = extent_pages * PAGE;
        let full = self.len / ext;
        let mut perm: Vec<usize> = (0..full).collect();
        let mut rng = SplitMix64::new(seed);
        // Fisher-Yates.
        for i in (1..full).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            perm.swap(i, j);
        }
        if self.len % ext != 0 {
            perm.push(full);
        }
        let from = src.bytes();
        let to = self.bytes_mut();
        for (slot, &e) in perm.iter().enumerate() {
            let len = ext.min(from.len() - e * ext);
            to[slot * ext..slot * ext + len].copy_from_slice(&from[e * ext..e * ext + len]);
        }
        perm
    }

    /// Page `i` of region A equals page `i` of region B, all pages of one
    /// region distinct: the `auto` benchmark's two identical "VMs".
    pub fn fill_distinct(&mut self, seed: u64) {
        let pages = self.pages();
        let b = self.bytes_mut();
        for i in 0..pages {
            let page = &mut b[i * PAGE..(i + 1) * PAGE];
            page[..8].copy_from_slice(&(seed ^ i as u64).to_le_bytes());
            page[8..16].copy_from_slice(&(i as u64).to_le_bytes());
        }
    }
}

/// SplitMix64: a tiny, fast, seeded generator; the content only has to be
/// reproducible and look like data, not be cryptographic.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl Drop for Region {
    /// Frees the memory but keeps the address range taken (an inaccessible,
    /// unreserved mapping in its place), so that no later region of this
    /// process lands there. Kernel KSM keeps a process's rmap items (with
    /// their smart-scan ages) after the memory is gone, until ksmd next
    /// scans the process; a new region at the same address inherits them,
    /// and ksmd then skips its pages for many full scans: measured here,
    /// 8,192 pairs of identical pages merged in KSM's second full scan at a
    /// fresh address and not at all in eight at a reused one (after an
    /// earlier region there had been scanned unique, made unmergeable and
    /// unmapped with KSM stopped, which is what the engine's KSM assist
    /// leaves behind). The baseline's runs must not start with that.
    fn drop(&mut self) {
        // SAFETY: replaces exactly what map() mapped, which nobody else holds
        // (backends were unregistered before the region is dropped), with a
        // fresh PROT_NONE mapping of the same range.
        let r = unsafe {
            libc::mmap(
                self.ptr.cast(),
                self.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            // SAFETY: as above, exactly what map() mapped (the failed mmap
            // left it in place), which nothing uses any more.
            unsafe { mm::unmap(self.ptr, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_dropped_regions_addresses_are_never_handed_out_again() {
        let len = 4 << 20;
        let mut r = Region::map(len).unwrap();
        r.bytes_mut().fill(7);
        let (a, n) = (r.addr(), r.len());
        drop(r);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let held = maps.lines().any(|l| {
            let range = l.split(' ').next().unwrap();
            let (lo, hi) = range.split_once('-').unwrap();
            let (lo, hi) = (
                usize::from_str_radix(lo, 16).unwrap(),
                usize::from_str_radix(hi, 16).unwrap(),
            );
            lo <= a && a + n <= hi && l.split(' ').nth(1) == Some("---p")
        });
        assert!(held, "no inaccessible mapping holds {a:#x}+{n:#x}");
        for _ in 0..4 {
            let r = Region::map(len).unwrap();
            assert!(
                r.addr() + r.len() <= a || r.addr() >= a + n,
                "reused {a:#x}"
            );
        }
    }

    fn distinct_pages(r: &Region) -> usize {
        r.bytes().chunks(PAGE).collect::<HashSet<_>>().len()
    }

    #[test]
    fn full_is_one_content() {
        let mut r = Region::map(64 * PAGE).unwrap();
        r.fill(Shape::Full);
        assert!(r.bytes().iter().all(|&b| b == 1));
        assert_eq!(distinct_pages(&r), 1);
    }

    #[test]
    fn sparse_has_exactly_the_0xff_duplicates() {
        let mut r = Region::map(SEED_REGION_BYTES).unwrap();
        r.fill(Shape::Sparse);
        let pages = r.pages();
        assert_eq!(pages, 76800);
        // 43 pages of 0xff collapse into one content.
        assert_eq!(distinct_pages(&r), pages - 43 + 1);
        assert_eq!(Shape::Sparse.ideal_sharing(pages), 42);
        assert_eq!(Shape::Full.ideal_sharing(pages), 76799);
        assert!(r.bytes()[1800 * PAGE..1801 * PAGE]
            .iter()
            .all(|&b| b == 0xff));
        assert_eq!(r.bytes()[PAGE], 1, "page 1, j = 0: byte 0 = 1");
        assert_eq!(r.bytes()[2 * PAGE + 1], 2, "page 2, j = 1: byte 1 = 2");
    }

    #[test]
    fn scattered_b_holds_each_page_of_a_once_in_a_random_order() {
        let pages = 2048;
        let mut a = Region::map(pages * PAGE).unwrap();
        a.fill(Shape::Scattered);
        assert_eq!(distinct_pages(&a), pages, "A's pages are all distinct");
        // Full pages of data, not a marker in a sea of zeros.
        let zeros = a.bytes()[PAGE..2 * PAGE]
            .iter()
            .filter(|&&b| b == 0)
            .count();
        assert!(zeros < 64, "{zeros} zero bytes in a page");
        let mut b = Region::map(pages * PAGE).unwrap();
        let perm = b.fill_permuted(&a, SCATTERED_SEED, 1);
        let page = |r: &Region, i: usize| r.bytes()[i * PAGE..(i + 1) * PAGE].to_vec();
        // Each page of A exactly once in B, where the permutation says.
        let mut seen = perm.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..pages).collect::<Vec<_>>());
        for j in [0, 1, 777, pages - 1] {
            assert_eq!(page(&b, j), page(&a, perm[j]));
        }
        let in_a: HashSet<Vec<u8>> = (0..pages).map(|i| page(&a, i)).collect();
        assert!((0..pages).all(|j| in_a.contains(&page(&b, j))));
        assert_eq!(distinct_pages(&b), pages);
        // Scattered, not shifted: few neighbours in B are neighbours in A.
        let adjacent = perm.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(adjacent < pages / 100, "{adjacent} pairs stay adjacent");
        assert_eq!(Shape::Scattered.ideal_sharing(pages), pages as u64);
        assert_eq!(Shape::Scattered.regions(), 2);
        // Seeded: the same seed gives the same order, another seed not.
        let mut c = Region::map(pages * PAGE).unwrap();
        assert_eq!(c.fill_permuted(&a, SCATTERED_SEED, 1), perm);
        assert_ne!(c.fill_permuted(&a, 1, 1), perm);
    }

    #[test]
    fn permuted_extents_keep_their_pages_together() {
        let mut a = Region::map(10 * PAGE).unwrap();
        a.fill_random(3);
        let mut b = Region::map(10 * PAGE).unwrap();
        // Extents of 4 pages: 0-3, 4-7, and the short 8-9 stays last.
        let perm = b.fill_permuted(&a, 9, 4);
        assert_eq!(perm.len(), 3);
        assert_eq!(perm[2], 2);
        for (slot, &e) in perm.iter().enumerate() {
            let n = if e == 2 { 2 } else { 4 };
            assert_eq!(
                b.bytes()[slot * 4 * PAGE..(slot * 4 + n) * PAGE],
                a.bytes()[e * 4 * PAGE..(e * 4 + n) * PAGE]
            );
        }
    }

    #[test]
    fn shapes_parse_and_print() {
        for s in Shape::ALL {
            assert_eq!(s.to_string().parse::<Shape>().unwrap(), s);
        }
        assert!("both".parse::<Shape>().is_err());
    }

    #[test]
    fn distinct_fill_matches_across_regions_only() {
        let mut a = Region::map(32 * PAGE).unwrap();
        let mut b = Region::map(32 * PAGE).unwrap();
        a.fill_distinct(7);
        b.fill_distinct(7);
        assert_eq!(distinct_pages(&a), 32);
        assert_eq!(a.bytes(), b.bytes());
    }
}
