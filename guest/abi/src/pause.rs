//! The pause probe's histogram and its summary, shared by the guest (which
//! records gaps in its TSC loop) and the host (which reads the histogram
//! from the mailbox and computes percentiles).
//!
//! Buckets are log-linear, as in HdrHistogram: 1 µs wide below 64 µs, where
//! a COW fault (tens of µs) and a host timer tick must stay apart; above,
//! 32 buckets per power of two, so a bucket is at most 1/32 (3.1 %) of its
//! values wide and p99.9 of pauses in the 100 µs-10 ms range is meaningful.
//! Values at or above [`MAX_TRACKED_US`] land in the last bucket; the exact
//! maximum travels beside the histogram ([`PauseSummary::max_gap_ns`]).

/// A gap between two consecutive TSC reads longer than this is a pause. The
/// probe loop's own iteration takes tens of ns; 1 µs is far above it and
/// below the shortest pause dedup can cause (a COW fault, a vCPU park).
pub const GAP_THRESHOLD_NS: u64 = 1000;

/// The write variant of the probe rewrites one already-written shared page
/// this often (1000 COW breaks per second when the pages are merged): often
/// enough that a short probe sees hundreds of breaks, rare enough that the
/// writes' own cost stays a small share of the run.
pub const WRITE_INTERVAL_US: u64 = 1000;

/// Linear buckets of 1 µs below this many µs.
const LINEAR_US: u64 = 64;
/// log2 of [`LINEAR_US`].
const LINEAR_BITS: u32 = 6;
/// Buckets per power of two above the linear range.
const SUB_BUCKETS: u64 = 32;
/// log2 of [`SUB_BUCKETS`].
const SUB_BITS: u32 = 5;
/// Powers of two above the linear range: 2^6 .. 2^24 µs.
const OCTAVES: u64 = 18;

/// Gaps at or above this many µs (16.8 s) share the last bucket.
pub const MAX_TRACKED_US: u64 = LINEAR_US << OCTAVES;

/// Number of buckets.
pub const BUCKETS: usize = (LINEAR_US + OCTAVES * SUB_BUCKETS) as usize;

/// Counts of gaps per bucket (µs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseHistogram {
    pub counts: [u32; BUCKETS],
}

impl Default for PauseHistogram {
    fn default() -> Self {
        Self::ZERO
    }
}

/// Bucket of a gap of `us` microseconds.
pub const fn bucket(us: u64) -> usize {
    if us < LINEAR_US {
        return us as usize;
    }
    if us >= MAX_TRACKED_US {
        return BUCKETS - 1;
    }
    let exp = 63 - us.leading_zeros(); // >= LINEAR_BITS
    let octave = (exp - LINEAR_BITS) as u64;
    let sub = (us >> (exp - SUB_BITS)) & (SUB_BUCKETS - 1);
    (LINEAR_US + octave * SUB_BUCKETS + sub) as usize
}

/// Lowest value (µs) of bucket `i`.
pub const fn bucket_low(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR_US {
        return i;
    }
    let octave = (i - LINEAR_US) / SUB_BUCKETS;
    let sub = (i - LINEAR_US) % SUB_BUCKETS;
    let exp = octave as u32 + LINEAR_BITS;
    (1 << exp) | (sub << (exp - SUB_BITS))
}

/// One past the highest value (µs) of bucket `i` (the last bucket's is
/// [`MAX_TRACKED_US`], though it also holds everything above).
pub const fn bucket_high(i: usize) -> u64 {
    if i + 1 >= BUCKETS {
        MAX_TRACKED_US
    } else {
        bucket_low(i + 1)
    }
}

impl PauseHistogram {
    /// No gaps (const, for the guest's `.bss` mailbox).
    pub const ZERO: Self = Self {
        counts: [0; BUCKETS],
    };

    /// Counts one gap of `ns` nanoseconds (saturating: a bucket cannot wrap).
    pub fn record_ns(&mut self, ns: u64) {
        let c = &mut self.counts[bucket(ns / 1000)];
        *c = c.saturating_add(1);
    }

