//! The deterministic page generator shared by the guest (which writes and
//! checks pages) and the host (which predicts what the guest holds).
//!
//! A non-zero page is an arithmetic sequence of 64-bit words:
//! `word[j] = base + j * WORD_STEP` (wrapping), where `base` is a 64-bit mix of
//! (seed, kind, index, version). The sequence form is what makes filling fast:
//! it is one vector add per 16 bytes, so the guest's write bandwidth is bound
//! by memory, not by the generator. Two pages are identical exactly when their
//! bases are equal, so the base *is* the content's identity, and no generated
//! page is all-zero (two consecutive words cannot both be 0 because
//! `WORD_STEP != 0`).

/// Words per page.
pub const WORDS: usize = 512;

/// One page as words.
pub type PageWords = [u64; WORDS];

/// Step between consecutive words of a page (odd, so every word differs).
pub const WORD_STEP: u64 = 0x9E37_79B9_7F4A_7C15;

/// Kind of content: separates the shared and private parts even when a VM is
/// given `private_seed == seed`.
pub mod kind {
    /// Shared (read-mostly, same in VMs with the same `seed`).
    pub const SHARED: u32 = 1;
    /// Private (per-VM, churned).
    pub const PRIVATE: u32 = 2;
    /// Pages of a test disk image (`disk::image_page_base`).
    pub const DISK: u32 = 3;
}

