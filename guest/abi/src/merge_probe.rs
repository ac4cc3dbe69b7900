//! The write-timing side channel (PROBE_MERGE): a guest that knows which
//! of its pages some other VM also holds (or which are all zero) writes
//! each of them once and tells merged pages from unmerged ones by how long
//! the write took. A copy-on-write fault on a merged page costs tens of
//! microseconds; a write to a private page a fraction of one.
//!
//! The arithmetic lives here, shared by the guest (which times the writes
//! and classifies them) and the host (which reads the summary and tests
//! the classifier): the attacker's "training" is the threshold that best
//! separates the classes on a random half of its own pages, whose labels
//! it knows; its accuracy is that threshold's on the other half. Each
//! write is timed against a local baseline, the median of the nearest
//! writes (in time) to its own unique pages, so that the host slowing down or
//! speeding up during the probe does not blur the classes.

/// Most probe pages one PROBE_MERGE phase writes (each class at most half).
pub const MAX_PROBES: usize = 4096;

/// The word of a probe page the guest reads right after its write: 2 KiB
/// in, far from the written first word and its neighbours the hardware
/// prefetches along.
pub const READ_WORD: usize = 256;

/// A read time `c` as a sample time that is larger the faster the read
/// (`READ_FLIP - c`): a merged page is the one read *fast* after the
/// write, and [`learn_threshold`] calls the slower side shared.
pub const READ_FLIP: u64 = 1 << 40;

/// Quantiles (per mille) of each class's write time in [`MergeProbe`]:
/// minimum, p10, p25, median, p75, p90, maximum.
pub const QUANTILES_PERMILLE: [u64; 7] = [0, 100, 250, 500, 750, 900, 1000];

/// Index of the median in [`QUANTILES_PERMILLE`].
pub const MEDIAN: usize = 3;

/// One timed write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// TSC cycles the write took.
    pub cycles: u64,
    /// The attacker's label: the page holds content another VM holds too
    /// (or is all zero), so a merger may have merged it.
    pub shared: bool,
}

/// What a PROBE_MERGE phase measured (in `PhaseReport::probe`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeProbe {
    /// Probe pages written, both classes.
    pub pages: u64,
    /// Of them, pages labelled shared (the other half unique).
    pub shared_pages: u64,
    /// Pages whose labels chose the threshold.
    pub train_pages: u64,
    /// Pages classified with it (the rest).
    pub tested: u64,
    /// Of the tested pages, those classified as their label says.
    pub correct: u64,
    /// The learned threshold: a write slower than this many cycles above
    /// its local baseline (the median of the nearest training writes of
    /// unique pages; see [`relative_to_baseline`]) is classified "merged"
    /// (0 where the threshold lies below the baseline).
    pub threshold_cycles: u64,
    /// The guest's TSC rate (cycles to time on the host).
    pub tsc_khz: u64,
    /// Write cycles of the shared pages at [`QUANTILES_PERMILLE`].
    pub shared_cycles: [u64; 7],
    /// Write cycles of the unique pages at [`QUANTILES_PERMILLE`].
    pub unique_cycles: [u64; 7],
    /// The read after each write (of another cache line of the same page,
    /// [`READ_WORD`]), classified the same way: of the tested pages, those
    /// classified as their label says. A copy-on-write copy or a zero
    /// page's clearing leaves the page in the cache; a page the write only
    /// unprotected stays in memory.
    pub read_correct: u64,
    /// Median cycles of that read, shared and unique pages.
    pub shared_read_cycles: u64,
    pub unique_read_cycles: u64,
}

impl MergeProbe {
    /// Share of the tested pages classified right (0 with none tested).
    pub fn accuracy(&self) -> f64 {
        if self.tested == 0 {
            0.0
        } else {
            self.correct as f64 / self.tested as f64
        }
    }

    /// Share of the tested pages the read after the write classified
    /// right (0 with none tested).
    pub fn read_accuracy(&self) -> f64 {
        if self.tested == 0 {
            0.0
        } else {
            self.read_correct as f64 / self.tested as f64
        }
    }

