//! Disk reads of the workload guest: the test-image format and the
//! page-cache checksum.
//!
//! DISK_READ copies disk 0, page by page, into the *disk area* of the data
//! area, like a page cache: disk page `k` (sectors `8k..8k+8`) lands in its
//! own page-aligned guest page. Guests that read the same image therefore
//! hold byte-identical pages at the same disk offsets, which is what a
//! dedup engine can merge across VMs (two VMs building from one source tree
//! share their page caches the same way).
//!
//! A *test image* is a disk whose page `k` is the generator page with base
//! [`image_page_base`]`(seed, k)`. The guest can then check every byte it
//! read (`disk_seed != 0`), and the host can predict the pages exactly
//! (`classes::disk_page_content`, `expect`). For any other image the guest
//! only checksums what it read.

use crate::generator::{fill_page, fmix64, kind, page_base, PageWords, WORDS};
use crate::PAGE_SIZE;

/// Bytes per virtio-blk sector.
pub const SECTOR_SIZE: u64 = 512;

/// Sectors per page.
pub const SECTORS_PER_PAGE: u64 = PAGE_SIZE / SECTOR_SIZE;

/// Most disks a workload VM tells its guest about.
pub const MAX_DISKS: usize = 4;

/// Generator base of page `k` of the test image made with `seed`.
#[inline]
pub const fn image_page_base(seed: u64, k: u64) -> u64 {
    page_base(seed, kind::DISK, k, 1)
}

/// Writes page `k` of the test image made with `seed` (host use: tests make
/// images with this).
pub fn fill_image_page(page: &mut PageWords, seed: u64, k: u64) {
    fill_page(page, image_page_base(seed, k));
}

/// Initial value of the checksum.
pub const CHECKSUM_INIT: u64 = 0x6469_736b_7375_6d31;

/// Digest of one page: `sum(word[j] * (2j + 1))`, wrapping. The factors are
/// odd, so a change of any single word (any byte of it) always changes the
/// digest, and equal words at different positions weigh differently.
#[inline]
pub fn page_digest(page: &PageWords) -> u64 {
    let mut acc = 0u64;
    for (j, &w) in page.iter().enumerate() {
        acc = acc.wrapping_add(w.wrapping_mul(2 * j as u64 + 1));
    }
    acc
}

/// Folds the next page's digest into the checksum. `fmix64` is a bijection,
/// so for a given prefix, different digests give different checksums, and
/// the order of pages matters.
#[inline]
pub const fn checksum_step(acc: u64, digest: u64) -> u64 {
    fmix64(acc.wrapping_add(digest) ^ 0x9E37_79B9_7F4A_7C15)
}

/// The checksum DISK_READ reports for `bytes` (the first pages of a disk):
/// over whole pages only, as the guest reads whole pages.
pub fn checksum_bytes(bytes: &[u8]) -> u64 {
    let mut page = [0u64; WORDS];
    let mut acc = CHECKSUM_INIT;
    for chunk in bytes.chunks_exact(PAGE_SIZE as usize) {
        for (w, b) in page.iter_mut().zip(chunk.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(b);
            *w = u64::from_le_bytes(le);
        }
        acc = checksum_step(acc, page_digest(&page));
    }
    acc
}

/// Writes the bytes of page `k` of the test image made with `seed` into
/// `out` (`PAGE_SIZE` bytes, little endian, as the guest sees them).
pub fn image_page_bytes(seed: u64, k: u64, out: &mut [u8; PAGE_SIZE as usize]) {
    let mut page = [0u64; WORDS];
    fill_image_page(&mut page, seed, k);
    for (b, w) in out.chunks_exact_mut(8).zip(page.iter()) {
        b.copy_from_slice(&w.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::generator::check_page;
    use std::vec::Vec;

    fn image(seed: u64, pages: u64) -> Vec<u8> {
        let mut v = Vec::new();
        let mut buf = [0u8; PAGE_SIZE as usize];
        for k in 0..pages {
            image_page_bytes(seed, k, &mut buf);
            v.extend_from_slice(&buf);
        }
        v
    }

    #[test]
    fn image_pages_are_generator_pages() {
        let mut p = [0u64; WORDS];
        fill_image_page(&mut p, 7, 3);
        assert!(check_page(&p, image_page_base(7, 3)));
        let bytes = image(7, 4);
        assert_eq!(&bytes[3 * 4096..3 * 4096 + 8], &p[0].to_le_bytes());
        // Different pages, seeds and kinds give different bases.
        assert_ne!(image_page_base(7, 3), image_page_base(7, 4));
        assert_ne!(image_page_base(7, 3), image_page_base(8, 3));
        assert_ne!(image_page_base(7, 3), page_base(7, kind::SHARED, 3, 1));
    }

    #[test]
    fn checksum_matches_page_by_page_fold() {
        let bytes = image(11, 5);
        let mut acc = CHECKSUM_INIT;
        for k in 0..5 {
            let mut p = [0u64; WORDS];
            fill_image_page(&mut p, 11, k);
            acc = checksum_step(acc, page_digest(&p));
        }
        assert_eq!(checksum_bytes(&bytes), acc);
        // A partial trailing page is not counted.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[1, 2, 3]);
        assert_eq!(checksum_bytes(&longer), acc);
        assert_eq!(checksum_bytes(&[]), CHECKSUM_INIT);
    }

    #[test]
    fn checksum_sees_any_byte_change_and_page_order() {
        let bytes = image(3, 4);
        let good = checksum_bytes(&bytes);
        for pos in [0, 1, 4095, 4096, 3 * 4096 + 777, 4 * 4096 - 1] {
            for bit in [0, 3, 7] {
                let mut bad = bytes.clone();
                bad[pos] ^= 1 << bit;
                assert_ne!(checksum_bytes(&bad), good, "byte {pos} bit {bit}");
            }
        }
        // Swapping two pages changes it too.
        let mut swapped = bytes[4096..8192].to_vec();
        swapped.extend_from_slice(&bytes[..4096]);
        swapped.extend_from_slice(&bytes[8192..]);
        assert_ne!(checksum_bytes(&swapped), good);
        // Zero pages still advance it.
        assert_ne!(checksum_bytes(&[0u8; 8192]), checksum_bytes(&[0u8; 4096]));
    }
}