/// The murmur3 64-bit finalizer: a bijection with full avalanche.
#[inline]
pub const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The base word of the page (seed, kind, index, version). Each step is a
/// bijection in its new input, so for a fixed (seed, kind) distinct indices
/// give distinct bases at a fixed version, and vice versa.
#[inline]
pub const fn page_base(seed: u64, kind: u32, index: u64, version: u32) -> u64 {
    let h = fmix64(seed.wrapping_add((kind as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)));
    let h = fmix64(h ^ index.wrapping_mul(0x9fb2_1c65_1e98_df25));
    fmix64(h ^ (version as u64).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// Word `j` of the page with `base`.
#[inline]
pub const fn page_word(base: u64, j: usize) -> u64 {
    base.wrapping_add((j as u64).wrapping_mul(WORD_STEP))
}

/// Writes the page with `base` using ordinary stores (portable; the host's
/// choice when it reads the page right after).
#[inline]
pub fn fill_page(page: &mut PageWords, base: u64) {
    // An explicit induction variable (not `j * WORD_STEP`) lets LLVM emit one
    // paddq per vector instead of emulating a 64-bit vector multiply.
    let mut v = base;
    for w in page.iter_mut() {
        *w = v;
        v = v.wrapping_add(WORD_STEP);
    }
}

/// Writes the page with `base` using non-temporal (streaming) SSE2 stores.
///
/// Why: ordinary stores to memory not in cache first read the line (RFO),
/// which halves write bandwidth; streaming stores do not, and reach memset
/// speed (measured on the project machine: ~6-9 GB/s ordinary, ~11-18 GB/s
/// streaming, memset 14-20 GB/s). Streaming stores are weakly ordered: call
/// [`store_fence`] before another agent (the host) must see the data.
/// On other architectures this is [`fill_page`].
#[inline]
pub fn fill_page_nt(page: &mut PageWords, base: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{
            __m128i, _mm_add_epi64, _mm_set1_epi64x, _mm_set_epi64x, _mm_stream_si128,
        };
        let two = WORD_STEP.wrapping_mul(2) as i64;
        let ptr = page.as_mut_ptr() as *mut __m128i;
        // SAFETY: SSE2 is part of the x86_64 baseline. `page` is a valid,
        // exclusively borrowed 4096-byte array aligned to 8; `_mm_stream_si128`
        // needs 16-byte alignment, which every page-aligned page has — and the
        // type's own alignment is checked below before taking this path.
        unsafe {
            if (ptr as usize) % 16 != 0 {
                fill_page(page, base);
                return;
            }
            let step = _mm_set1_epi64x(WORD_STEP.wrapping_mul(8) as i64);
            let mut v0 = _mm_set_epi64x(base.wrapping_add(WORD_STEP) as i64, base as i64);
            let mut v1 = _mm_add_epi64(v0, _mm_set1_epi64x(two));
            let mut v2 = _mm_add_epi64(v1, _mm_set1_epi64x(two));
            let mut v3 = _mm_add_epi64(v2, _mm_set1_epi64x(two));
            for i in 0..WORDS / 8 {
                let q = ptr.add(4 * i);
                _mm_stream_si128(q, v0);
                _mm_stream_si128(q.add(1), v1);
                _mm_stream_si128(q.add(2), v2);
                _mm_stream_si128(q.add(3), v3);
                v0 = _mm_add_epi64(v0, step);
                v1 = _mm_add_epi64(v1, step);
                v2 = _mm_add_epi64(v2, step);
                v3 = _mm_add_epi64(v3, step);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    fill_page(page, base);
}

/// Zeroes the page with streaming stores (see [`fill_page_nt`]).
#[inline]
pub fn zero_page_nt(page: &mut PageWords) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_stream_si128};
        let ptr = page.as_mut_ptr() as *mut __m128i;
        // SAFETY: as in `fill_page_nt`: SSE2 baseline, exclusive 4 KiB
        // borrow, alignment checked before the streaming path.
        unsafe {
            if (ptr as usize) % 16 != 0 {
                page.fill(0);
                return;
            }
            let z = _mm_setzero_si128();
            for i in 0..WORDS / 2 {
                _mm_stream_si128(ptr.add(i), z);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    page.fill(0);
}

/// Orders earlier streaming stores before later stores (x86 `sfence`).
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is SSE (x86_64 baseline) and has no memory-safety effect.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

/// True if the page holds the sequence with `base`.
#[inline]
pub fn check_page(page: &PageWords, base: u64) -> bool {
    // Or-reduce the differences: branch-free, so it vectorizes.
    let mut acc = 0u64;
    let mut v = base;
    for w in page.iter() {
        acc |= *w ^ v;
        v = v.wrapping_add(WORD_STEP);
    }
    acc == 0
}

/// True if every word of the page is zero.
#[inline]
pub fn is_zero_page(page: &PageWords) -> bool {
    page.iter().fold(0u64, |a, w| a | w) == 0
}

/// The first word that differs from the sequence with `base` (`None` for all
/// zero when `base` is `None`): (word index, expected, found).
pub fn first_difference(page: &PageWords, base: Option<u64>) -> Option<(usize, u64, u64)> {
    page.iter().enumerate().find_map(|(j, &found)| {
        let expected = base.map_or(0, |b| page_word(b, j));
        (found != expected).then_some((j, expected, found))
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::boxed::Box;
    use std::collections::HashSet;

    /// A page-aligned page, like guest RAM.
    #[repr(C, align(4096))]
    struct Aligned(PageWords);

    fn page() -> Box<Aligned> {
        Box::new(Aligned([0xdead_beef; WORDS]))
    }

    #[test]
    fn fill_and_check_agree_and_match_page_word() {
        let mut p = page();
        let base = page_base(7, kind::SHARED, 42, 1);
        fill_page(&mut p.0, base);
        assert!(check_page(&p.0, base));
        for j in [0, 1, 255, 511] {
            assert_eq!(p.0[j], page_word(base, j));
        }
        assert!(!check_page(&p.0, base.wrapping_add(1)));
        assert_eq!(first_difference(&p.0, Some(base)), None);
    }

    #[test]
    fn streaming_fill_writes_the_same_words() {
        let mut a = page();
        let mut b = page();
        for base in [0, 1, u64::MAX, page_base(1, kind::PRIVATE, 9, 3)] {
            fill_page(&mut a.0, base);
            fill_page_nt(&mut b.0, base);
            store_fence();
            assert_eq!(a.0, b.0);
        }
        zero_page_nt(&mut b.0);
        store_fence();
        assert!(is_zero_page(&b.0));
    }

    #[test]
    fn unaligned_pages_take_the_plain_path() {
        // An 8-aligned but not 16-aligned page inside a larger buffer.
        let mut buf = Box::new(Aligned([0; WORDS]));
        let mut big = std::vec![0u64; WORDS + 1];
        let p: &mut PageWords = (&mut big[1..]).try_into().unwrap();
        let base = page_base(3, kind::SHARED, 1, 1);
        fill_page_nt(p, base);
        assert!(check_page(p, base));
        fill_page(&mut buf.0, base);
        assert_eq!(&buf.0, p);
    }

    #[test]
    fn one_word_flip_is_detected_and_located() {
        let mut p = page();
        let base = page_base(5, kind::SHARED, 3, 2);
        fill_page(&mut p.0, base);
        p.0[300] ^= 1 << 17;
        assert!(!check_page(&p.0, base));
        let (j, exp, found) = first_difference(&p.0, Some(base)).unwrap();
        assert_eq!(
            (j, exp, found),
            (300, page_word(base, 300), page_word(base, 300) ^ (1 << 17))
        );
    }

    #[test]
    fn generated_pages_are_never_zero() {
        let mut p = page();
        for base in [0, WORD_STEP.wrapping_neg(), 1] {
            fill_page(&mut p.0, base);
            assert!(!is_zero_page(&p.0));
        }
    }

    #[test]
    fn bases_differ_across_every_input() {
        let mut seen = HashSet::new();
        for seed in 0..4u64 {
            for k in [kind::SHARED, kind::PRIVATE, kind::DISK] {
                for index in 0..256u64 {
                    for version in 0..4u32 {
                        assert!(seen.insert(page_base(seed, k, index, version)));
                    }
                }
            }
        }
        // Pure function: same inputs, same base.
        assert_eq!(
            page_base(9, kind::SHARED, 77, 5),
            page_base(9, kind::SHARED, 77, 5)
        );
    }

    #[test]
    fn fmix64_is_a_bijection_on_a_sample() {
        let mut seen = HashSet::new();
        for i in 0..10_000u64 {
            assert!(seen.insert(fmix64(i)));
        }
        assert_eq!(fmix64(0), 0);
    }
}