    /// Gaps recorded.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// Adds `other`'s counts (e.g. two VMs' probes into one distribution).
    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// The `ppm`-th quantile (parts per million: 990_000 is p99) of the
    /// recorded gaps, in µs: the upper edge of the bucket holding the gap
    /// of rank `ceil(total * ppm / 10^6)`, so it never understates a
    /// pause by more than rounding to whole µs. `None` with no gaps.
    pub fn quantile_us(&self, ppm: u32) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let ppm = u64::from(ppm.min(1_000_000));
        let rank = (total * ppm).div_ceil(1_000_000).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(bucket_high(i));
            }
        }
        None
    }
}

/// What one probe run measured, as the guest reports it with its histogram.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PauseSummary {
    /// Gaps above [`GAP_THRESHOLD_NS`].
    pub gaps: u64,
    /// Sum of those gaps.
    pub stopped_ns: u64,
    /// The probe's run time (TSC), without its own progress exits.
    pub run_ns: u64,
    /// The longest gap, exact.
    pub max_gap_ns: u64,
}

/// Percentiles and rates the host derives from a summary and its histogram.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PauseStats {
    pub gaps: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Stopped time per second of run time, in ms.
    pub stopped_ms_per_s: f64,
    pub run_ms: f64,
}

impl PauseStats {
    /// Percentiles from `h`, capped at the exact maximum (a bucket's upper
    /// edge may lie above the largest gap in it). All zero with no gaps.
    pub fn compute(s: &PauseSummary, h: &PauseHistogram) -> Self {
        let max_us = s.max_gap_ns as f64 / 1000.0;
        let q = |ppm| h.quantile_us(ppm).map_or(0.0, |v| (v as f64).min(max_us));
        let run_s = s.run_ns as f64 / 1e9;
        Self {
            gaps: s.gaps,
            p50_us: q(500_000),
            p99_us: q(990_000),
            p999_us: q(999_000),
            max_us,
            stopped_ms_per_s: if run_s > 0.0 {
                s.stopped_ns as f64 / 1e6 / run_s
            } else {
                0.0
            },
            run_ms: s.run_ns as f64 / 1e6,
        }
    }