    /// Microseconds of `cycles` at the guest's TSC rate (0 without one).
    pub fn us(&self, cycles: u64) -> f64 {
        if self.tsc_khz == 0 {
            0.0
        } else {
            cycles as f64 * 1e3 / self.tsc_khz as f64
        }
    }
}

/// A small deterministic generator (xorshift64*), for the write order and
/// the training split: no_std, no state beyond a word.
#[derive(Clone, Copy, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; 0 is remapped).
    pub const fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, n)` (`n > 0`; the bias of a modulo of 64 bits is
    /// far below what the probe can see).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// The threshold `t` that classifies most of `train` right, calling a
/// sample shared when `cycles > t`: over every cut between two distinct
/// times (and below all of them), the first cut with the most right.
/// Sorts `train` by cycles. An empty set gives 0.
pub fn learn_threshold(train: &mut [Sample]) -> u64 {
    train.sort_unstable_by_key(|s| s.cycles);
    let shared_total = train.iter().filter(|s| s.shared).count();
    // Cut below everything: every sample called shared.
    let mut best = (shared_total, 0u64);
    let (mut unique_le, mut shared_le) = (0usize, 0usize);
    for i in 0..train.len() {
        if train[i].shared {
            shared_le += 1;
        } else {
            unique_le += 1;
        }
        if i + 1 < train.len() && train[i + 1].cycles == train[i].cycles {
            continue;
        }
        let right = unique_le + (shared_total - shared_le);
        if right > best.0 {
            // Halfway to the next time, so that unseen times between the
            // two fall on the nearer side.
            let cut = match train.get(i + 1) {
                Some(n) => train[i].cycles + (n.cycles - train[i].cycles) / 2,
                None => train[i].cycles,
            };
            best = (right, cut);
        }
    }
    best.1
}

/// Test samples classified as their label says with threshold `t`.
pub fn correct(test: &[Sample], t: u64) -> u64 {
    test.iter().filter(|s| (s.cycles > t) == s.shared).count() as u64
}

/// [`QUANTILES_PERMILLE`] of `sorted` (ascending; all 0 when empty).
pub fn quantiles(sorted: &[u64]) -> [u64; 7] {
    let mut out = [0; 7];
    if sorted.is_empty() {
        return out;
    }
    let last = sorted.len() as u64 - 1;
    for (o, &q) in out.iter_mut().zip(QUANTILES_PERMILLE.iter()) {
        *o = sorted[((q * last + 500) / 1000) as usize];
    }
    out
}

/// Reference writes the local baseline is the median of.
pub const BASELINE_WRITES: usize = 16;

/// Offset of a write's time relative to its baseline, so that a write
/// faster than its baseline stays a positive number.
pub const RELATIVE_ZERO: u64 = 1 << 62;

/// Whether the `rank`-th write of a label (0-based, in write order)
/// trains: every other one, so that the training and the test writes
/// interleave in time and take half of each label.
pub const fn trains(rank: usize) -> bool {
    rank % 2 == 0
}

/// Replaces each sample's time by its distance to a local baseline (plus
/// [`RELATIVE_ZERO`]): the median of the [`BASELINE_WRITES`] reference
/// writes nearest to it in write order, half before and half after it
/// (fewer at the ends; never the write itself). The references are the
/// training writes of unique pages, pages the attacker knows are its own.
/// A change of the host's speed during the probe then moves a write and
/// its baseline alike, on both sides of the change. `refs` holds the
/// reference times (at least as long as `samples`).
pub fn relative_to_baseline(samples: &mut [Sample], refs: &mut [u64]) {
    const HALF: usize = BASELINE_WRITES / 2;
    let reference = |s: &Sample, unique_rank: usize| !s.shared && trains(unique_rank);
    let (mut m, mut rank) = (0, 0);
    for s in samples.iter() {
        if reference(s, rank) {
            refs[m] = s.cycles;
            m += 1;
        }
        rank += usize::from(!s.shared);
    }
    if m < 2 {
        return;
    }
    let (mut before, mut rank) = (0, 0);
    for s in samples.iter_mut() {
        let is_ref = reference(s, rank);
        rank += usize::from(!s.shared);
        // References before this write: [lo, before); after it:
        // [after, hi).
        let after = before + usize::from(is_ref);
        let lo = before.saturating_sub(HALF);
        let hi = (after + HALF).min(m);
        let mut window = [0u64; BASELINE_WRITES];
        let mut k = 0;
        for &c in refs[lo..before].iter().chain(refs[after..hi].iter()) {
            window[k] = c;
            k += 1;
        }
        before = after;
        if k == 0 {
            continue;
        }
        window[..k].sort_unstable();
        s.cycles = RELATIVE_ZERO
            .saturating_add(s.cycles)
            .saturating_sub(window[k / 2]);
    }
}

/// Splits `samples` (in write order, already random) into a training set
/// and a test set: every other write of each label trains ([`trains`]), so
/// both take half of each label and a classifier that cannot tell the
/// labels apart scores 0.5 on the test set. With `relative`, each time is
/// first taken relative to its local baseline ([`relative_to_baseline`]).
/// Learns the threshold on the training set, classifies the test set, and
/// fills the summary (the quantiles are of the raw times; the threshold is
/// relative with `relative`). Reorders `samples`. `scratch` (at least
/// `samples.len()` long) holds each class's sorted times in turn.
pub fn evaluate(
    samples: &mut [Sample],
    scratch: &mut [u64],
    tsc_khz: u64,
    relative: bool,
) -> MergeProbe {
    let n = samples.len();
    let shared_pages = samples.iter().filter(|s| s.shared).count();
    let mut class_quantiles = |samples: &[Sample], shared: bool| -> [u64; 7] {
        let mut k = 0;
        for s in samples.iter().filter(|s| s.shared == shared) {
            scratch[k] = s.cycles;
            k += 1;
        }
        scratch[..k].sort_unstable();
        quantiles(&scratch[..k])
    };
    let shared_cycles = class_quantiles(samples, true);
    let unique_cycles = class_quantiles(samples, false);
    if relative {
        relative_to_baseline(samples, scratch);
    }
    // Move the training writes to the front (each write is visited once,
    // in write order, before any swap moves it).
    let mut rank = [0usize; 2];
    let mut train_n = 0;
    for i in 0..n {
        let label = usize::from(samples[i].shared);
        if trains(rank[label]) {
            samples.swap(i, train_n);
            train_n += 1;
        }
        rank[label] += 1;
    }
    let (train, test) = samples.split_at_mut(train_n);
    let t = learn_threshold(train);
    let right = correct(test, t);
    MergeProbe {
        pages: n as u64,
        shared_pages: shared_pages as u64,
        train_pages: train_n as u64,
        tested: (n - train_n) as u64,
        correct: right,
        threshold_cycles: if relative {
            t.saturating_sub(RELATIVE_ZERO)
        } else {
            t
        },
        tsc_khz,
        shared_cycles,
        unique_cycles,
        ..MergeProbe::default()
    }
}

/// Classifies the reads after the writes (`reads[i]` the read after
/// `writes[i]`'s write, same labels, in write order) with the same split
/// as [`evaluate`], each read time taken as [`READ_FLIP`] minus it, and
/// adds the result to `probe`. Reorders `reads`; `scratch` as for
/// [`evaluate`].
pub fn evaluate_reads(reads: &mut [Sample], scratch: &mut [u64], probe: &mut MergeProbe) {
    for r in reads.iter_mut() {
        r.cycles = READ_FLIP.saturating_sub(r.cycles);
    }
    let p = evaluate(reads, scratch, probe.tsc_khz, false);
    probe.read_correct = p.correct;
    probe.shared_read_cycles = READ_FLIP.saturating_sub(p.shared_cycles[MEDIAN]);
    probe.unique_read_cycles = READ_FLIP.saturating_sub(p.unique_cycles[MEDIAN]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(cycles: u64, shared: bool) -> Sample {
        Sample { cycles, shared }
    }

    #[test]
    fn threshold_separates_two_clean_classes_halfway() {
        let mut v = [
            s(100, false),
            s(40_000, true),
            s(120, false),
            s(50_000, true),
        ];
        let t = learn_threshold(&mut v);
        assert_eq!(t, 120 + (40_000 - 120) / 2);
        assert_eq!(correct(&v, t), 4);
    }

    #[test]
    fn threshold_maximises_right_answers_with_overlap() {
        // One slow unique write (a host interrupt) and one fast shared one.
        let mut v = [
            s(10, false),
            s(11, false),
            s(12, false),
            s(900, false),
            s(13, true),
            s(800, true),
            s(850, true),
            s(1000, true),
        ];
        // Best cut: between 12 and 13 (only the slow unique write wrong).
        let t = learn_threshold(&mut v);
        assert_eq!(t, 12);
        assert_eq!(correct(&v, t), 7);
    }

    #[test]
    fn equal_times_are_never_split() {
        // Same time, both labels: no cut between them can help.
        let mut v = [s(5, false), s(5, true), s(5, false), s(5, true)];
        let t = learn_threshold(&mut v);
        assert_eq!(correct(&v, t), 2);
        assert_eq!(learn_threshold(&mut []), 0);
    }

    #[test]
    fn indistinguishable_classes_give_chance_on_the_test_half() {
        // The same distribution for both labels: whatever the training half
        // suggests, the test half comes out near 0.5.
        let mut rng = Rng::new(42);
        let mut v = [Sample::default(); 2048];
        for (i, x) in v.iter_mut().enumerate() {
            *x = s(100 + rng.below(50), i % 2 == 0);
        }
        rng.shuffle(&mut v);
        let mut scratch = [0u64; 2048];
        let p = evaluate(&mut v, &mut scratch, 1_000_000, false);
        assert_eq!((p.pages, p.train_pages, p.tested), (2048, 1024, 1024));
        assert_eq!(p.shared_pages, 1024);
        assert!((0.42..=0.58).contains(&p.accuracy()), "{p:?}");
    }

    #[test]
    fn the_split_gives_each_set_half_of_each_label() {
        // The labels in runs (as written in a poor order): the first half of
        // the writes holds most shared pages.
        let label = |i: usize| i < 40 || (60..70).contains(&i);
        let mut v = [Sample::default(); 100];
        for (i, x) in v.iter_mut().enumerate() {
            *x = s(500, label(i));
        }
        let mut scratch = [0u64; 100];
        let p = evaluate(&mut v, &mut scratch, 1_000_000, false);
        assert_eq!((p.shared_pages, p.train_pages, p.tested), (50, 50, 50));
        let test = &v[p.train_pages as usize..];
        assert_eq!(test.iter().filter(|x| x.shared).count(), 25);
        // Every write equally fast: whatever the threshold, it calls every
        // test page one label, right for exactly half of them.
        assert_eq!(p.accuracy(), 0.5);
        // Unbalanced labels: each set still gets half of each.
        let mut v = [Sample::default(); 100];
        for (i, x) in v.iter_mut().enumerate() {
            *x = s(500 + i as u64, i < 30 || i % 3 == 0);
        }
        let p = evaluate(&mut v, &mut scratch, 1_000_000, false);
        assert_eq!((p.shared_pages, p.train_pages), (54, 27 + 23));
        let test = &v[p.train_pages as usize..];
        assert_eq!(test.iter().filter(|x| x.shared).count(), 27);
    }

    #[test]
    fn separable_classes_give_full_accuracy_and_class_quantiles() {
        let mut rng = Rng::new(7);
        let mut v = [Sample::default(); 1000];
        for (i, x) in v.iter_mut().enumerate() {
            let shared = i % 2 == 1;
            let base = if shared { 40_000 } else { 300 };
            *x = s(base + rng.below(100), shared);
        }
        rng.shuffle(&mut v);
        let mut scratch = [0u64; 1000];
        let p = evaluate(&mut v, &mut scratch, 2_000_000, false);
        assert_eq!(p.accuracy(), 1.0);
        assert!(p.unique_cycles[6] < p.threshold_cycles);
        assert!(p.threshold_cycles < p.shared_cycles[0]);
        assert!((40_000..40_100).contains(&p.shared_cycles[MEDIAN]));
        assert!(p.shared_cycles.windows(2).all(|w| w[0] <= w[1]));
        // 40,000 cycles at 2 GHz are 20 us.
        assert!((p.us(p.shared_cycles[MEDIAN]) - 20.0).abs() < 0.1);
    }

    #[test]
    fn a_local_baseline_follows_a_drifting_host() {
        // Shared writes are 100 cycles slower than unique ones, but the
        // host slows down by 1000 cycles over the probe: raw times overlap,
        // times relative to the recent unique writes do not.
        let mut rng = Rng::new(3);
        let mut v = [Sample::default(); 2000];
        for (i, x) in v.iter_mut().enumerate() {
            *x = s(i as u64 / 2, i % 2 == 0);
        }
        rng.shuffle(&mut v);
        for (i, x) in v.iter_mut().enumerate() {
            x.cycles = 5000 + i as u64 / 2 + if x.shared { 100 } else { 0 } + rng.below(20);
        }
        let mut scratch = [0u64; 2000];
        let mut raw = v;
        let p_raw = evaluate(&mut raw, &mut scratch, 1_000_000, false);
        let p_rel = evaluate(&mut v, &mut scratch, 1_000_000, true);
        assert!(p_raw.accuracy() < 0.8, "{p_raw:?}");
        assert!(p_rel.accuracy() > 0.97, "{p_rel:?}");
        // The threshold is relative: between the two labels' offsets.
        assert!((20..100).contains(&p_rel.threshold_cycles), "{p_rel:?}");
        // The quantiles stay raw times.
        assert!(p_rel.unique_cycles[0] >= 5000, "{p_rel:?}");
    }

    #[test]
    fn a_burst_of_slow_writes_costs_little_more_than_its_own_writes() {
        // 40 writes in the middle (2 % of them) 3000 cycles slower, as when
        // the host runs something else for a moment: the baseline on both
        // sides of them follows, the rest classifies as before.
        let mut rng = Rng::new(11);
        let mut v = [Sample::default(); 2000];
        for (i, x) in v.iter_mut().enumerate() {
            let burst = if (1000..1040).contains(&i) { 3000 } else { 0 };
            let shared = rng.below(2) == 0;
            *x = s(
                5000 + burst + if shared { 300 } else { 0 } + rng.below(20),
                shared,
            );
        }
        let mut scratch = [0u64; 2000];
        let p = evaluate(&mut v, &mut scratch, 1_000_000, true);
        assert!(p.accuracy() >= 0.97, "{p:?}");
        assert!((20..300).contains(&p.threshold_cycles), "{p:?}");
    }

    #[test]
    fn reads_that_hit_the_cache_are_called_merged() {
        // Merged pages come back cache-hot after the write (about 50
        // cycles to read), unmerged ones from memory (about 260).
        let mut rng = Rng::new(5);
        let mut reads = [Sample::default(); 1000];
        for (i, x) in reads.iter_mut().enumerate() {
            let shared = i % 2 == 0;
            *x = s(if shared { 50 } else { 260 } + rng.below(30), shared);
        }
        rng.shuffle(&mut reads);
        let mut scratch = [0u64; 1000];
        let mut p = MergeProbe {
            tested: 500,
            ..MergeProbe::default()
        };
        evaluate_reads(&mut reads, &mut scratch, &mut p);
        assert_eq!(p.read_correct, 500);
        assert_eq!(p.read_accuracy(), 1.0);
        assert!((50..80).contains(&p.shared_read_cycles), "{p:?}");
        assert!((260..290).contains(&p.unique_read_cycles), "{p:?}");
    }

    #[test]
    fn quantiles_pick_ranks_and_rng_shuffles_a_permutation() {
        let v: [u64; 11] = core::array::from_fn(|i| i as u64 * 10);
        assert_eq!(quantiles(&v), [0, 10, 30, 50, 80, 90, 100]);
        assert_eq!(quantiles(&[]), [0; 7]);
        let mut p: [u32; 64] = core::array::from_fn(|i| i as u32);
        Rng::new(0).shuffle(&mut p);
        assert_ne!(p, core::array::from_fn(|i| i as u32));
        p.sort_unstable();
        assert_eq!(p, core::array::from_fn(|i| i as u32));
    }
}
