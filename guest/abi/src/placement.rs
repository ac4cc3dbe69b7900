//! Where the data area's pages sit in guest-physical memory.
//!
//! Why: with a linear layout, logical page `i` of every VM is at the same
//! guest-physical address, so two VMs with the same content hold identical
//! pages at identical GPAs. Real guests cache the same file in page frames
//! their own allocator chose, so a dedup engine must not be able to rely on
//! GPA coincidences. [`Placement::Scattered`] places the data area's items
//! (logical pages, then disk-area pages, then free slots) by a VM-specific
//! permutation of *extents* of `extent_pages` contiguous slots: 1 is the
//! worst case (every page on its own), 4-32 resembles readahead.
//!
//! The permutation ([`Feistel`]) is a balanced Feistel network over the
//! smallest power-of-four domain holding the extent count, made a bijection
//! of `[0, n)` by cycle-walking. It needs no table (O(1) memory per lookup,
//! as the freestanding guest wants) and both directions are computable: the
//! guest maps item -> slot, the host's oracle maps slot -> item.

use crate::generator::fmix64;
use crate::WorkloadParams;

/// Values of [`WorkloadParams::placement`].
pub mod code {
    /// Item `j` of the data area is in slot `record_pages + j`.
    pub const LINEAR: u32 = 0;
    /// Extents of `extent_pages` items are permuted by `placement_seed`.
    pub const SCATTERED: u32 = 1;
}

/// Largest accepted `extent_pages` (256 MiB extents): beyond that,
/// scattering a guest of realistic size permutes a handful of extents.
pub const MAX_EXTENT_PAGES: u32 = 65536;

/// The placement of a VM's data area.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Item `j` in slot `record_pages + j` (the historical layout).
    #[default]
    Linear,
    /// Extents of `extent_pages` consecutive items (`1..=MAX_EXTENT_PAGES`)
    /// go to the extent slots a permutation keyed by `seed` picks.
    Scattered { extent_pages: u32, seed: u64 },
}

/// Why the placement fields of [`WorkloadParams`] are invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementError {
    /// `placement` is not a [`code`].
    UnknownCode(u32),
    /// Scattered with `extent_pages` outside `1..=MAX_EXTENT_PAGES`.
    BadExtent(u32),
    /// Linear with a non-zero `extent_pages` or `placement_seed` (they would
    /// be ignored: refused so that a linear block is bit-for-bit the old one).
    LinearWithFields,
}

impl core::fmt::Display for PlacementError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::UnknownCode(c) => write!(f, "unknown placement code {c} (0 linear, 1 scattered)"),
            Self::BadExtent(e) => write!(
                f,
                "extent_pages = {e} (valid range 1..={MAX_EXTENT_PAGES} for scattered placement)"
            ),
            Self::LinearWithFields => {
                write!(
                    f,
                    "linear placement takes no extent_pages or placement_seed"
                )
            }
        }
    }
}

impl Placement {
    /// Reads the placement fields of `p`.
    pub fn from_params(p: &WorkloadParams) -> Result<Self, PlacementError> {
        match p.placement {
            code::LINEAR if p.extent_pages == 0 && p.placement_seed == 0 => Ok(Self::Linear),
            code::LINEAR => Err(PlacementError::LinearWithFields),
            code::SCATTERED => {
                if p.extent_pages == 0 || p.extent_pages > MAX_EXTENT_PAGES {
                    return Err(PlacementError::BadExtent(p.extent_pages));
                }
                Ok(Self::Scattered {
                    extent_pages: p.extent_pages,
                    seed: p.placement_seed,
                })
            }
            c => Err(PlacementError::UnknownCode(c)),
        }
    }

    /// Writes this placement into the fields of `p` (linear: all zero).
    pub fn write_params(self, p: &mut WorkloadParams) {
        (p.placement, p.extent_pages, p.placement_seed) = match self {
            Self::Linear => (code::LINEAR, 0, 0),
            Self::Scattered { extent_pages, seed } => (code::SCATTERED, extent_pages, seed),
        };
    }

    /// The item <-> offset map of this placement over `items` slots.
    pub fn scatter(self, items: u64) -> Scatter {
        match self {
            Self::Linear => Scatter::linear(items),
            Self::Scattered { extent_pages, seed } => {
                Scatter::new(items, u64::from(extent_pages), seed)
            }
        }
    }
}

/// Rounds of the Feistel network: four rounds make a pseudo-random
/// permutation (Luby-Rackoff); more buy nothing here.
const ROUNDS: usize = 4;

/// A keyed bijection of `[0, n)`: a balanced Feistel network over
/// `[0, 4^k)` (the smallest with `4^k >= n`, at least 4) with cycle-walking.
/// Since `4^k < 4n`, a lookup walks fewer than 4 times on average.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Feistel {
    n: u64,
    /// Bits of each half.
    half: u32,
    keys: [u64; ROUNDS],
}

