//! The host's reading of a LATENCY phase: the guest's gap count, stopped
//! and run time, longest gap and histogram turned into the percentiles a
//! report shows (`pagefold_guest_abi::pause` does the arithmetic, so the
//! guest and every host consumer agree on it).

use pagefold_devices::workload::{PhaseRecord, WorkloadSummary};
use pagefold_guest_abi::pause::PauseStats;
use pagefold_guest_abi::phase;
use serde::Serialize;

/// A LATENCY phase's pauses, as reports print them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PauseRow {
    /// Gaps above `pause::GAP_THRESHOLD_NS`.
    pub gaps: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Stopped time per second of the probe's run time.
    pub stopped_ms_per_s: f64,
    /// The probe's own measure of its run time.
    pub run_ms: f64,
}

impl From<PauseStats> for PauseRow {
    fn from(s: PauseStats) -> Self {
        Self {
            gaps: s.gaps,
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            p999_us: s.p999_us,
            max_us: s.max_us,
            stopped_ms_per_s: s.stopped_ms_per_s,
            run_ms: s.run_ms,
        }
    }
}

/// The pauses of phase `p` of `summary`, if it is a LATENCY phase whose
/// histogram arrived.
pub fn pause_row(summary: &WorkloadSummary, p: &PhaseRecord) -> Option<PauseRow> {
    if !matches!(p.report.phase, phase::LATENCY | phase::LATENCY_WRITE) {
        return None;
    }
    let (_, h) = summary
        .pauses
        .iter()
        .find(|(slot, _)| *slot == p.report.slot)?;
    Some(PauseStats::compute(&p.report.pauses, h).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_devices::workload::EventKind;
    use pagefold_guest_abi::mailbox::PhaseReport;
    use pagefold_guest_abi::pause::PauseHistogram;
    use std::time::Duration;

    #[test]
    fn only_latency_phases_with_a_histogram_get_a_row() {
        let mut s = WorkloadSummary::new("a");
        let mut h = PauseHistogram::ZERO;
        h.record_ns(40_000);
        let mut r = PhaseReport {
            phase: phase::LATENCY_WRITE,
            slot: 3,
            ..Default::default()
        };
        r.pauses.gaps = 1;
        r.pauses.stopped_ns = 40_000;
        r.pauses.run_ns = 1_000_000_000;
        r.pauses.max_gap_ns = 40_000;
        let end = |report| EventKind::PhaseEnd {
            report: Box::new(report),
            elapsed: Duration::from_secs(1),
        };
        s.record(&end(PhaseReport {
            phase: phase::FILL,
            ..Default::default()
        }));
        s.record(&end(r));
        assert_eq!(pause_row(&s, &s.phases[0]), None);
        // No histogram for slot 3 yet.
        assert_eq!(pause_row(&s, &s.phases[1]), None);
        s.record(&EventKind::Pauses {
            slot: 3,
            histogram: Box::new(h),
        });
        let row = pause_row(&s, &s.phases[1]).unwrap();
        assert_eq!(row.gaps, 1);
        assert_eq!((row.p50_us, row.p999_us, row.max_us), (40.0, 40.0, 40.0));
        assert!((row.stopped_ms_per_s - 0.04).abs() < 1e-12);
        assert_eq!(row.run_ms, 1000.0);
    }
}
