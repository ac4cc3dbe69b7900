//! What the dedup engine's parks cost a VM: every stop of one of its vCPUs
//! that a park caused (`crate::quiesce`), in a histogram with fixed
//! bounds, so `/metrics` can export it as a Prometheus histogram and
//! `pagefold status` can show a tail and a maximum per VM.
//!
//! A stop is recorded by the vCPU thread itself (`VmShared::vcpu_checkpoint`):
//! from when it starts waiting for the hold to end until it goes back to
//! the guest. A park that keeps no vCPU waiting (its guest idle outside
//! guest code) costs the guest nothing and records nothing. The time from
//! the engine's kick to the vCPU's exit is not in it (microseconds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the histogram's buckets, in seconds (a last bucket,
/// `+Inf`, follows). From 10 µs, below which a park is a handful of
/// atomics, to 100 ms, beyond which a guest's timers and watchdogs notice.
pub const PAUSE_BOUNDS_S: [f64; 13] = [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
];

/// Buckets of the histogram: one per bound and `+Inf`.
pub const PAUSE_BUCKETS: usize = PAUSE_BOUNDS_S.len() + 1;

/// One VM's stops so far, as the API shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestPauses {
    /// Stops recorded (one per vCPU kept waiting by a park).
    pub count: u64,
    /// Their total length, seconds.
    pub total_s: f64,
    /// The longest one, seconds.
    pub max_s: f64,
    /// The 99th percentile, seconds: the bound of the bucket it falls in,
    /// or the maximum when that is smaller (so an estimate from above,
    /// within one bucket).
    pub p99_s: f64,
    /// Stops per bucket (not cumulative), in the order of
    /// [`PAUSE_BOUNDS_S`], then `+Inf`.
    pub buckets: [u64; PAUSE_BUCKETS],
}

impl GuestPauses {
    /// Two logs' stops together (say, a pair of VMs).
    pub fn merged(&self, other: &GuestPauses) -> GuestPauses {
        let mut g = GuestPauses {
            count: self.count + other.count,
            total_s: self.total_s + other.total_s,
            max_s: self.max_s.max(other.max_s),
            p99_s: 0.0,
            buckets: std::array::from_fn(|i| self.buckets[i] + other.buckets[i]),
        };
        g.p99_s = g.quantile(0.99);
        g
    }

    /// The stops recorded since `earlier` (a snapshot of the same log).
    /// The maximum is the log's if it grew since, else the bound of the
    /// highest bucket that did.
    pub fn since(&self, earlier: &GuestPauses) -> GuestPauses {
        let buckets: [u64; PAUSE_BUCKETS] =
            std::array::from_fn(|i| self.buckets[i].saturating_sub(earlier.buckets[i]));
        let top = buckets.iter().rposition(|&n| n > 0);
        let max_s = match top {
            None => 0.0,
            Some(_) if self.max_s > earlier.max_s => self.max_s,
            Some(i) => PAUSE_BOUNDS_S
                .get(i)
                .copied()
                .unwrap_or(self.max_s)
                .min(self.max_s),
        };
        let mut g = GuestPauses {
            count: buckets.iter().sum(),
            total_s: (self.total_s - earlier.total_s).max(0.0),
            max_s,
            p99_s: 0.0,
            buckets,
        };
        g.p99_s = g.quantile(0.99);
        g
    }

    /// The bucket-bound estimate of quantile `q` (0..=1), capped by the
    /// maximum; 0 with no window.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let bound = PAUSE_BOUNDS_S.get(i).copied().unwrap_or(f64::INFINITY);
                return bound.min(self.max_s);
            }
        }
        self.max_s
    }
}

/// The histogram a VM's vCPU threads record their stops into. Lock-free:
/// the vCPU threads record, the API reads.
#[derive(Debug, Default)]
pub struct PauseLog {
    buckets: [AtomicU64; PAUSE_BUCKETS],
    count: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl PauseLog {
    /// Counts one stop of length `d`.
    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = PAUSE_BOUNDS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(PAUSE_BOUNDS_S.len());
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The stops so far. Read while stops are recorded, the figures may be
    /// off by the stops in flight.
    pub fn snapshot(&self) -> GuestPauses {
        let buckets: [u64; PAUSE_BUCKETS] =
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        let mut g = GuestPauses {
            count: buckets.iter().sum(),
            total_s: self.total_ns.load(Ordering::Relaxed) as f64 / 1e9,
            max_s: self.max_ns.load(Ordering::Relaxed) as f64 / 1e9,
            p99_s: 0.0,
            buckets,
        };
        g.p99_s = g.quantile(0.99);
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_land_in_the_bucket_of_their_bound() {
        let log = PauseLog::default();
        log.record(Duration::from_micros(5));
        log.record(Duration::from_micros(10));
        log.record(Duration::from_micros(11));
        log.record(Duration::from_millis(1));
        log.record(Duration::from_secs(1));
        let g = log.snapshot();
        assert_eq!(g.count, 5);
        assert_eq!(g.buckets[0], 2, "5 and 10 µs: le 10 µs");
        assert_eq!(g.buckets[1], 1, "11 µs: le 25 µs");
        assert_eq!(g.buckets[6], 1, "1 ms: le 1 ms");
        assert_eq!(g.buckets[PAUSE_BUCKETS - 1], 1, "1 s: +Inf");
        assert!((g.max_s - 1.0).abs() < 1e-9);
        assert!((g.total_s - 1.001026).abs() < 1e-9, "{}", g.total_s);
    }

    #[test]
    fn the_p99_is_the_bound_of_its_bucket_capped_by_the_maximum() {
        let log = PauseLog::default();
        for _ in 0..99 {
            log.record(Duration::from_micros(40));
        }
        assert_eq!(log.snapshot().p99_s, 40e-6, "capped by the maximum");
        log.record(Duration::from_millis(3));
        let g = log.snapshot();
        assert_eq!(g.p99_s, 50e-6, "rank 99 of 100 is in the le-50µs bucket");
        assert_eq!(g.quantile(1.0), 3e-3, "the last rank: the maximum");
        assert_eq!(GuestPauses::default().quantile(0.99), 0.0);
    }

    #[test]
    fn windows_since_a_snapshot_and_of_two_logs() {
        let log = PauseLog::default();
        log.record(Duration::from_millis(3));
        let before = log.snapshot();
        log.record(Duration::from_micros(40));
        log.record(Duration::from_micros(40));
        let d = log.snapshot().since(&before);
        assert_eq!(d.count, 2);
        assert_eq!(d.max_s, 50e-6, "the old 3 ms is not in it");
        assert!((d.total_s - 80e-6).abs() < 1e-9);
        log.record(Duration::from_millis(4));
        assert_eq!(log.snapshot().since(&before).max_s, 4e-3);
        assert_eq!(before.since(&before).count, 0);
        let both = before.merged(&log.snapshot());
        assert_eq!(both.count, 5);
        assert_eq!(both.max_s, 4e-3);
    }
}