impl Feistel {
    /// The permutation of `[0, n)` keyed by `seed`.
    pub const fn new(n: u64, seed: u64) -> Self {
        let bits = if n <= 4 {
            2
        } else {
            64 - (n - 1).leading_zeros()
        };
        let half = bits.div_ceil(2);
        let mut keys = [0u64; ROUNDS];
        let mut r = 0;
        while r < ROUNDS {
            // splitmix64-style key schedule: distinct, well-mixed round keys.
            keys[r] = fmix64(seed.wrapping_add((r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            r += 1;
        }
        Self { n, half, keys }
    }

    /// Size of the permuted domain.
    pub const fn len(&self) -> u64 {
        self.n
    }

    /// Whether the domain is empty.
    pub const fn is_empty(&self) -> bool {
        self.n == 0
    }

    #[inline]
    const fn mask(&self) -> u64 {
        (1u64 << self.half) - 1
    }

    #[inline]
    const fn round(&self, r: usize, x: u64) -> u64 {
        fmix64(x ^ self.keys[r]) & self.mask()
    }

    #[inline]
    const fn encrypt(&self, x: u64) -> u64 {
        let m = self.mask();
        let (mut l, mut r) = (x >> self.half, x & m);
        let mut i = 0;
        while i < ROUNDS {
            let t = l ^ self.round(i, r);
            l = r;
            r = t;
            i += 1;
        }
        (l << self.half) | r
    }

    #[inline]
    const fn decrypt(&self, y: u64) -> u64 {
        let m = self.mask();
        let (mut l, mut r) = (y >> self.half, y & m);
        let mut i = ROUNDS;
        while i > 0 {
            i -= 1;
            let t = r ^ self.round(i, l);
            r = l;
            l = t;
        }
        (l << self.half) | r
    }

    /// Image of `x < n`. Cycle-walking: the network permutes `[0, 4^k)`,
    /// so following it from `x` returns into `[0, n)` before it returns to
    /// `x`, which keeps the restriction a bijection.
    #[inline]
    pub const fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// Pre-image of `y < n`: `invert(apply(x)) == x`.
    #[inline]
    pub const fn invert(&self, y: u64) -> u64 {
        debug_assert!(y < self.n);
        let mut x = self.decrypt(y);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }
}

/// The map between the data area's items and their offsets (slots after
/// the record pages) for one placement: `items` offsets, cut into extents
/// of `extent` items. The `items / extent` whole extents are permuted; a
/// short tail extent (`items % extent` items) stays at the end, so every
/// extent stays contiguous and the map stays a bijection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scatter {
    items: u64,
    /// Items per extent; 0: linear (identity).
    extent: u64,
    perm: Feistel,
}

impl Scatter {
    /// The identity over `items`.
    pub const fn linear(items: u64) -> Self {
        Self {
            items,
            extent: 0,
            perm: Feistel::new(0, 0),
        }
    }

    /// Extents of `extent >= 1` items permuted by `seed`.
    pub const fn new(items: u64, extent: u64, seed: u64) -> Self {
        assert!(extent > 0);
        Self {
            items,
            extent,
            perm: Feistel::new(items / extent, seed),
        }
    }

    /// Number of items (and offsets).
    pub const fn items(&self) -> u64 {
        self.items
    }

    /// Items per extent (0 for linear).
    pub const fn extent(&self) -> u64 {
        self.extent
    }

    /// Offset of item `j < items`.
    #[inline]
    pub const fn offset(&self, j: u64) -> u64 {
        if self.extent == 0 {
            return j;
        }
        let e = j / self.extent;
        if e >= self.perm.len() {
            return j;
        }
        self.perm.apply(e) * self.extent + j % self.extent
    }

    /// Item at offset `o < items` (the inverse of [`Self::offset`]).
    #[inline]
    pub const fn item(&self, o: u64) -> u64 {
        if self.extent == 0 {
            return o;
        }
        let e = o / self.extent;
        if e >= self.perm.len() {
            return o;
        }
        self.perm.invert(e) * self.extent + o % self.extent
    }

    /// Items from `j` on (`j` included, up to `items`) whose offsets follow
    /// `offset(j)` contiguously by construction: the rest of `j`'s extent,
    /// or everything left when linear (or in the tail extent). Neighbouring
    /// extents may happen to be adjacent too; this does not look.
    pub const fn run(&self, j: u64) -> u64 {
        if self.extent == 0 || j / self.extent >= self.perm.len() {
            self.items - j
        } else {
            self.extent - j % self.extent
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    fn is_bijection(f: impl Fn(u64) -> u64, inv: impl Fn(u64) -> u64, n: u64) -> bool {
        let mut seen = std::vec![false; n as usize];
        for x in 0..n {
            let y = f(x);
            if y >= n || seen[y as usize] || inv(y) != x {
                return false;
            }
            seen[y as usize] = true;
        }
        true
    }

    #[test]
    fn feistel_is_a_bijection_for_every_small_size() {
        for n in 0..300 {
            for seed in [0, 1, 0xdead_beef] {
                let p = Feistel::new(n, seed);
                assert!(
                    is_bijection(|x| p.apply(x), |y| p.invert(y), n),
                    "n={n} seed={seed}"
                );
            }
        }
    }

    #[test]
    fn feistel_moves_most_points() {
        // A useful scatter leaves few extents where they were.
        let p = Feistel::new(10_000, 7);
        let fixed = (0..10_000).filter(|&x| p.apply(x) == x).count();
        assert!(fixed < 20, "{fixed} fixed points");
    }

    #[test]
    fn linear_is_the_identity() {
        let s = Placement::Linear.scatter(1234);
        for j in 0..1234 {
            assert_eq!(s.offset(j), j);
            assert_eq!(s.item(j), j);
        }
        assert_eq!(s.run(0), 1234);
        assert_eq!(s.run(1000), 234);
    }

    #[test]
    fn extents_stay_contiguous_and_the_tail_stays_put() {
        let s = Scatter::new(8 * 100 + 5, 8, 42);
        for e in 0..100 {
            let first = s.offset(e * 8);
            assert_eq!(first % 8, 0, "extent {e} starts unaligned");
            for k in 0..8 {
                assert_eq!(s.offset(e * 8 + k), first + k);
                assert_eq!(s.run(e * 8 + k), 8 - k);
            }
        }
        for j in 800..805 {
            assert_eq!(s.offset(j), j);
            assert_eq!(s.run(j), 805 - j);
        }
    }

    #[test]
    fn different_seeds_give_different_layouts() {
        let a = Scatter::new(5000, 1, 1);
        let b = Scatter::new(5000, 1, 2);
        let same = (0..5000).filter(|&j| a.offset(j) == b.offset(j)).count();
        // Unrelated permutations agree on about one point.
        assert!(same < 20, "{same} items at the same offset");
        let a8 = Scatter::new(5000, 8, 1);
        let b8 = Scatter::new(5000, 8, 2);
        let same = (0..5000).filter(|&j| a8.offset(j) == b8.offset(j)).count();
        assert!(same < 5000 / 8, "{same} items at the same offset");
    }

    #[test]
    fn params_round_trip_and_reject_nonsense() {
        let mut p = WorkloadParams::default();
        assert_eq!(Placement::from_params(&p), Ok(Placement::Linear));
        let s = Placement::Scattered {
            extent_pages: 8,
            seed: 99,
        };
        s.write_params(&mut p);
        assert_eq!((p.placement, p.extent_pages, p.placement_seed), (1, 8, 99));
        assert_eq!(Placement::from_params(&p), Ok(s));
        Placement::Linear.write_params(&mut p);
        assert_eq!(p, WorkloadParams::default());
        p.extent_pages = 4;
        assert_eq!(
            Placement::from_params(&p),
            Err(PlacementError::LinearWithFields)
        );
        p.placement = code::SCATTERED;
        p.extent_pages = 0;
        assert_eq!(
            Placement::from_params(&p),
            Err(PlacementError::BadExtent(0))
        );
        p.extent_pages = MAX_EXTENT_PAGES + 1;
        assert!(Placement::from_params(&p).is_err());
        p.placement = 7;
        assert_eq!(
            Placement::from_params(&p),
            Err(PlacementError::UnknownCode(7))
        );
    }

    proptest! {
        #[test]
        fn scatter_is_a_bijection_with_contiguous_extents(
            items in 0u64..3000,
            extent in 1u64..40,
            seed in any::<u64>(),
        ) {
            let s = Scatter::new(items, extent, seed);
            prop_assert!(is_bijection(|j| s.offset(j), |o| s.item(o), items));
            let mut j = 0;
            while j < items {
                let run = s.run(j);
                prop_assert!(run >= 1 && j + run <= items);
                let o = s.offset(j);
                let offs: Vec<u64> = (j..j + run).map(|k| s.offset(k)).collect();
                prop_assert_eq!(offs, (o..o + run).collect::<Vec<_>>());
                j += run;
            }
        }

        #[test]
        fn feistel_inverts(n in 1u64..(1 << 40), seed in any::<u64>(), x in any::<u64>()) {
            let p = Feistel::new(n, seed);
            let x = x % n;
            let y = p.apply(x);
            prop_assert!(y < n);
            prop_assert_eq!(p.invert(y), x);
        }
    }
}
