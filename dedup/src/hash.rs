//! Page checksums. The engine stores a 32-bit fold of xxh3-64 per page (KSM
//! keeps 32 bits too): it only decides volatility and index placement; every
//! merge is confirmed by a full compare under write-protection.

use crate::PAGE_SIZE;

/// A page hash function (xxh3-64 by default; tests plug in weak ones).
pub type HashFn = fn(&[u8]) -> u64;

/// xxh3-64 of a page. twox-hash picks AVX2 at run time when the CPU has it
/// (xxhash-rust chose its SIMD width at compile time: SSE2 for a generic
/// x86-64 build).
pub fn xxh3(page: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(page)
}

/// Folds a 64-bit hash to the 32 bits the engine stores.
pub fn fold(h: u64) -> u32 {
    (h ^ (h >> 32)) as u32
}

/// True if the page is all zeros (stops at the first non-zero word).
pub fn is_zero(page: &[u8]) -> bool {
    let (pre, mid, post) = {
        // SAFETY: u64 has no invalid bit patterns; align_to splits safely.
        unsafe { page.align_to::<u64>() }
    };
    pre.iter().all(|&b| b == 0) && mid.iter().all(|&w| w == 0) && post.iter().all(|&b| b == 0)
}

/// The folded hash of the zero page under `f`.
pub fn zero_hash(f: HashFn) -> u32 {
    fold(f(&[0u8; PAGE_SIZE]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        let mut p = vec![0u8; PAGE_SIZE];
        assert!(is_zero(&p));
        p[PAGE_SIZE - 1] = 1;
        assert!(!is_zero(&p));
        assert_ne!(fold(xxh3(&p)), zero_hash(xxh3));
    }
}
