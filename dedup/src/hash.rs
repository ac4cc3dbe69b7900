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

/// Cache lines `sampled_lines_agree` compares: the first, one in the
/// middle, the last.
pub(crate) const SAMPLED_LINES: [usize; 3] = [0, PAGE_SIZE / 2, PAGE_SIZE - 64];

/// True if two pages agree on a few sampled cache lines: a cheap filter
/// before a guess that a full compare will check anyway (a page that
/// differs from its run's next pool page usually differs in its first
/// line). Not a proof of equality.
pub fn sampled_lines_agree(a: &[u8], b: &[u8]) -> bool {
    SAMPLED_LINES.iter().all(|&o| a[o..o + 64] == b[o..o + 64])
}

/// The folded hash of the zero page under `f`.
pub fn zero_hash(f: HashFn) -> u32 {
    fold(f(&[0u8; PAGE_SIZE]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_lines_agree_looks_at_first_middle_and_last_line() {
        let a = vec![7u8; PAGE_SIZE];
        let mut b = a.clone();
        assert!(sampled_lines_agree(&a, &b));
        b[100] = 0; // outside the sampled lines
        assert!(sampled_lines_agree(&a, &b));
        for o in [0, PAGE_SIZE / 2 + 63, PAGE_SIZE - 1] {
            let mut c = a.clone();
            c[o] = 0;
            assert!(!sampled_lines_agree(&a, &c), "byte {o}");
        }
    }

    #[test]
    fn zero_detection() {
        let mut p = vec![0u8; PAGE_SIZE];
        assert!(is_zero(&p));
        p[PAGE_SIZE - 1] = 1;
        assert!(!is_zero(&p));
        assert_ne!(fold(xxh3(&p)), zero_hash(xxh3));
    }
}
