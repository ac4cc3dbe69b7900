//! The benchmark's memory: a private anonymous region filled with one of
//! the 2022 auto-mode test's shapes.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::error::BenchError;

pub const PAGE: usize = 4096;
/// 300 MiB, as in the 2022 test.
pub const SEED_REGION_BYTES: usize = 300 << 20;

/// Content of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Every page memset to 0x01: one content, everything merges.
    Full,
    /// Every page distinct except every 1800th (0xff): almost nothing merges.
    Sparse,
}

impl Shape {
    pub const ALL: [Shape; 2] = [Shape::Full, Shape::Sparse];

    /// `pages_sharing` a perfect merger settles at (before any
    /// `max_page_sharing` limit): duplicates minus one kept copy per content.
    pub fn ideal_sharing(self, pages: usize) -> u64 {
        match self {
            Shape::Full => pages as u64 - 1,
            Shape::Sparse => (pages.div_ceil(1800) - 1) as u64,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shape::Full => "full",
            Shape::Sparse => "sparse",
        })
    }
}

impl FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Shape::Full),
            "sparse" => Ok(Shape::Sparse),
            o => Err(format!("unknown shape {o:?} (expected full or sparse)")),
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
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(BenchError::Mmap {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self {
            ptr: ptr as *mut u8,
            len,
        })
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
    pub fn fill(&mut self, shape: Shape) {
        let pages = self.pages();
        let b = self.bytes_mut();
        match shape {
            Shape::Full => b.fill(0x01),
            Shape::Sparse => {
                for (j, i) in (1..pages).enumerate() {
                    b[i * PAGE + (j % PAGE)] = (j % 127 + 1) as u8;
                }
                for i in (0..pages).step_by(1800) {
                    b[i * PAGE..(i + 1) * PAGE].fill(0xff);
                }
            }
        }
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

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what map() mapped; nobody else holds it
        // (backends were unregistered before the region is dropped).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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
    fn distinct_fill_matches_across_regions_only() {
        let mut a = Region::map(32 * PAGE).unwrap();
        let mut b = Region::map(32 * PAGE).unwrap();
        a.fill_distinct(7);
        b.fill_distinct(7);
        assert_eq!(distinct_pages(&a), 32);
        assert_eq!(a.bytes(), b.bytes());
    }
}