    /// Stats of several probes taken together: the merged histogram, the
    /// summed gaps and times, the largest maximum.
    pub fn combine(runs: &[(PauseSummary, PauseHistogram)]) -> Self {
        let mut s = PauseSummary::default();
        let mut h = PauseHistogram::ZERO;
        for (rs, rh) in runs {
            s.gaps += rs.gaps;
            s.stopped_ns += rs.stopped_ns;
            s.run_ns += rs.run_ns;
            s.max_gap_ns = s.max_gap_ns.max(rs.max_gap_ns);
            h.merge(rh);
        }
        Self::compute(&s, &h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_buckets_are_one_microsecond_wide() {
        for us in 0..LINEAR_US {
            assert_eq!(bucket(us), us as usize);
            assert_eq!(
                (bucket_low(us as usize), bucket_high(us as usize)),
                (us, us + 1)
            );
        }
        assert_eq!(bucket(64), 64);
        assert_eq!(bucket_low(64), 64);
    }

    #[test]
    fn every_value_lies_in_its_bucket_within_three_percent() {
        let mut us = 0u64;
        while us < MAX_TRACKED_US {
            let i = bucket(us);
            let (lo, hi) = (bucket_low(i), bucket_high(i));
            assert!(lo <= us && us < hi, "{us} not in bucket {i} [{lo}, {hi})");
            if us >= LINEAR_US {
                // Width at most 1/32 of the bucket's low edge.
                assert!((hi - lo) * 32 <= lo, "bucket {i} [{lo}, {hi}) too wide");
            }
            us = us + 1 + us / 97;
        }
        assert_eq!(bucket(MAX_TRACKED_US - 1), BUCKETS - 1);
        assert_eq!(bucket(MAX_TRACKED_US), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket_high(i), bucket_low(i + 1));
            assert!(bucket_low(i) < bucket_high(i));
            assert_eq!(bucket(bucket_low(i)), i);
            assert_eq!(bucket(bucket_high(i) - 1), i);
        }
        assert_eq!(bucket_high(BUCKETS - 1), MAX_TRACKED_US);
    }

    #[test]
    fn quantiles_pick_the_bucket_of_the_rank() {
        let mut h = PauseHistogram::ZERO;
        assert_eq!(h.quantile_us(500_000), None);
        // 1000 gaps: 900 of 2 µs, 90 of 30 µs, 9 of 500 µs, 1 of 5 ms.
        for (ns, n) in [(2_500, 900), (30_000, 90), (500_000, 9), (5_000_000, 1)] {
            for _ in 0..n {
                h.record_ns(ns);
            }
        }
        assert_eq!(h.total(), 1000);
        assert_eq!(h.quantile_us(500_000), Some(3));
        assert_eq!(h.quantile_us(900_000), Some(3));
        assert_eq!(h.quantile_us(901_000), Some(31));
        assert_eq!(h.quantile_us(990_000), Some(31));
        let p999 = h.quantile_us(999_000).unwrap();
        assert!((500..=500 + 500 / 32 + 1).contains(&p999), "{p999}");
        let p100 = h.quantile_us(1_000_000).unwrap();
        assert!((5000..=5000 + 5000 / 32 + 1).contains(&p100), "{p100}");
        assert_eq!(h.quantile_us(0), Some(3));
    }

    #[test]
    fn stats_are_monotone_and_capped_at_the_exact_maximum() {
        let mut h = PauseHistogram::ZERO;
        let gaps = [1_200u64, 1_900, 4_000, 17_000, 70_100, 70_200];
        for g in gaps {
            h.record_ns(g);
        }
        let s = PauseSummary {
            gaps: gaps.len() as u64,
            stopped_ns: gaps.iter().sum(),
            run_ns: 200_000_000,
            max_gap_ns: 70_200,
        };
        let st = PauseStats::compute(&s, &h);
        assert_eq!(st.gaps, 6);
        assert!(st.p50_us <= st.p99_us && st.p99_us <= st.p999_us && st.p999_us <= st.max_us);
        // 70.2 µs falls in [70, 72): the percentile is capped at 70.2.
        assert_eq!(st.max_us, 70.2);
        assert_eq!(st.p999_us, 70.2);
        assert_eq!(st.p50_us, 5.0);
        let want = 164.4e-3 / 0.2; // 164.4 µs stopped in 0.2 s
        assert!(
            (st.stopped_ms_per_s - want).abs() < 1e-9,
            "{}",
            st.stopped_ms_per_s
        );
        assert_eq!(st.run_ms, 200.0);
    }

    #[test]
    fn combining_two_runs_adds_counts_and_keeps_the_larger_maximum() {
        let mut a = PauseHistogram::ZERO;
        a.record_ns(3_000);
        let mut b = PauseHistogram::ZERO;
        b.record_ns(900_000);
        b.record_ns(3_100);
        let sa = PauseSummary {
            gaps: 1,
            stopped_ns: 3_000,
            run_ns: 1_000_000_000,
            max_gap_ns: 3_000,
        };
        let sb = PauseSummary {
            gaps: 2,
            stopped_ns: 903_100,
            run_ns: 1_000_000_000,
            max_gap_ns: 900_000,
        };
        let st = PauseStats::combine(&[(sa, a), (sb, b)]);
        assert_eq!(st.gaps, 3);
        assert_eq!(st.max_us, 900.0);
        assert_eq!(st.p50_us, 4.0);
        assert!((st.stopped_ms_per_s - 0.45305).abs() < 1e-9);
        let zero = PauseStats::compute(&PauseSummary::default(), &PauseHistogram::ZERO);
        assert_eq!(zero, PauseStats::default());
    }

    #[test]
    fn a_full_bucket_saturates_instead_of_wrapping() {
        let mut h = PauseHistogram::ZERO;
        h.counts[5] = u32::MAX;
        h.record_ns(5_000);
        assert_eq!(h.counts[5], u32::MAX);
        let mut g = h;
        g.merge(&h);
        assert_eq!(g.counts[5], u32::MAX);
    }
}
